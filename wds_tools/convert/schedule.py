"""Main side of writing: run a conversion's pending shards on the runner.

The local pool encodes small batches of all shards across the workers in plan order, in memory it
shares with this process, which places the fragments and moves no pixel; on Ray, and with one worker,
``write.write_shard`` writes whole shards (docs/guide/converter-internals.md, "One write path, two drivers").
"""

from __future__ import annotations

import math
import queue
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import NamedTuple

from . import fragment, write
from .fragment import SLOT_BYTES
from .runner import BatchRunner, PoolRunner, Runner
from .shard import SealJob, ShardAssembler, seal_shard
from .write import Encoded, ShardTask

__all__ = ["batch_size", "write_shards", "shared_bytes"]

_MAX_BATCH = 32  # samples: small enough that the last batches spread over the workers, large enough that a
# batch's call costs this process little (a call to a pool worker costs it ~0.2-0.6 ms of CPU on the 2-core VM)
_BATCH_BYTES = 8 << 20  # pixels per batch at most (large --size): bounds memory per batch


def batch_size(remaining: int, workers: int, sample_bytes: int) -> int:
    """Samples in the next batch: a quarter of each worker's share of what remains (guided
    scheduling: large batches first, single samples at the end, so no worker waits long for the
    last ones), at most 32 samples and 8 MiB of pixels."""
    return max(1, min(_MAX_BATCH, _BATCH_BYTES // max(1, sample_bytes), math.ceil(remaining / (4 * workers))))


def window(workers: int) -> int:
    """Batches handed to a pool of ``workers`` and not yet placed, at most: one running and one waiting
    per worker, and two more."""
    return 2 * workers + 2


def shared_bytes(workers: int) -> int:
    """The memory a pool of ``workers`` shares with this process for fragments: two slots per batch of
    the window, one for a batch being encoded, one for a placed batch being written (only the pages a
    batch fills are ever used)."""
    return 2 * window(workers) * SLOT_BYTES if workers > 1 else 0


def _pieces(tasks: list[ShardTask], workers: int, sample_bytes: int) -> list[tuple[ShardTask, int, int]]:
    """(task, start, stop) of every batch, in plan order; a batch never spans two shards."""
    remaining = sum(len(t.samples) for t in tasks)
    pieces = []
    for t in tasks:
        lo = 0
        while lo < len(t.samples):
            hi = min(len(t.samples), lo + batch_size(remaining, workers, sample_bytes))
            pieces.append((t, lo, hi))
            remaining -= hi - lo
            lo = hi
    return pieces


def write_shards(
    tasks: list[ShardTask],
    runner: Runner,
    on_done: Callable[[ShardTask, dict], None],
    on_samples: Callable[[int], None],
) -> None:
    """Write ``tasks`` (in plan order); ``on_done(task, meta)`` as each shard is finished."""
    if not tasks:
        return
    per_sample = sum(side * side * 3 for side in {tasks[0].side, *(side for side, _ in tasks[0].spill)})
    if not isinstance(runner, BatchRunner):  # Ray: one task per shard

        def done(i: int, meta: dict) -> None:
            on_done(tasks[i], meta)
            on_samples(len(tasks[i].samples))

        runner.map(write.write_shard, [(t,) for t in tasks], done)
    elif isinstance(runner, PoolRunner) and runner.workers > 1:
        _Pooled(_pieces(tasks, runner.workers, per_sample), runner, on_done, on_samples).run()
    else:  # one process, shard by shard
        for t in tasks:
            on_done(t, write.write_shard(t, batch_size(len(t.samples), 1, per_sample), on_samples))


class _Shard:
    """A shard being written by the pool: its assembler, and its byte ranges still being written."""

    def __init__(self, assembler: ShardAssembler) -> None:
        self.assembler = assembler
        self.writing = 0  # placed batches whose bytes are not written yet
        self.job: SealJob | None = None  # set once every batch is placed and the tar's end written


class _Pooled:
    """The pool's writing loop: batches out to the workers; their fragments placed in plan order and
    written by workers where the bytes sit in shared memory (else here); each shard whose bytes are
    all written sealed by a worker, then completed here.

    A placed fragment's write rides on the next batch handed out (``encode_after_writes``: one call
    to a worker for both; a call costs this process about as much as a sample's bytes do), or goes
    alone when no batch is handed out meanwhile."""

    def __init__(
        self,
        pieces: list[tuple[ShardTask, int, int]],
        runner: PoolRunner,
        on_done: Callable[[ShardTask, dict], None],
        on_samples: Callable[[int], None],
    ) -> None:
        self.pieces, self.runner, self.on_done, self.on_samples = pieces, runner, on_done, on_samples
        self.window = window(runner.workers)
        shared = runner.shared
        self.free = list(range(len(shared) // SLOT_BYTES))[::-1] if shared is not None else []
        self.finished: queue.SimpleQueue[Future] = queue.SimpleQueue()  # futures, as they finish
        self.batches: dict[Future, int] = {}  # running batch -> its piece
        self.ready: dict[int, Encoded] = {}  # piece -> its result, waiting for the pieces before it
        self.slot_of: dict[int, int] = {}  # piece -> the slot it was given, until it is placed
        self.unwritten: list[_Write] = []  # placed, not yet handed to a worker
        self.writes: dict[Future, list[_Write]] = {}  # a call -> the writes it does
        self.seals: dict[Future, _Shard] = {}
        self.open: _Shard | None = None  # the shard whose batches are being placed
        self.unsealed: list[_Shard] = []  # placed whole, bytes still being written
        self.issued = self.placed = 0
        self.bare = {id(t): replace(t, samples=()) for t, _, _ in pieces}  # each shard task without its samples

    def _call(self, fn: Callable, *args: object) -> Future:
        future = self.runner.submit(fn, *args)
        future.add_done_callback(self.finished.put)
        return future

    def _issue(self) -> None:
        """Start batches while the window allows (and a slot is free, where there is shared memory),
        each with the writes placed since; the writes left go alone."""
        shared = self.runner.shared is not None
        while self.issued < len(self.pieces) and self.issued - self.placed < self.window:
            if shared and not self.free:
                break  # every slot holds bytes not yet written
            slot = self.free.pop() if shared else None
            if slot is not None:
                self.slot_of[self.issued] = slot
            t, lo, hi = self.pieces[self.issued]
            writes, self.unwritten = self.unwritten, []
            # each call gets only its samples, as tuples: a whole shard's sample list per batch costs pickling
            fut = self._call(
                write.encode_after_writes,
                [(w.slot, w.ranges) for w in writes],
                self.bare[id(t)],
                write.pack_samples(t.samples[lo:hi]),
                slot,
            )
            self.batches[fut] = self.issued
            if writes:
                self.writes[fut] = writes
            self.issued += 1
        if self.unwritten:
            writes, self.unwritten = self.unwritten, []
            self.writes[self._call(fragment.write_slots, [(w.slot, w.ranges) for w in writes])] = writes

    def _place_ready(self) -> None:
        """Place the results that are next in plan order; their bytes are written by a worker."""
        while self.placed in self.ready:
            enc = self.ready.pop(self.placed)
            t, lo, hi = self.pieces[self.placed]
            if lo == 0:
                self.open = _Shard(write.open_shard(t))
            shard = self.open
            assert shard is not None  # a shard's batches come in order, its first opens it
            slot = self.slot_of.pop(self.placed, None)
            if enc.slot is not None:
                assert slot == enc.slot  # a worker uses the slot it was given or none
                shard.writing += 1
                self.unwritten.append(_Write(shard, enc.slot, shard.assembler.place(enc), hi - lo))
            else:  # the bytes came back with the result (too large for a slot, or no shared memory)
                shard.assembler.append(enc)
                if slot is not None:
                    self.free.append(slot)
                self.on_samples(hi - lo)
            self.placed += 1
            if hi == len(t.samples):
                shard.job = shard.assembler.end()  # may fail (a full disk): the shard is still open then
                self.unsealed.append(shard)
                self.open = None
                self._seal_if_written(shard)

    def _written(self, writes: list[_Write]) -> None:
        for w in writes:
            self.free.append(w.slot)
            w.shard.writing -= 1
            self.on_samples(w.samples)
            self._seal_if_written(w.shard)

    def _seal_if_written(self, shard: _Shard) -> None:
        if shard.job is not None and not shard.writing:
            self.unsealed.remove(shard)
            self.seals[self._call(seal_shard, shard.job)] = shard

    def run(self) -> None:
        """Write every piece's shard; on any exception stop the workers first, then remove what is unfinished."""
        try:
            while True:
                self._place_ready()
                self._issue()
                if self.placed == len(self.pieces) and not (self.writes or self.seals or self.unsealed):
                    return
                try:
                    fut = self.finished.get(timeout=0.2)
                except queue.Empty:
                    continue
                result = fut.result()  # raises what the call raised
                if fut in self.writes:
                    self._written(self.writes.pop(fut))
                if fut in self.batches:
                    self.ready[self.batches.pop(fut)] = result
                elif fut in self.seals:
                    shard = self.seals.pop(fut)
                    assert shard.job is not None  # sealed after its end
                    self.on_done(shard.assembler.task, shard.assembler.complete(shard.job, result))
        except BaseException:
            # workers may still write into a shard's files (a seal renames them): stop the pool, then clean up
            self.runner.close(cancel=True)
            for shard in {
                id(s): s for s in [self.open, *self.unsealed, *self.seals.values()] if s is not None
            }.values():
                shard.assembler.abort()
            raise


class _Write(NamedTuple):
    """A placed fragment's bytes, to be written by a worker."""

    shard: _Shard
    slot: int
    ranges: fragment.Ranges
    samples: int
