"""Shard list: which shards a loader reads, and which of them each rank and worker reads per epoch.

URLs follow webdataset's conventions: brace patterns (``train-{000000..000041}.tar``), several
patterns joined with ``::``, ``pipe:`` and ``http(s)://`` URLs passed through to ``gopen``. A wds-tools
shards folder or its ``index.json`` (local or over http) is accepted in place of a pattern; it also
gives the samples per shard (for equal batch counts across ranks) and the pixel mean/std.

The epoch plan is a pure function of (sample counts, seed, epoch, rank, world size, workers).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from wds_tools.errors import IndexFormatError, OptionError, ShardError
from wds_tools.index import INDEX_FILE, load_index, parse_index_meta
from wds_tools.shardlist import expand_pattern

__all__ = ["ShardList", "WorkerPlan", "resolve_urls", "shard_order", "plan_epoch", "worker_info"]

_REMOTE = ("http", "https")


@dataclass
class ShardList:
    """Resolved shard URLs; ``counts`` (samples per shard), ``mean``/``std`` and ``size`` when an index gave them."""

    urls: list[str]
    counts: list[int] | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    size: int | None = None
    classes: list[str] | None = field(default=None, repr=False)
    # where the index came from, when every shard is in it: index.json's dict, the folder or URL
    # holding it (samples.npz is beside it), and each URL's shard name there
    meta: dict | None = field(default=None, repr=False)
    index_base: str | None = None
    names: list[str] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.urls)


def _scheme(url: str) -> str:
    s = urlparse(url).scheme
    return "" if len(s) <= 1 else s


def _from_index_meta(meta: dict, base: str, split: str, where: str, join) -> ShardList:
    splits = meta.get("splits", {})
    if split not in splits:
        raise IndexFormatError(f"{where}: no split {split!r}; the index has {', '.join(splits) or 'none'}")
    shards = [s for s in meta["shards"] if s["split"] == split]
    return ShardList(
        urls=[join(base, s["name"]) for s in shards],
        counts=[int(s["samples"]) for s in shards],
        mean=meta.get("mean"), std=meta.get("std"), size=meta.get("size"), classes=meta.get("classes"),
        meta=meta, index_base=base, names=[s["name"] for s in shards],
    )


def _remote_index(url: str, split: str) -> ShardList:
    from webdataset.gopen import gopen

    try:
        with gopen(url, "rb") as f:
            data = f.read()
    except (OSError, ValueError) as e:
        raise IndexFormatError(f"{url}: cannot read the index: {e}") from None
    meta = parse_index_meta(data, url)
    return _from_index_meta(meta, posixpath.dirname(url), split, url, lambda b, n: f"{b}/{n}")


def _object_store(spec: str, split: str) -> ShardList:
    """A folder, index.json or shard pattern in object storage; counts from the index beside the shards."""
    from wds_tools.storage import read_input

    if spec.endswith(".tar") or "{" in spec:
        urls, index_url = expand_pattern(spec), f"{posixpath.dirname(spec)}/{INDEX_FILE}"
    else:
        urls, index_url = None, spec if spec.endswith(INDEX_FILE) else f"{spec}/{INDEX_FILE}"
    try:
        data = read_input(index_url)
    except FileNotFoundError:
        if urls is None:
            raise IndexFormatError(f"{index_url}: no index there; point at a shard pattern instead") from None
        return ShardList(urls)
    except OSError as e:
        raise IndexFormatError(f"{index_url}: cannot read the index: {e}") from None
    meta = parse_index_meta(data, index_url)
    base = posixpath.dirname(index_url)
    if urls is None:
        return _from_index_meta(meta, base, split, index_url, lambda b, n: f"{b}/{n}")
    return _with_meta(urls, [u.rsplit("/", 1)[1] if posixpath.dirname(u) == base else None for u in urls], meta,
                      base)


def _with_meta(urls: list[str], names: list[str | None], meta: dict, base: str) -> ShardList:
    """``urls`` (shard file ``names``) with the index's samples per shard, when it lists them all, and stats."""
    by_name = {s["name"]: int(s["samples"]) for s in meta.get("shards", [])}
    if not all(n in by_name for n in names):
        return ShardList(urls, None, meta.get("mean"), meta.get("std"), meta.get("size"), meta.get("classes"))
    return ShardList(urls, [by_name[n] for n in names], meta.get("mean"), meta.get("std"), meta.get("size"),
                     meta.get("classes"), meta=meta, index_base=base, names=list(names))


def _local_counts(urls: list[str]) -> ShardList:
    """Counts and stats for local shards whose folder holds an index naming every one of them."""
    folder = Path(urls[0]).parent
    if not (folder / INDEX_FILE).exists() or any(Path(u).parent != folder for u in urls):
        return ShardList(urls)
    try:
        idx = load_index(folder)
    except IndexFormatError:
        return ShardList(urls)
    return _with_meta(urls, [Path(u).name for u in urls], idx.meta, str(folder))


def _resolve_one(spec: str, split: str) -> ShardList:
    spec = spec.strip()
    scheme = _scheme(spec)
    if scheme == "pipe":
        return ShardList(expand_pattern(spec))
    if scheme in _REMOTE:
        if spec.rstrip("/").endswith(INDEX_FILE):
            return _remote_index(spec.rstrip("/"), split)
        return ShardList(expand_pattern(spec))
    if scheme not in ("", "file"):  # s3://, gs://...: read through fsspec
        return _object_store(spec.rstrip("/"), split)
    path = urlparse(spec).path if scheme == "file" else spec
    p = Path(os.path.expanduser(path))
    if p.is_dir() or p.name == INDEX_FILE:
        idx = load_index(p)
        return _from_index_meta(idx.meta, str(idx.root), split, str(p), lambda b, n: str(Path(b) / n))
    urls = expand_pattern(str(p))
    missing = [u for u in urls if not Path(u).is_file()]
    if missing:
        raise ShardError(f"{spec}: {len(missing)} of {len(urls)} shards do not exist, e.g. {missing[0]}; "
                         f"check the pattern, or point at the shards folder")
    return _local_counts(urls)


def resolve_urls(urls: str | os.PathLike | Sequence[str | os.PathLike], *, split: str = "train") -> ShardList:
    """Expand patterns, folders and index files into a ShardList (``split`` is used for folders/indexes)."""
    specs: list[str] = []
    for u in [urls] if isinstance(urls, (str, os.PathLike)) else list(urls):
        specs.extend(s for s in str(u).split("::") if s.strip())
    if not specs:
        raise OptionError("urls: no shard given; expected a pattern like shards/v1/224/train-{000000..000041}.tar, "
                          "a shards folder or its index.json")
    parts = [_resolve_one(s, split) for s in specs]
    if len(parts) == 1:
        return parts[0]
    counts = None if any(p.counts is None for p in parts) else [c for p in parts for c in p.counts]
    first = parts[0]
    joined = ShardList([u for p in parts for u in p.urls], counts, first.mean, first.std, first.size, first.classes)
    if first.meta and all(p.index_base == first.index_base and p.meta == first.meta for p in parts[1:]):
        joined.meta, joined.index_base = first.meta, first.index_base  # patterns over one index
        joined.names = [n for p in parts for n in p.names]
    return joined


def worker_info() -> tuple[int, int, int, int]:
    """(rank, world size, worker id, workers), as webdataset finds them (RANK/WORLD_SIZE, torch.distributed, DataLoader)."""
    from webdataset.utils import pytorch_worker_info

    return pytorch_worker_info()


def shard_order(n: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's shard order: a permutation seeded by (seed, epoch), or 0..n-1."""
    if not shuffle:
        return list(range(n))
    return np.random.default_rng([seed, epoch, 0x5AD]).permutation(n).tolist()


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker of one rank reads in an epoch: shard indices, and the batches it must yield (None: all).

    ``spares``: shards of the other ranks this worker reads, after its own, only when skipped damage
    (``on_error="skip"``) left it short of ``batches``; see ``plan_epoch``.
    """

    shards: list[int]
    batches: int | None
    spares: list[int] = field(default_factory=list)


def plan_epoch(n_shards: int, counts: Sequence[int] | None, *, batch_size: int, seed: int, epoch: int,
               rank: int, world: int, num_workers: int, shuffle: bool, drop_last: bool,
               resampled: bool = False, epoch_batches: int | None = None) -> list[WorkerPlan]:
    """Plans of every worker of ``rank``: shards dealt round-robin to ranks, then to workers.

    Without resampling every rank gets the same number of batches: with ``world > 1`` each worker
    yields only full batches, and ranks are cut to the smallest rank's total (needs ``counts``).
    With resampling each worker draws shards with replacement and yields its share of
    ``epoch_batches`` batches per rank.

    Spares (several ranks only): worker ``w`` of rank ``r`` may top up from the shards that worker
    ``w`` of ranks r+1, r+2, ... reads, in that order. The spare lists of one rank's workers are
    disjoint and hold none of the rank's own shards, so topping up never repeats a sample within a
    rank; it repeats, on another rank, only samples that replace skipped ones.
    """
    slots = world * num_workers
    if resampled:
        if epoch_batches is None:
            if counts is None:
                raise OptionError("resampled=True needs epoch_batches (batches per rank and epoch) when the "
                                  "shards come without an index giving their sample counts")
            epoch_batches = sum(counts) // (world * batch_size)
        q, r = divmod(epoch_batches, num_workers)
        return [WorkerPlan([], q + (w < r)) for w in range(num_workers)]
    if n_shards < slots:
        raise OptionError(
            f"{n_shards} shards cannot feed {world} ranks x {num_workers} workers = {slots} readers "
            f"(each reader needs at least one shard); use num_workers <= {max(1, n_shards // world)}, "
            f"convert with a smaller --shard-size to get more shards, or pass resampled=True"
        )
    order = shard_order(n_shards, seed=seed, epoch=epoch, shuffle=shuffle)
    mine = order[rank::world]
    plans = [mine[w::num_workers] for w in range(num_workers)]
    if world == 1 and epoch_batches is None:
        if counts is None:
            return [WorkerPlan(p, None) for p in plans]
        per = [sum(counts[i] for i in p) for p in plans]
        n = [c // batch_size if drop_last else -(-c // batch_size) for c in per]
        return [WorkerPlan(p, b) for p, b in zip(plans, n)]
    if counts is None:
        raise OptionError(
            f"{world} ranks need the samples per shard to give every rank the same number of batches; "
            f"point urls at the shards folder or its index.json (not a bare pattern), or pass epoch_batches"
        )

    def full_batches(r: int) -> list[int]:
        rs = order[r::world]
        return [sum(counts[i] for i in rs[w::num_workers]) // batch_size for w in range(num_workers)]

    quota = min(sum(full_batches(r)) for r in range(world))
    if epoch_batches is not None:
        if epoch_batches > quota:
            raise OptionError(f"epoch_batches={epoch_batches}: the smallest rank has only {quota} full batches "
                              f"of {batch_size} this epoch; use epoch_batches <= {quota} or resampled=True")
        quota = epoch_batches
    mine_full = full_batches(rank)
    while sum(mine_full) > quota:  # cut the worker with the most batches (the last one on ties)
        w = max(range(num_workers), key=lambda i: (mine_full[i], i))
        mine_full[w] -= 1
    others = [order[(rank + d) % world::world] for d in range(1, world)]
    return [WorkerPlan(p, b, [i for o in others for i in o[w::num_workers]])
            for w, (p, b) in enumerate(zip(plans, mine_full))]
