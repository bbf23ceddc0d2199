"""training_adapter: streams wds-tools (plain WebDataset) shards into PyTorch at memory speed.

Data flow: ``shardlist`` (which shards) -> either ``indexplan`` (with an index: the split's rows
from samples.npz, each epoch's plan) -> ``offsetread`` (read each sample by offset) -> ``indexed``
(the index reader's batches; ``threads``: reader threads where they only copy), or ``tarread``
(without: tar -> samples) -> ``streaming`` (the streaming reader's batches) -> ``batch`` (one
batch, ``augment``: random transforms, ``buffers``: its memory) -> ``shardloader`` (the workers;
``resume``: where it is in an epoch, ``statedict``: that state checked on load). ``loader``:
``make_loader`` and ``LoaderOptions``, each option declared once (``options``: how). ``mapstyle``
reads one sample at a time by position; ``config`` reads a trainer config. Submodules import torch on first use, so ``import training_adapter`` stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from wds_tools.format.index import DatasetIndex, load_index

__all__ = [
    "make_loader",
    "to_device",
    "augment_batch",
    "load_config",
    "AugmentConfig",
    "ShardLoader",
    "resolve_urls",
    "sample_params",
    "DatasetIndex",
    "load_index",
    "ShardIndexDataset",
    "LoaderOptions",
]

_LAZY = {
    "make_loader": "loader",
    "to_device": "loader",
    "ShardLoader": "shardloader",
    "augment_batch": "augment",
    "AugmentConfig": "augment",
    "sample_params": "augment",
    "load_config": "config",
    "resolve_urls": "shardlist",
    "ShardIndexDataset": "mapstyle",
    "LoaderOptions": "loader",
}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its submodule on first use."""
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
