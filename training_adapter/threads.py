"""Threads: the index reader's workers as threads of the main process, where they only copy.

Without CPU augmentation (eval, ``device_augment``) the index reader spends its time in memory
copies from the shard mappings, which release the GIL; in threads it needs no process start, no
shared-memory hand-over and no per-batch messages between processes (on two cores these cost more
than the copies). One reader thread plans and checks the batches in plan order (``in_order``),
and ``num_workers`` helper threads copy each batch, split between them: one batch at a time on
every core keeps the memory being written small; on two cores a batch per thread at once copied
slower than one thread alone (FFCV parallelises within a batch too).
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["in_order"]

T = TypeVar("T")
R = TypeVar("R")


def in_order(tasks: Iterable[T], run: Callable[[int, T], R], workers: int, *, ahead: int) -> Iterator[R]:
    """``run(w, task)`` for every task, on ``workers`` threads (``w``: the thread's number, 0 to
    workers - 1, so that each uses its own state), at most ``ahead`` tasks started before the
    caller takes their results; results in task order. An exception is raised here, in order.
    When the caller stops early, tasks not started are dropped and running ones waited for."""
    local = threading.local()
    numbers = itertools.count()

    def call(task: T) -> R:
        w = getattr(local, "w", None)
        if w is None:
            w = local.w = next(numbers)  # atomic: each pool thread gets its own number
        return run(w, task)

    pool = ThreadPoolExecutor(workers, thread_name_prefix="training_adapter-reader")
    pending: collections.deque = collections.deque()
    try:
        for task in tasks:
            pending.append(pool.submit(call, task))
            if len(pending) >= max(1, ahead):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
