"""Main side of writing: run a conversion's pending shards on the runner.

With the local pool every shard is cut into small batches of samples, the batches of all shards
are decoded across every worker in plan order, whatever the number of shards, and this process
appends them to their shard in plan order, one shard at a time: each tar is written whole, in
order, byte-identical to a one-process run. At most ``4 x workers + 2`` batches (of at most 8 MiB
of pixels each) are started and not yet appended, so decoded pixels never pile up. On Ray each shard is one task (``write_shard``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from . import write
from .runner import BatchRunner, Runner
from .write import ShardTask

__all__ = ["batch_size", "write_shards"]

_MAX_BATCH = 16  # samples: small enough that the last batches spread over the workers
_BATCH_BYTES = 8 << 20  # pixels per batch at most (large --size): bounds memory per batch


def batch_size(remaining: int, workers: int, sample_bytes: int) -> int:
    """Samples in the next batch: a quarter of each worker's share of what remains (guided
    scheduling: large batches first, single samples at the end, so no worker waits long for the
    last ones), at most 16 samples and 8 MiB of pixels."""
    return max(1, min(_MAX_BATCH, _BATCH_BYTES // max(1, sample_bytes), math.ceil(remaining / (4 * workers))))


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
    if not isinstance(runner, BatchRunner):  # Ray: one task per shard

        def done(i: int, meta: dict) -> None:
            on_done(tasks[i], meta)
            on_samples(len(tasks[i].samples))

        runner.map(write.write_shard, [(t,) for t in tasks], lambda n: None, done)
        return
    per_sample = sum(side * side * 3 for side in {tasks[0].side, *(side for side, _ in tasks[0].spill)})
    pieces = _pieces(tasks, runner.workers, per_sample)
    # each call gets only its slice of the shard: a whole shard's sample list per batch costs pickling
    calls = ((replace(t, samples=t.samples[lo:hi]), 0, hi - lo) for t, lo, hi in pieces)
    shard: write.ShardAssembler | None = None
    try:
        for (t, lo, hi), enc in zip(pieces, runner.ordered(write.encode_batch, calls, lambda n: None)):
            if lo == 0:
                shard = write.open_shard(t)
            assert shard is not None  # a shard's batches come in order, its first opens it
            shard.append(enc)
            on_samples(hi - lo)
            if hi == len(t.samples):
                meta, shard = shard.finish(), None
                on_done(t, meta)
    except BaseException:
        if shard is not None:
            shard.abort()
        raise
