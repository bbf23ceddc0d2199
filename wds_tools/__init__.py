"""wds-tools: convert image corpora once into versioned WebDataset shards of pre-decoded uint8 arrays.

The converter lives in ``wds_tools.convert`` (``from wds_tools.convert import convert``); it is
not re-exported here so that the module and the function do not shadow each other. The names
below are imported on first use: ``import wds_tools.errors`` (as the training adapter does) loads
neither the converter nor Pillow.
"""

from __future__ import annotations

from importlib import import_module

from .version import __version__

__all__ = [
    "__version__",
    "WdsToolsError",
    "DecodeSettings",
    "decode_image",
    "decode_file",
    "DatasetIndex",
    "load_index",
    "read_source",
]

_HOMES = {  # name -> the module that defines it, imported when the name is first read
    "WdsToolsError": ".errors",
    "DecodeSettings": ".convert.decode",
    "decode_image": ".convert.decode",
    "decode_file": ".convert.decode",
    "DatasetIndex": ".format.index",
    "load_index": ".format.index",
    "read_source": ".convert.source",
}


def __getattr__(name: str) -> object:
    """Import an exported name from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily imported ones included."""
    return sorted(set(globals()) | set(__all__))
