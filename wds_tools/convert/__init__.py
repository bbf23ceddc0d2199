"""The converter: source -> decode -> plan -> write -> index, run by ``pipeline.convert_with``.

``from wds_tools.convert import convert`` is the library entry point the CLI calls; ``options.py``
declares its options.
"""

from __future__ import annotations

from ..format.index import WORK_DIR
from .options import ConvertOptions, convert, parse_max_errors, parse_sizes
from .pipeline import convert_with
from .summary import ConvertResult, ConvertResults

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
