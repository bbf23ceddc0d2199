"""Shard list: which shards a loader reads, and which of them each rank and worker streams per epoch.

URLs follow webdataset's conventions (brace patterns, ``::``, ``pipe:``, http(s)); a shards folder or
its index.json also gives the sample counts (equal batches across ranks) and mean/std
(``wds_tools.dataset.resolve``). The epoch plan is a pure function of (counts, seed, epoch, rank,
world, workers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from wds_tools.dataset.resolve import resolve
from wds_tools.errors import OptionError
from wds_tools.format.model import IndexMeta, parse
from wds_tools.ranks import deal

__all__ = [
    "ShardList",
    "WorkerPlan",
    "WorkerInfo",
    "resolve_urls",
    "shard_order",
    "plan_epoch",
    "plan_grid",
    "worker_batches",
    "worker_info",
    "rank_world",
    "cut_to",
]


@dataclass
class ShardList:
    """Resolved shard URLs; ``counts`` (samples per shard), ``mean``/``std`` and ``size`` when an index gave them."""

    urls: list[str]
    counts: list[int] | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    size: int | None = None
    classes: list[str] | None = field(default=None, repr=False)
    # where the index came from, when every shard is in it: index.json, the folder or URL
    # holding it (samples.npz is beside it), and each URL's shard name there
    info: IndexMeta | None = field(default=None, repr=False)
    index_base: str | None = None
    names: list[str] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.urls)


def resolve_urls(
    urls: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    split: str = "train",
    allow_mixed: bool = False,
    allow_partial: bool = False,
) -> ShardList:
    """Expand patterns, folders and index files into a ShardList (``split`` is used for folders/indexes);
    ``dataset.resolve.resolve`` does the work. Shards of different datasets (``allow_mixed``) and a
    pattern naming part of a split (``allow_partial``) are refused unless allowed."""
    for name, value in (("allow_mixed", allow_mixed), ("allow_partial", allow_partial)):
        if not isinstance(value, bool):
            raise OptionError(f"{name}={value!r}: expected True or False")
    shards = resolve(urls, split=split, pipe=True, allow_mixed=allow_mixed, allow_partial=allow_partial)
    # (only with allow_mixed: the datasets' index.json, each checked when resolved)
    sizes = sorted({parse(m, shards.spec).size for m in shards.datasets}) if len(shards.datasets) > 1 else []
    if len(sizes) > 1:  # only with allow_mixed: refused before training, not at the first odd sample
        raise OptionError(
            f"{shards.spec}: allow_mixed=True, but these datasets hold images of "
            f"{' and '.join(f'{s} px' for s in sizes)}, which cannot share a batch; "
            f"give shards of one size"
        )
    info, listed = shards.info, shards.names is not None
    return ShardList(
        shards.urls,
        shards.counts,
        list(info.mean) if info else None,
        list(info.std) if info else None,
        info.size if info else None,
        list(info.classes) if info else None,
        info=info if listed else None,
        index_base=shards.index_base if listed else None,
        names=shards.names,
    )


class WorkerInfo(NamedTuple):
    """Where the calling code runs: its rank of ``world`` ranks, and its DataLoader worker of ``workers``."""

    rank: int
    world: int
    worker: int
    workers: int


def worker_info() -> WorkerInfo:
    """Rank, world, worker and workers, as webdataset finds them (RANK/WORLD_SIZE, torch.distributed, DataLoader)."""
    from webdataset.utils import pytorch_worker_info

    return WorkerInfo(*pytorch_worker_info())


def rank_world() -> tuple[int, int]:
    """(rank, world) of this process (``worker_info``)."""
    where = worker_info()
    return where.rank, where.world


def shard_order(n: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's shard order: a permutation seeded by (seed, epoch), or 0..n-1."""
    if not shuffle:
        return list(range(n))
    return np.random.default_rng([seed, epoch, 0x5AD]).permutation(n).tolist()


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker of one rank reads in an epoch: shard indices, and the batches it must yield (None: all).

    ``spares``: shards of the other ranks this worker reads, after its own, only when skipped damage
    (``on_error="skip"``) left it short of ``batches``; see ``plan_epoch``. A resumed epoch
    (``resume.StreamReplay``) replays the stream of worker ``stream`` (None: this worker's own):
    its first ``skip`` batches are made again but not yielded (the run that stopped yielded them),
    then ``batches`` more.
    """

    shards: list[int]
    batches: int | None
    spares: list[int] = field(default_factory=list)
    skip: int = 0
    stream: int | None = None


def cut_to(batches: Sequence[int], quota: int) -> list[int]:
    """``batches`` (per worker) cut to ``quota`` in all, one batch at a time from the worker with the most
    (the last one on ties); computed directly, so a count of any size costs the same (a damaged index
    may claim 10**12 samples per shard)."""
    b = [int(x) for x in batches]
    excess = sum(b) - quota
    if excess <= 0:
        return b
    if quota <= 0:
        return [0] * len(b)

    def cost(level: int) -> int:  # batches cut to bring every worker down to ``level``
        return sum(max(0, x - level) for x in b)

    lo, hi = 0, max(b)  # the lowest level whose cost is within the excess: cost(hi) == 0
    while lo < hi:
        mid = (lo + hi) // 2
        if cost(mid) <= excess:
            hi = mid
        else:
            lo = mid + 1
    level = lo  # >= 1, since quota > 0
    out = [min(x, level) for x in b]
    rest = excess - cost(level)  # fewer than the workers at ``level``: one more each, from the last one
    for w in reversed(range(len(b))):
        if rest == 0:
            break
        if out[w] == level:
            out[w] -= 1
            rest -= 1
    return out


def plan_epoch(n_shards: int, counts: Sequence[int] | None, *, rank: int, **options: Any) -> list[WorkerPlan]:
    """Plans of every worker of ``rank`` (``options``: ``plan_grid``'s keywords), with their spares.

    Spares (several ranks in training only): worker ``w`` of rank ``r`` may top up from the shards that worker
    ``w`` of ranks r+1, r+2, ... reads, in that order. The spare lists of one rank's workers are
    disjoint and hold none of the rank's own shards, so topping up never repeats a sample within a
    rank; it repeats, on another rank, only samples that replace skipped ones.
    """
    grid, world = plan_grid(n_shards, counts, **options), options["world"]
    if options.get("cover") and options.get("epoch_batches") is None:  # evaluation: every sample once, no spares
        return grid[rank]
    others = [grid[(rank + d) % world] for d in range(1, world)]  # none with one rank; resampled: no shards
    return [WorkerPlan(p.shards, p.batches, [i for o in others for i in o[w].shards]) for w, p in enumerate(grid[rank])]


def plan_grid(
    n_shards: int,
    counts: Sequence[int] | None,
    *,
    batch_size: int,
    seed: int,
    epoch: int,
    world: int,
    num_workers: int,
    shuffle: bool,
    drop_last: bool,
    resampled: bool = False,
    epoch_batches: int | None = None,
    cover: bool = False,
) -> list[list[WorkerPlan]]:
    """Every rank's plans, [rank][worker], without spares: shards dealt round-robin to ranks, then to
    workers (``ranks.deal``), their batches by ``worker_batches``; one deal for all ranks, so planning R
    ranks costs O(shards + R x workers), not R times that. ``cover`` (evaluation): a reader left without
    a shard (fewer shards than ranks x workers) yields none. With resampling each worker draws shards
    with replacement and yields its share of ``epoch_batches`` batches per rank."""
    slots = world * num_workers
    if resampled:
        if epoch_batches is None:
            if counts is None:
                raise OptionError(
                    "resampled=True needs epoch_batches (batches per rank and epoch) when the "
                    "shards come without an index giving their sample counts"
                )
            epoch_batches = sum(counts) // (world * batch_size)
        q, r = divmod(epoch_batches, num_workers)
        return [[WorkerPlan([], q + (w < r)) for w in range(num_workers)] for _ in range(world)]
    if n_shards < slots and not cover:
        fixes = [f"use num_workers <= {n_shards // world}"] if n_shards >= world else []
        fixes += [
            "convert with a smaller --shard-size to get more shards",
            "pass resampled=True (shards drawn with replacement)",
        ]
        raise OptionError(
            f"{n_shards} shard{'s' if n_shards != 1 else ''} cannot feed {world} rank{'s' if world != 1 else ''} x "
            f"{num_workers} worker{'s' if num_workers != 1 else ''} = {slots} readers "
            f"(each reader needs at least one shard in training); {', '.join(fixes[:-1])}, or {fixes[-1]}"
        )
    order = shard_order(n_shards, seed=seed, epoch=epoch, shuffle=shuffle)
    dealt = deal(order, world, num_workers)  # [rank][worker] -> shards
    if counts is None:
        if (world == 1 or cover) and epoch_batches is None:
            return [[WorkerPlan(p, None) for p in plans] for plans in dealt]
        raise OptionError(
            f"{world} ranks need the samples per shard to give every rank the same number of batches; "
            f"point urls at the shards folder or its index.json (not a bare pattern), or pass epoch_batches"
        )
    samples = [[sum(counts[i] for i in p) for p in plans] for plans in dealt]
    batches = worker_batches(samples, batch_size, drop_last=drop_last, cover=cover, epoch_batches=epoch_batches)
    return [[WorkerPlan(p, b) for p, b in zip(plans, bs)] for plans, bs in zip(dealt, batches)]


def worker_batches(
    samples: list[list[int]], batch_size: int, *, drop_last: bool, cover: bool, epoch_batches: int | None = None
) -> list[list[int]]:
    """[rank][worker] batches of the [rank][worker] ``samples``. One rank, or ``cover`` (evaluation: ranks
    may differ), without ``epoch_batches``: all of each worker's, a short last batch unless ``drop_last``.
    Else every rank the same: full batches only, cut (``cut_to``) to the smallest rank's total, or to
    ``epoch_batches``."""
    B = batch_size
    if (len(samples) == 1 or cover) and epoch_batches is None:
        return [[c // B if drop_last else -(-c // B) for c in ranks] for ranks in samples]
    full = [[c // B for c in ranks] for ranks in samples]
    quota = min(sum(f) for f in full)
    if epoch_batches is not None:
        if epoch_batches > quota:
            raise OptionError(
                f"epoch_batches={epoch_batches}: the smallest rank has only {quota} full batches "
                f"of {batch_size} this epoch; use epoch_batches <= {quota} or resampled=True"
            )
        quota = epoch_batches
    return [cut_to(f, quota) for f in full]
