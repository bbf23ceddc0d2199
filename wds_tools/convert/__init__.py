"""The converter: source -> decode -> plan -> write -> index, run by ``pipeline.convert``.

``from wds_tools.convert import convert`` is the library entry point the CLI calls.
"""

from __future__ import annotations

from .pipeline import WORK_DIR, ConvertResult, ConvertResults, convert, parse_max_errors, parse_sizes

__all__ = ["convert", "ConvertResult", "ConvertResults", "parse_max_errors", "parse_sizes", "WORK_DIR"]
