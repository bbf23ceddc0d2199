"""Ranks: how the shards of an epoch are dealt to training ranks and their DataLoader workers.

The one rule, shared by ``wds-tools stats`` (which reports what each reader gets) and the loader's
epoch plan (``training_adapter.shardlist.plan_epoch``): the i-th shard goes to rank i % R
(webdataset's ``split_by_node``), and the j-th shard of a rank to its worker j % W
(``split_by_worker``). Pure and torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["deal"]

T = TypeVar("T")


def deal(items: Sequence[T], world: int, workers: int) -> list[list[list[T]]]:
    """``items`` dealt round-robin to ``world`` ranks, then each rank's to its ``workers``: [rank][worker] -> items."""
    return [[list(items[rank::world][w::workers]) for w in range(workers)] for rank in range(world)]
