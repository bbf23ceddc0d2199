"""The converter: source -> decode -> plan -> write -> index, run by ``pipeline.convert``.

``from wds_tools.convert import convert`` is the library entry point the CLI calls.
"""

from __future__ import annotations

from .pipeline import WORK_DIR, ConvertResult, convert, parse_max_errors

__all__ = ["convert", "ConvertResult", "parse_max_errors", "WORK_DIR"]
