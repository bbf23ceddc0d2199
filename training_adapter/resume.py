"""Resume: where a loader is in an epoch, as a small dict, and the rest of that epoch planned from it.

Index reader. An epoch is one sequence of rows (``indexread.epoch_order``, pure in seed and epoch)
that ``indexread.deal`` cuts for R ranks: rank r reads positions r, r+R, r+2R, ... in batches of B.
Ranks advance in lockstep (every rank yields the same number of batches), so after k batches on
every rank the positions read are exactly the prefix ``[0, R * min(k * B, per))`` of the sequence,
the same number on every rank: rank 0's state is every rank's. An epoch is a ``Span`` of the
sequence, ``[start, end)``; a resumed epoch deals the rest, ``[position, end)``, by the same rule
to the ranks and workers there are now. Same ranks: exactly the batches the uninterrupted run would
have yielded. Other ranks (elastic): each remaining sample at most once; the deal leaves out the
last ``(end - position) % R`` rows and ``drop_last`` a short batch, as in any epoch, and
``Span.left_out`` counts them.

Streaming reader. Worker w of rank r reads its shards in order through the shuffle buffer (n
samples); its b-th batch is made when sample ``n + b * B`` is pulled. From the batches each worker
has yielded (the DataLoader takes them round-robin) and the index's sample counts, ``stream_rest``
finds each worker's first unopened shard and resumes there: the samples of opened shards not yet
yielded (the buffer's, the rest of the shard being read) are skipped and counted, nothing is
replayed, so no sample comes twice in the epoch. Pure functions; ``loader.ShardLoader`` holds the
state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from wds_tools.errors import OptionError
from wds_tools.format.ranks import deal

from .shardlist import worker_info

__all__ = [
    "STATE_VERSION",
    "Span",
    "epoch_span",
    "StreamPlan",
    "yielded_per_worker",
    "stream_rest",
    "check_state",
    "resampled_rest",
    "Resumable",
]

log = logging.getLogger("training_adapter")

STATE_VERSION = 1
"""The version of the ``state_dict`` layout; a state of another version is refused."""
_KIND = "wds_tools.loader_state"


@dataclass(frozen=True)
class Span:
    """An epoch of the index reader: positions ``[start, end)`` of its row sequence (``draws`` rows
    drawn when resampled, else None)."""

    start: int
    end: int
    draws: int | None = None

    def per_rank(self, world: int) -> int:
        """Rows of the span each rank reads before cutting into batches (``indexread.deal``'s rule)."""
        n = self.end - self.start
        return n // world if world > 1 else n

    def batches(self, world: int, batch_size: int, drop_last: bool) -> int:
        """Batches per rank of the span."""
        per = self.per_rank(world)
        return per // batch_size if drop_last else -(-per // batch_size)

    def position(self, k: int, world: int, batch_size: int) -> int:
        """The first position not read once every rank has yielded ``k`` batches of the span."""
        return self.start + world * min(k * batch_size, self.per_rank(world))

    def left_out(self, world: int, batch_size: int, drop_last: bool) -> int:
        """Rows of the span no rank reads: the deal's remainder and, with ``drop_last``, short batches."""
        read = min(self.per_rank(world), self.batches(world, batch_size, drop_last) * batch_size)
        return self.end - self.start - world * read


def epoch_span(
    n_order: int, *, world: int, batch_size: int, drop_last: bool, max_batches: int | None, draws: int | None = None
) -> Span:
    """The span a whole epoch of ``n_order`` rows reads with ``world`` ranks (``epoch_batches``:
    ``max_batches``): ``[0, R * rows per rank read)``."""
    whole = Span(0, n_order, draws)
    nb = whole.batches(world, batch_size, drop_last)
    if max_batches is not None:
        nb = min(nb, max_batches)
    return Span(0, world * min(whole.per_rank(world), nb * batch_size), draws)


@dataclass(frozen=True)
class StreamPlan:
    """The streaming reader's plan of one (resumed) epoch: [rank][worker] -> shard positions, and
    [rank][worker] -> the batches each worker yields."""

    shards: list[list[list[int]]]
    batches: list[list[int]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for the state)."""
        return {"shards": self.shards, "batches": self.batches}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StreamPlan:
        """The plan ``to_dict`` wrote."""
        return cls([[[int(i) for i in w] for w in r] for r in d["shards"]], [[int(b) for b in r] for r in d["batches"]])


def yielded_per_worker(k: int, planned: Sequence[int]) -> list[int]:
    """Batches each worker has handed over after the DataLoader yielded ``k``: it takes them
    round-robin, passing over a worker once it has yielded its ``planned`` batches."""
    got = [0] * len(planned)
    left = k
    while left > 0:
        moved = False
        for w, p in enumerate(planned):
            if left and got[w] < p:
                got[w] += 1
                left -= 1
                moved = True
        if not moved:
            break
    return got


def _quota(per_worker_samples: list[list[int]], batch_size: int, drop_last: bool) -> list[list[int]]:
    """Each worker's batches: one rank, all its samples; several, full batches cut to the smallest
    rank's total (the rule of ``shardlist.plan_epoch``)."""
    B = batch_size
    if len(per_worker_samples) == 1:
        return [[c // B if drop_last else -(-c // B) for c in per_worker_samples[0]]]
    full = [[c // B for c in ranks] for ranks in per_worker_samples]
    quota = min(sum(f) for f in full)
    for mine in full:
        while sum(mine) > quota:  # cut the worker with the most batches (the last one on ties)
            w = max(range(len(mine)), key=lambda i: (mine[i], i))
            mine[w] -= 1
    return full


def stream_rest(
    old: StreamPlan,
    counts: Sequence[int],
    k: int,
    *,
    batch_size: int,
    buffer: int,
    world: int,
    num_workers: int,
    drop_last: bool,
) -> tuple[StreamPlan, int]:
    """The rest of a streamed epoch after every rank yielded ``k`` batches of ``old``, planned for
    ``world`` ranks of ``num_workers`` workers; and the samples skipped (read into the buffer or in a
    shard begun, not yielded). ``buffer``: the shuffle buffer (0 or 1: none)."""
    B, n = batch_size, buffer if buffer > 1 else 0
    rest: list[list[list[int]]] = []
    skipped = 0
    for shards, planned in zip(old.shards, old.batches):
        got = yielded_per_worker(k, planned)
        mine: list[list[int]] = []
        for w, own in enumerate(shards):
            if got[w] >= planned[w]:  # done: what it did not yield was never in the epoch's batches
                mine.append([])
                continue
            pulled = n + got[w] * B if got[w] else 0  # beyond its samples: all read, the buffer draining
            before, left, opened = 0, [], 0
            for i in own:
                if before < pulled:  # its first sample was pulled
                    opened += counts[i]
                else:
                    left.append(i)
                before += counts[i]
            skipped += opened - got[w] * B
            mine.append(left)
        rest.append(mine)
    old_workers = len(old.shards[0]) if old.shards else 0
    if len(rest) == world and old_workers == num_workers:
        dealt = rest
    else:  # elastic: the shards left, in the epoch's order, dealt afresh
        pooled = [i for r in range(len(rest)) for w in range(len(rest[r])) for i in rest[r][w]]
        dealt = deal(pooled, world, num_workers)
    samples = [[sum(counts[i] for i in w) for w in r] for r in dealt]
    return StreamPlan(dealt, _quota(samples, B, drop_last)), skipped


def check_state(state: Any, *, reader: str) -> Mapping[str, Any]:
    """``state`` if it is a loader state of this version for ``reader``, else an ``OptionError`` saying why."""
    if not isinstance(state, Mapping) or state.get("kind") != _KIND:
        what = "a dict without kind=" + repr(_KIND) if isinstance(state, Mapping) else type(state).__name__
        raise OptionError(f"load_state_dict: expected the dict loader.state_dict() returned, got {what}")
    if state.get("version") != STATE_VERSION:
        raise OptionError(
            f"load_state_dict: state version {state.get('version')!r}; this loader reads version "
            f"{STATE_VERSION} (saved by another wds-tools version: restart the epoch instead)"
        )
    if state.get("reader") != reader:
        raise OptionError(
            f"load_state_dict: the state was saved by the {state.get('reader')} reader, this loader "
            f"uses the {reader} reader (pass reader={state.get('reader')!r} to make_loader)"
        )
    return state


def resampled_rest(old: StreamPlan, k: int, *, world: int, num_workers: int) -> StreamPlan:
    """The rest of a resampled streamed epoch: the batches every old rank had left, shared by ``world``
    ranks (drawn afresh: a resampled epoch draws shards with replacement, so none is "the rest")."""
    left = sum(max(0, sum(planned) - k) for planned in old.batches) // world
    q, r = divmod(left, num_workers)
    return StreamPlan(
        [[[] for _ in range(num_workers)] for _ in range(world)],
        [[q + (w < r) for w in range(num_workers)] for _ in range(world)],
    )


def state_base(reader: str, **fields: Any) -> dict[str, Any]:
    """A state dict's common fields, then ``fields``."""
    return {"kind": _KIND, "version": STATE_VERSION, "reader": reader, **fields}


def same(state: Mapping[str, Any], name: str, have: Any, fix: str) -> None:
    """Refuse a state whose ``name`` is not ``have`` (another dataset, subset or seed), saying ``fix``."""
    if state.get(name) != have:
        raise OptionError(
            f"load_state_dict: the state was saved with {name}={state.get(name)!r}, this loader has {have!r}: {fix}"
        )


class Resumable:
    """``state_dict`` / ``load_state_dict`` for ``loader.ShardLoader`` (torchdata ``StatefulDataLoader``'s names).

    The state is a small dict of JSON-able values (save it with the model's checkpoint, e.g. through
    ``torch.save``); it is the same on every rank, so rank 0's is enough. ``load_state_dict`` before
    iterating makes the next iteration the rest of the saved epoch (``set_epoch`` to another epoch
    drops it); see the module docstring for what is exact and what is skipped.

    Fields: ``kind``, ``version``, ``reader`` (index or stream), ``epoch`` (the epoch to continue),
    ``seed``; index: ``position`` and ``end`` (the rest of the epoch's row sequence; ``end`` None:
    the whole epoch), ``draws`` (resampled: the sequence's length), ``samples`` and ``rows_xxh3``
    (the selection, checked on load), ``batch_size``, ``world``, ``left_out`` (rows of this resumed
    epoch no new rank reads); stream: ``batches`` (every rank's, so far), ``world``, ``workers``,
    ``plan`` (a resumed epoch's shards and batches per rank and worker, else None), ``skipped``
    (samples of begun shards not yielded, this epoch), ``shards``, ``batch_size``, ``buffer``.
    """

    dataset: Any
    num_workers: int
    _loaded: Mapping[str, Any] | None = None  # a state waiting for the next iteration
    _run: tuple[int, Any, int] | None = None  # (epoch, its plan: Span / StreamPlan, skipped before) now iterated
    _yielded = 0  # batches the iteration now running has yielded
    _digest: int | None = None

    def _rows_digest(self) -> int:
        """xxh3-64 of the selected rows' keys: a state of another dataset or subset is refused."""
        if self._digest is None:
            ds = self.dataset
            self._digest = xxhash.xxh3_64_intdigest(np.ascontiguousarray(ds.index.key[ds.rows]).tobytes())
        return self._digest

    def _where(self) -> tuple[int, int, int]:
        rank, world = self.dataset.rank_world or _rank_world()
        return rank, world, max(1, self.num_workers)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch, and in it the batches every rank has yielded (JSON-able, small)."""
        if self._loaded is not None:
            return dict(self._loaded)
        ds, o = self.dataset, self.dataset.options
        _, world, workers = self._where()
        indexed = ds.index is not None
        if self._run is None:  # nothing yielded yet: the next epoch from its start
            epoch, plan, k, skipped = ds.epoch, None, 0, 0
        else:
            epoch, plan, skipped = self._run
            k = self._yielded
        if indexed:
            span: Span = plan or ds.epoch_span(world)
            if k >= span.batches(world, o.batch_size, o.drops_last):
                epoch, k, span = epoch + (self._run is not None), 0, Span(0, 0)
            fields = dict(
                epoch=epoch,
                position=span.position(k, world, o.batch_size) if k else span.start,
                end=span.end if (k or plan) else None,
                draws=span.draws if (k or plan) else None,
            )
            return state_base(
                "index",
                **fields,
                seed=o.seed,
                samples=len(ds.rows),
                rows_xxh3=self._rows_digest(),
                batch_size=o.batch_size,
                world=world,
                left_out=skipped if fields["end"] is not None else 0,
            )
        stream: StreamPlan | None = plan
        if stream is None and self._run is not None:
            stream = self._stream_plan(epoch, world, workers)
        if stream is not None and k >= sum(stream.batches[0]):
            epoch, k, stream, skipped = epoch + 1, 0, None, 0
        return state_base(
            "stream",
            epoch=epoch,
            batches=k,
            world=world,
            workers=workers,
            plan=stream.to_dict() if plan is not None and stream is not None else None,
            skipped=skipped if stream is not None else 0,
            seed=o.seed,
            shards=len(ds.shards),
            batch_size=o.batch_size,
            buffer=o.buffer,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration continue the epoch ``state`` (from ``state_dict``) was saved in."""
        ds, o = self.dataset, self.dataset.options
        reader = "index" if ds.index is not None else "stream"
        check_state(state, reader=reader)
        same(state, "seed", o.seed, "pass the seed the interrupted run used")
        if reader == "index":
            fix = "resume with the dataset, split and subset the interrupted run read"
            same(state, "samples", len(ds.rows), fix)
            same(state, "rows_xxh3", self._rows_digest(), fix)
        else:
            same(state, "shards", len(ds.shards), "resume with the shards the interrupted run read")
            if (state.get("batches") or state.get("plan")) and ds.shards.counts is None:
                raise OptionError(
                    "load_state_dict: resuming the streaming reader mid-epoch needs the samples per "
                    "shard: point urls at the shards folder or its index.json"
                )
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise OptionError(f"load_state_dict: epoch={epoch!r}: expected an integer >= 0")
        ds.set_epoch(epoch)
        self._epoch_set = True
        self._loaded = dict(state)
        self._after_load()

    def _after_load(self) -> None:
        """Hook: ``ShardLoader`` renews persistent workers, which hold the dataset they started with."""

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the one the next iteration yields; a loaded state of another epoch is dropped."""
        if self._loaded is not None and self._loaded.get("epoch") != epoch:
            log.warning(
                "set_epoch(%d) drops the loaded state of epoch %s: epoch %d starts from its beginning",
                epoch,
                self._loaded.get("epoch"),
                epoch,
            )
            self._loaded = None
        self.dataset.set_epoch(epoch)
        self._epoch_set = True

    def _stream_plan(self, epoch: int, world: int, workers: int) -> StreamPlan:
        """Every rank's plan of a whole streamed ``epoch``."""
        plans = [self.dataset.plans(rank=r, world=world, num_workers=workers, epoch=epoch) for r in range(world)]
        return StreamPlan([[p.shards for p in ps] for ps in plans], [[p.batches or 0 for p in ps] for ps in plans])

    def _begin(self) -> None:
        """At an iteration's start (rank and world known): plan the rest of a loaded epoch, or the whole one."""
        ds, o = self.dataset, self.dataset.options
        state, self._loaded = self._loaded, None
        ds.resume, ds._resumes.value, self._yielded = None, -1, 0
        _, world, workers = self._where()
        epoch = ds.epoch
        plan: Any = None
        skipped = 0
        here = state is not None and state["epoch"] == epoch
        if here and state is not None and state["reader"] == "index" and state.get("end") is not None:
            plan = Span(int(state["position"]), int(state["end"]), state.get("draws"))
            lost = skipped = plan.left_out(world, o.batch_size, o.drops_last)
            if lost:
                log.warning(
                    "resuming epoch %d on %d ranks: %d of its %d remaining samples do not fill a batch on "
                    "every rank and are left out, as in any epoch",
                    epoch,
                    world,
                    lost,
                    plan.end - plan.start,
                )
        elif here and state is not None and state["reader"] == "stream" and (state.get("batches") or state.get("plan")):
            old_world, old_workers = int(state["world"]), int(state["workers"])
            old = (
                StreamPlan.from_dict(state["plan"])
                if state.get("plan")
                else self._stream_plan(epoch, old_world, old_workers)
            )
            k = int(state["batches"])
            if o.resampled:
                plan, now = resampled_rest(old, k, world=world, num_workers=workers), 0
            else:
                plan, now = stream_rest(
                    old,
                    ds.shards.counts,
                    k,
                    batch_size=o.batch_size,
                    buffer=o.buffer,
                    world=world,
                    num_workers=workers,
                    drop_last=o.drops_last,
                )
            skipped = int(state.get("skipped") or 0) + now
            log.warning(
                "resuming epoch %d of the streaming reader at the next unread shard of each worker: %d "
                "samples already read into the shuffle buffer or begun shards are skipped (none replayed)",
                epoch,
                now,
            )
        if plan is not None:
            ds.resume, ds._resumes.value = plan, epoch
        self._run = (epoch, plan, skipped)

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``, counted for ``state_dict``."""
        for batch in batches:
            self._yielded += 1
            yield batch


def _rank_world() -> tuple[int, int]:
    where = worker_info()
    return where.rank, where.world
