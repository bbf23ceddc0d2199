"""training_adapter: streams wds-tools (plain WebDataset) shards into PyTorch at memory speed.

Data flow: ``shardlist`` (which shards) -> ``indexread`` (with an index: plan the epoch from
samples.npz) -> ``gather`` (read each sample by offset; ``threads``: reader threads where they only
copy) or ``tarread`` (without: tar -> samples) -> ``augment`` (random transforms) -> ``loader``
(batches; ``buffers``: their memory); ``config`` reads a trainer config. Submodules import torch
on first use, so ``import training_adapter`` stays light.
"""

from __future__ import annotations

from importlib import import_module

from wds_tools.format.index import DatasetIndex, load_index

__all__ = [
    "make_loader", "to_device", "augment_batch", "load_config", "AugmentConfig", "ShardLoader",
    "resolve_urls", "sample_params", "DatasetIndex", "load_index", "ShardIndexDataset",
]

_LAZY = {
    "make_loader": "loader", "to_device": "loader", "ShardLoader": "loader",
    "augment_batch": "augment", "AugmentConfig": "augment", "sample_params": "augment",
    "load_config": "config", "resolve_urls": "shardlist", "ShardIndexDataset": "mapstyle",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
