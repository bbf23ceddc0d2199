"""The converter: source -> decode -> plan -> write -> index, run by ``pipeline.convert``.

``from wds_tools.convert import convert`` is the library entry point the CLI calls.
"""

from __future__ import annotations

from .pipeline import (
    WORK_DIR,
    ConvertOptions,
    ConvertResult,
    ConvertResults,
    convert,
    convert_with,
    parse_max_errors,
    parse_sizes,
)

__all__ = [
    "convert",
    "convert_with",
    "ConvertOptions",
    "ConvertResult",
    "ConvertResults",
    "parse_max_errors",
    "parse_sizes",
    "WORK_DIR",
]
