"""Streaming: the streaming reader's batch dataset, for shards without an index (or ``reader="stream"``).

Each worker streams the shards its ``shardlist.WorkerPlan`` deals it (``tarread``) and collates
lists of ``batch_size`` samples.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from wds_tools.errors import OptionError, ShardError

from .batch import Batch, BatchDataset
from .resume import StreamPlan, StreamReplay, replayed
from .shardlist import ShardList, WorkerInfo, WorkerPlan, plan_epoch, plan_grid
from .tarread import Identity, SampleStream, Views, first_identity

if TYPE_CHECKING:  # (loader imports this module)
    from .loader import LoaderOptions

__all__ = ["StreamingDataset"]

log = logging.getLogger("training_adapter")


class StreamingDataset(BatchDataset):
    """Batches streamed from the tars (see the module docstring and ``BatchDataset``)."""

    def __init__(self, shards: ShardList, options: LoaderOptions) -> None:
        super().__init__(shards, options)
        self.expect: Identity | None = None  # the dataset every sample must name (tarread.SampleStream)

    def num_batches(self, *, rank: int, world: int, num_workers: int) -> int | None:
        """Batches this rank yields per epoch (None: unknown, the shards come without counts)."""
        plans = self.plans(rank=rank, world=world, num_workers=num_workers)
        counts = [p.batches for p in plans]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def plans(self, *, rank: int, world: int, num_workers: int, epoch: int | None = None) -> list[WorkerPlan]:
        """Every worker's plan of ``rank`` in ``epoch`` (default: the current one)."""
        e = self.epoch if epoch is None else epoch
        rest = self.resumed(e)
        if isinstance(rest, StreamReplay):  # the epoch resumed where it stopped, on the same readers (resume.py)
            base = self._base_plans(rest.base, e, rank=rank, world=world, num_workers=num_workers)
            got, first = replayed(rest.batches, [p.batches or 0 for p in base])
            order = [(first + j) % num_workers for j in range(num_workers)]  # the DataLoader's round-robin goes on
            return [replace(base[w], batches=(base[w].batches or 0) - got[w], skip=got[w], stream=w) for w in order]
        return self._base_plans(rest, e, rank=rank, world=world, num_workers=num_workers)

    def _base_plans(
        self, rest: StreamPlan | None, epoch: int, *, rank: int, world: int, num_workers: int
    ) -> list[WorkerPlan]:
        """The plans of the epoch (``rest`` None) or of the rest of an interrupted one (resume.py)."""
        if rest is None:
            return plan_epoch(
                len(self.shards), self.shards.counts, rank=rank, **self._plan_options(epoch, world, num_workers)
            )
        if not 0 <= rank < len(rest.shards) or len(rest.shards[rank]) != num_workers:
            raise OptionError(
                f"the resumed epoch was planned for {len(rest.shards)} ranks of "
                f"{len(rest.shards[0]) if rest.shards else 0} workers, not rank {rank} of "
                f"{num_workers} workers"
            )
        return [WorkerPlan(s, b) for s, b in zip(rest.shards[rank], rest.batches[rank])]

    def epoch_plan(self, *, world: int, num_workers: int, epoch: int) -> StreamPlan:
        """Every rank's plan of the whole ``epoch`` (a resumed one's rest aside), for ``resume``."""
        grid = plan_grid(len(self.shards), self.shards.counts, **self._plan_options(epoch, world, num_workers))
        return StreamPlan([[p.shards for p in ps] for ps in grid], [[p.batches or 0 for p in ps] for ps in grid])

    def _plan_options(self, epoch: int, world: int, num_workers: int) -> dict[str, Any]:
        o = self.options
        return dict(
            batch_size=o.batch_size,
            seed=o.seed,
            epoch=epoch,
            world=world,
            num_workers=num_workers,
            shuffle=o.shuffles_shards,
            drop_last=o.drops_last,
            resampled=o.resampled,
            epoch_batches=o.epoch_batches,
            cover=o.covers,
        )

    def num_samples(self, *, rank: int, world: int, num_workers: int) -> int | None:
        """Samples this rank yields per epoch (None: unknown, the shards come without counts)."""
        counts, B = self.shards.counts, self.options.batch_size
        plans = self.plans(rank=rank, world=world, num_workers=num_workers)
        if counts is None or any(p.batches is None for p in plans):
            return None
        if self.options.resampled:
            return sum((p.batches or 0) * B for p in plans)
        return sum(
            max(0, min(sum(counts[i] for i in p.shards), (p.skip + (p.batches or 0)) * B) - p.skip * B) for p in plans
        )

    def prepare(self, *, rank: int, world: int, num_workers: int) -> None:
        """Plan now (an impossible plan, or one that ``drop_last`` leaves empty, fails here, not inside a
        worker); note the first sample's dataset."""
        plans = self.plans(rank=rank, world=world, num_workers=num_workers)
        counts = self.shards.counts
        if counts is not None:
            largest = max((sum(counts[i] for i in p.shards) for p in plans), default=0)
            self.refuse_empty_epoch(sum(counts), largest, rank=rank, world=world, num_workers=num_workers, per="worker")
        if not self.options.allow_mixed and len(self.shards):  # every worker compares its samples with it
            try:
                self.expect = first_identity(self.shards.urls[0])
            except ShardError:  # reading it fails again in the worker that owns it, with on_error applied
                self.expect = None

    def _batches(self, stream: SampleStream, plan: WorkerPlan, rng: np.random.Generator, epoch: int) -> Iterator[Batch]:
        """At most ``plan.batches`` collated batches; a short last one only without ``drop_last``."""
        B = self.options.batch_size
        limit = plan.batches
        need = None if limit is None else (plan.skip + limit) * B
        groups = stream.groups(stream.samples(plan, rng, need), rng)
        if limit == 0:
            return
        for _ in range(plan.skip):  # a resumed epoch: the batches yielded before the stop, drawn again, not made
            if next(groups, None) is None:
                return
        made = 0
        for group in groups:
            if len(group) < B and self.options.drops_last:
                return
            S = stream.shape[0] if stream.shape is not None else 0
            # collated before the group's rows are reused
            yield self.collate([s.key for s in group], [s.label for s in group], epoch, Views(group), S)
            made += 1
            if made == limit:  # stop before reading on: the next group would be read for nothing
                return

    def epoch_batches(self, where: WorkerInfo, epoch: int) -> Iterator[Batch]:
        """This worker's batches of ``epoch``: its shards' samples; an error (or, skipping, a warning)
        when damage leaves it short of its planned batches."""
        o = self.options
        rank, world, worker, num_workers = where
        plan = self.plans(rank=rank, world=world, num_workers=num_workers, epoch=epoch)[worker]
        rest = self.resumed(epoch)
        base = rest.base if isinstance(rest, StreamReplay) else rest
        resumed = [1] if base is not None else []  # a fresh shuffle for the rest of an elastically resumed epoch
        stream_of = worker if plan.stream is None else plan.stream  # the worker whose stream it replays
        rng = np.random.default_rng([o.seed, epoch, rank, stream_of, 0x5B, *resumed])
        stream = SampleStream(self.shards.urls, o, expect=self.expect)
        made = 0
        for batch in self._batches(stream, plan, rng, epoch):
            made += 1
            yield batch
        if plan.batches is None or made >= plan.batches:
            return
        if o.on_error == "raise":
            raise ShardError(
                f"rank {rank} worker {worker}: read {made} of {plan.batches} planned batches from "
                f"{len(plan.shards)} shards; the index's sample counts do not match the shards "
                f"(re-convert, or check with wds-tools verify)"
            )
        if world > 1 and not o.covers:  # in training the other ranks would wait for the missing batches for ever
            raise ShardError(
                f"rank {rank} worker {worker}: {made} of {plan.batches} planned batches after "
                f"skipping damaged shards, even with {len(plan.spares)} spare shards; every rank "
                f"must yield the same number (repair the shards: wds-tools verify names them)"
            )
        log.warning("worker %d: %d of %d planned batches: damaged shards were skipped", worker, made, plan.batches)
