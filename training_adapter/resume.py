"""Resume: where a loader is in an epoch (``Resumable.state_dict``), and the rest of that epoch planned from it.

Index reader: a ``Span`` of the epoch's row sequence; streaming reader: a ``StreamReplay`` on the same
readers, or ``stream_rest`` on others. Pure functions but ``Resumable``; ``statedict`` checks a state
on load. What is exact, elastic or refused, and why: docs/guide/loader-internals.md, Resume.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import xxhash

from wds_tools.errors import OptionError
from wds_tools.ranks import deal

from .shardlist import rank_world, worker_batches
from .statedict import (
    STATE_VERSION,
    check_plan,
    check_settings,
    check_span,
    check_state,
    field_error,
    same,
    settings_of,
    state_base,
    weights_description,
)

__all__ = [
    "STATE_VERSION",
    "Span",
    "epoch_span",
    "StreamPlan",
    "StreamRest",
    "StreamReplay",
    "replayed",
    "stream_rest",
    "resampled_rest",
    "Resumable",
]

log = logging.getLogger("training_adapter")


@dataclass(frozen=True)
class Span:
    """An epoch of the index reader: positions ``[start, end)`` of its row sequence (``draws`` rows
    drawn when resampled, else None). ``cover`` (evaluation): every row once across the ranks, the
    first ``len % world`` ranks one more (``indexplan.rank_rows``), so rank 0 has the most."""

    start: int
    end: int
    draws: int | None = None

    def rank_rows(self, world: int, rank: int = 0, cover: bool = False) -> int:
        """Rows of the span ``rank`` reads before cutting into batches (``indexplan.deal``'s rule)."""
        n = self.end - self.start
        if world == 1:
            return n
        return len(range(rank, n, world)) if cover else n // world

    def batches(self, world: int, batch_size: int, drop_last: bool, cover: bool = False) -> int:
        """Batches of rank 0 of the span: every rank's in training, the most of any rank with ``cover``."""
        per = self.rank_rows(world, 0, cover)
        return per // batch_size if drop_last else -(-per // batch_size)

    def position(self, k: int, world: int, batch_size: int, cover: bool = False) -> int:
        """The first position not read once every rank has yielded ``k`` batches of the span (or all it
        has): rank r reads positions ``start + r + i * world``, so the rows read are a prefix."""
        if cover:
            return self.start + min(self.end - self.start, world * k * batch_size)
        return self.start + world * min(k * batch_size, self.rank_rows(world))

    def left_out(self, world: int, batch_size: int, drop_last: bool, cover: bool = False) -> int:
        """Rows of the span no rank reads: in training the deal's remainder and, with ``drop_last``,
        short batches; with ``cover``, only ``drop_last``'s short batches."""
        if not cover:
            read = min(self.rank_rows(world), self.batches(world, batch_size, drop_last) * batch_size)
            return self.end - self.start - world * read
        if not drop_last:
            return 0
        return sum(self.rank_rows(world, r, True) % batch_size for r in range(world))


def epoch_span(
    n_order: int,
    *,
    world: int,
    batch_size: int,
    drop_last: bool,
    max_batches: int | None,
    draws: int | None = None,
    cover: bool = False,
) -> Span:
    """The span a whole epoch of ``n_order`` rows reads with ``world`` ranks (``epoch_batches``:
    ``max_batches``): ``[0, R * rows per rank read)``; with ``cover``, up to rank 0's last row read."""
    whole = Span(0, n_order, draws)
    nb = whole.batches(world, batch_size, drop_last, cover)
    if max_batches is not None:
        nb = min(nb, max_batches)
    if cover:
        return Span(0, min(n_order, world * nb * batch_size), draws)
    return Span(0, world * min(whole.rank_rows(world), nb * batch_size), draws)


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


def replayed(k: int, planned: Sequence[int]) -> tuple[list[int], int]:
    """Batches each worker has handed over after the DataLoader yielded ``k`` (it takes them round-robin,
    passing over a worker once it has yielded its ``planned`` batches), in closed form (a state may claim
    many), and the worker it asks next: the one after the last that yielded (0 before any)."""
    k = max(0, min(k, sum(planned)))
    lo, hi = 0, max(planned, default=0)
    while lo < hi:  # the most whole rounds R with sum(min(p, R)) <= k
        mid = (lo + hi + 1) // 2
        if sum(min(p, mid) for p in planned) <= k:
            lo = mid
        else:
            hi = mid - 1
    got = [min(p, lo) for p in planned]
    left, last = k - sum(got), None
    for w, p in enumerate(planned):  # a part round: one more from each worker with batches left, in order
        if left and p > lo:
            got[w] += 1
            left -= 1
            last = w
    if last is None and lo:  # the last whole round's last worker
        last = max(w for w, p in enumerate(planned) if p >= lo)
    return got, 0 if last is None else (last + 1) % len(planned)


@dataclass(frozen=True)
class StreamReplay:
    """A streamed epoch resumed on the ranks and workers it stopped on: ``batches`` (every rank's, or
    all a rank has) of ``base`` (a resumed epoch's plan; None: the epoch's own) were yielded, and each
    worker replays its stream past them (docs/guide/loader-internals.md)."""

    base: StreamPlan | None
    batches: int


@dataclass(frozen=True)
class StreamRest:
    """The rest of a streamed epoch (``stream_rest``): its plan; ``skipped``, the samples of shards
    begun before the stop that no batch yielded (read into the shuffle buffer, or not yet read),
    which the rest does not read; ``left_out``, the samples of the rest's shards that its batches
    leave out by the batch rule (equal full batches per rank in training, ``drop_last``)."""

    plan: StreamPlan
    skipped: int
    left_out: int


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
    cover: bool = False,
) -> StreamRest:
    """The rest of a streamed epoch after every rank yielded ``k`` batches of ``old`` (or all it has),
    planned for ``world`` ranks of ``num_workers`` workers. ``buffer``: the shuffle buffer (0 or 1:
    none); ``cover``: evaluation, every worker reads all of its shards."""
    B, n = batch_size, buffer if buffer > 1 else 0
    rest: list[list[list[int]]] = []
    skipped = 0
    for shards, planned in zip(old.shards, old.batches):
        got = replayed(k, planned)[0]
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
    batches = worker_batches(samples, B, drop_last=drop_last, cover=cover)
    left_out = sum(c - min(c, b * B) for cs, bs in zip(samples, batches) for c, b in zip(cs, bs))
    return StreamRest(StreamPlan(dealt, batches), skipped, left_out)


def resampled_rest(old: StreamPlan, k: int, *, world: int, num_workers: int) -> StreamPlan:
    """The rest of a resampled streamed epoch: the batches every old rank had left, shared by ``world``
    ranks (drawn afresh: a resampled epoch draws shards with replacement, so none is "the rest")."""
    left = sum(max(0, sum(planned) - k) for planned in old.batches) // world
    q, r = divmod(left, num_workers)
    return StreamPlan(
        [[[] for _ in range(num_workers)] for _ in range(world)],
        [[q + (w < r) for w in range(num_workers)] for _ in range(world)],
    )


class Resumable:
    """``state_dict`` / ``load_state_dict`` for ``loader.ShardLoader`` (torchdata ``StatefulDataLoader``'s names).

    The state is a small dict of JSON-able values (save it with the model's checkpoint, e.g. through
    ``torch.save``). It is the same on every rank once every rank has yielded the same number of
    batches (or all it has): save rank 0's at such a point (a training step; in evaluation, a barrier).
    ``load_state_dict`` before iterating makes the next iteration the rest of the saved epoch
    (``set_epoch`` to another epoch drops it). What is exact, what is refused, and the state's fields:
    docs/guide/loader-internals.md, Resume.
    """

    dataset: Any
    num_workers: int
    _loaded: dict[str, Any] | None = None  # a state waiting for the next iteration
    _run: tuple[int, Any, int] | None = None  # (epoch, its plan: Span / StreamPlan / StreamReplay, skipped) iterated
    _yielded = 0  # batches the iteration now running has yielded

    @cached_property
    def _rows_xxh3(self) -> int:
        """xxh3-64 of the selected rows' keys and labels, in index order: another split, subset or dataset differs."""
        ds = self.dataset
        rows = slice(None) if len(ds.rows) == len(ds.index) else ds.rows  # rows are sorted and distinct: all
        h = xxhash.xxh3_64()
        h.update(np.ascontiguousarray(ds.index.key[rows]).data)
        h.update(np.ascontiguousarray(ds.index.label[rows], dtype="<i8").data)
        return h.intdigest()

    @cached_property
    def _shards_xxh3(self) -> int:
        """xxh3-64 of the shards' index entries (name, samples, bytes, sha256), in the order read; without
        one index listing them all, of their names and sample counts."""
        shards = self.dataset.shards
        listed = {e.name: e for e in shards.info.shards} if shards.info and shards.names else None
        h = xxhash.xxh3_64()
        for i, url in enumerate(shards.urls):
            if listed is not None and shards.names is not None:
                e = listed[shards.names[i]]
                line = f"{e.name}\t{e.samples}\t{e.bytes}\t{e.sha256}\n"
            else:
                line = f"{url.rsplit('/', 1)[-1]}\t{shards.counts[i] if shards.counts else None}\n"
            h.update(line.encode())
        return h.intdigest()

    @cached_property
    def _shares_xxh3(self) -> int | None:
        """xxh3-64 of the class shares ``class_weights`` give (None: none); equal shares, equal orders."""
        shares = self.dataset.shares
        return None if shares is None else xxhash.xxh3_64_intdigest(np.ascontiguousarray(shares, "<f8").tobytes())

    def _where(self) -> tuple[int, int, int]:
        rank, world = self.dataset.rank_world or rank_world()
        return rank, world, max(1, self.num_workers)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch, and in it the batches every rank has yielded (JSON-able, small)."""
        if self._loaded is not None:
            return dict(self._loaded)
        ds, o = self.dataset, self.dataset.options
        _, world, workers = self._where()
        if self._run is None:  # nothing yielded yet: the next epoch from its start
            epoch, plan, k, skipped = ds.epoch, None, 0, 0
        else:
            epoch, plan, skipped = self._run
            k = self._yielded
        common = dict(**settings_of(o), shards=len(ds.shards), shards_xxh3=self._shards_xxh3)
        if ds.index is not None:
            span: Span = plan or ds.epoch_span(world)
            if k >= span.batches(world, o.batch_size, o.drops_last, o.covers):  # done: the next epoch
                epoch, k, span, plan = epoch + (self._run is not None), 0, Span(0, 0), None
            begun = bool(k) or plan is not None
            return state_base(
                "index",
                **common,
                epoch=epoch,
                world=world,
                class_weights=weights_description(o.class_weights),
                shares_xxh3=self._shares_xxh3,
                samples=len(ds.rows),
                rows_xxh3=self._rows_xxh3,
                position=span.position(k, world, o.batch_size, o.covers) if k else span.start,
                end=span.end if begun else None,
                draws=span.draws if begun else None,
                left_out=skipped if begun else 0,
            )
        if isinstance(plan, StreamReplay):  # the batches of its base: those yielded before the stop, and since
            k += plan.batches
            plan = plan.base
        stream: StreamPlan | None = plan
        if stream is None and self._run is not None:
            stream = ds.epoch_plan(world=world, num_workers=workers, epoch=epoch)
        if stream is not None and k >= max(sum(b) for b in stream.batches):  # every rank done: the next epoch
            epoch, k, stream, plan = epoch + 1, 0, None, None
        return state_base(
            "stream",
            **common,
            epoch=epoch,
            world=world,
            workers=workers,
            batches=k,
            plan=plan.to_dict() if plan is not None else None,
            skipped=skipped if stream is not None else 0,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration continue the epoch ``state`` (from ``state_dict``) was saved in;
        an ``OptionError`` naming the field or setting where it cannot continue exactly (``statedict``)."""
        ds, o = self.dataset, self.dataset.options
        reader = "index" if ds.index is not None else "stream"
        checked = check_state(state, o, reader=reader)
        check_settings(checked, o, reader=reader)
        fix = "resume with the dataset and split the interrupted run read (a re-conversion is another dataset)"
        same(checked, "shards", len(ds.shards), fix)
        same(checked, "shards_xxh3", self._shards_xxh3, fix, show=_hex)
        if reader == "index":
            if checked["shares_xxh3"] != self._shares_xxh3:
                ours = weights_description(o.class_weights)
                raise OptionError(
                    f"load_state_dict: the state was saved with class_weights={checked['class_weights']!r} "
                    f"(class shares shares_xxh3={_hex(checked['shares_xxh3'])}), this loader has "
                    f"class_weights={ours!r} (shares_xxh3={_hex(self._shares_xxh3)}): the rest of the epoch "
                    f"would not be the interrupted run's; make the loader with the class_weights the "
                    f"interrupted run used"
                )
            fix = "resume with the split and subset the interrupted run read"
            same(checked, "samples", len(ds.rows), fix)
            same(checked, "rows_xxh3", self._rows_xxh3, fix, show=_hex)
            check_span(
                checked,
                rows=len(ds.rows),
                batch_size=o.batch_size,
                epoch_batches=o.epoch_batches,
                resampled=o.resampled,
            )
        else:
            self._check_stream(checked)
        ds.set_epoch(checked["epoch"])
        self._epoch_set = True
        self._loaded = checked
        self._after_load()

    def _check_stream(self, state: dict[str, Any]) -> None:
        """Refuse a streamed ``state`` whose ``batches``, ``plan``, ``world``/``workers`` or ``skipped``
        no run over these shards could have saved; a checked plan replaces the state's."""
        ds, o = self.dataset, self.dataset.options
        k, plan, counts = state["batches"], state["plan"], ds.shards.counts
        if counts is None:
            if k or plan is not None:
                raise OptionError(
                    "load_state_dict: resuming the streaming reader mid-epoch needs the samples per "
                    "shard: point urls at the shards folder or its index.json"
                )
            return
        if state["skipped"] > sum(counts):
            raise field_error("skipped", state["skipped"], f"expected at most {sum(counts)}, the shards' samples")
        world, workers = state["world"], state["workers"]
        if plan is not None:
            shards, batches = check_plan(
                plan, world=world, workers=workers, counts=counts, batch_size=o.batch_size, resampled=o.resampled
            )
            state["plan"] = {"shards": shards, "batches": batches}
            old = StreamPlan(shards, batches)
        elif k:
            if not (o.resampled or o.covers) and len(ds.shards) < world * workers:
                raise field_error(
                    "world",
                    world,
                    f"with workers={workers}: {world * workers} readers, but in training each needs one of "
                    f"the {len(ds.shards)} shards",
                )
            old = ds.epoch_plan(world=world, num_workers=workers, epoch=state["epoch"])
        else:
            return
        most = max(sum(b) for b in old.batches)
        if k < most and not o.resampled:
            self._refuse_lossy(state, old, k)
        if k >= most:
            raise field_error(
                "batches",
                k,
                (
                    f"expected from 0 to {most - 1}: the epoch has {most} batches on its longest rank "
                    f"(of world={world}, workers={workers})"
                    if most
                    else "the plan holds no batch"
                )
                + "; a state at an epoch's end names the next epoch, with batches=0 and plan=None",
            )

    def _refuse_lossy(self, state: Mapping[str, Any], old: StreamPlan, k: int) -> None:
        """Refuse a streamed ``state`` (``k`` batches of ``old`` yielded) that these ranks and workers
        cannot continue exactly: on others, the samples its readers had pulled and not yielded would be lost."""
        _, world, workers = self._where()
        if (world, workers) == (state["world"], state["workers"]):
            return  # replayed: exact
        rest = self._stream_rest(old, k)
        if not rest.skipped:
            return

        def readers(w: int, n: int) -> str:
            return f"{w} rank{'s' if w > 1 else ''}, {n} reader{'s' if n > 1 else ''} each (num_workers={n if n > 1 else '0 or 1'})"

        raise OptionError(
            f"load_state_dict: the state stopped epoch {state['epoch']} of the streaming reader after {k} batches "
            f"on {readers(state['world'], state['workers'])}; this loader reads on {readers(world, workers)}: "
            f"{rest.skipped} samples that the stopped readers had pulled (into their shuffle buffers, or of the "
            f"shards they were reading) and not yielded would be lost, since only a reader's own stream gives "
            f"them; resume on {readers(state['world'], state['workers'])} (exact), read with the index reader "
            f"(exact on any ranks), or start epoch {state['epoch'] + 1} afresh without the state"
        )

    def _stream_rest(self, old: StreamPlan, k: int) -> StreamRest:
        """``stream_rest`` of ``old`` after ``k`` batches, on this loader's ranks and workers."""
        ds, o = self.dataset, self.dataset.options
        _, world, workers = self._where()
        return stream_rest(
            old,
            ds.shards.counts,
            k,
            batch_size=o.batch_size,
            buffer=o.buffer,
            world=world,
            num_workers=workers,
            drop_last=o.drops_last,
            cover=o.covers,
        )

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
        if here and state is not None and state["reader"] == "index" and state["end"] is not None:
            plan = Span(state["position"], state["end"], state["draws"])
            skipped = plan.left_out(world, o.batch_size, o.drops_last, o.covers)
            if skipped:
                log.warning(
                    "resuming epoch %d on %d ranks: %d of its %d remaining samples are left out, as in any epoch (%s)",
                    epoch,
                    world,
                    skipped,
                    plan.end - plan.start,
                    "drop_last drops a short batch"
                    if o.covers
                    else "every rank reads the same number; drop_last drops a short batch",
                )
        elif here and state is not None and state["reader"] == "stream" and (state["batches"] or state["plan"]):
            base = StreamPlan.from_dict(state["plan"]) if state["plan"] else None
            old = base or ds.epoch_plan(world=state["world"], num_workers=state["workers"], epoch=epoch)
            k = state["batches"]
            left = 0
            if (world, workers) == (state["world"], state["workers"]):
                plan = StreamReplay(base, k)  # exact
            elif o.resampled:
                plan = resampled_rest(old, k, world=world, num_workers=workers)
            else:
                rest = self._stream_rest(old, k)
                if rest.skipped:  # load_state_dict refused it, unless the ranks were not known then
                    self._loaded = state  # kept: the next iteration refuses it again
                    self._refuse_lossy(state, old, k)
                plan, left = rest.plan, rest.left_out
            skipped = state["skipped"]
            if left:
                log.warning(
                    "resuming epoch %d of the streaming reader on %d ranks of %d workers at each worker's next "
                    "unopened shard: %d samples of the shards left do not fill a batch (%s), as in any epoch",
                    epoch,
                    world,
                    workers,
                    left,
                    "drop_last" if o.covers else "every rank the same number of full batches",
                )
        if plan is not None:
            ds.resume, ds._resumes.value = plan, epoch
        self._run = (epoch, plan, skipped)

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``, counted for ``state_dict``."""
        for batch in batches:
            self._yielded += 1
            yield batch


def _hex(v: Any) -> str:
    return f"{v:#018x}" if isinstance(v, int) else repr(v)
