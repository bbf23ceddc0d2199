"""Threads: the index reader's workers as threads of the main process, where they only copy.

Without CPU augmentation (eval, ``device_augment``) a worker of the index reader spends its time
in memory copies from the shard mappings, which release the GIL; as threads the workers need no
process start, no shared-memory hand-over and no per-batch messages between processes (on two
cores these cost more than the copies). Worker ``w`` of ``W`` makes batches ``w, w + W, ...`` of
the epoch plan, as a DataLoader worker process would, into its own buffers; batches are yielded
in plan order.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

__all__ = ["in_threads", "JOIN_TIMEOUT"]

_END = object()
JOIN_TIMEOUT = 10.0


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def in_threads(makers: list[Callable[[], Iterator]], depth: int, threads: list[threading.Thread] | None = None
               ) -> Iterator:
    """Items of ``makers[w]()`` for each ``w``, each run in its own thread ``depth`` items ahead,
    taken round-robin (a worker that has ended is passed over). An exception in a thread is raised
    here; when the caller stops early, the threads stop at their next item and are waited for
    (up to ``JOIN_TIMEOUT`` s). ``threads``: a list the threads are added to, for the caller to
    see whether they are still running."""
    empty = queue.Empty  # bound now: a generator closed at interpreter exit may find the module gone
    stop = threading.Event()
    queues = [queue.Queue(depth) for _ in makers]

    def put(q: queue.Queue, item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run(make: Callable[[], Iterator], q: queue.Queue) -> None:
        try:
            for item in make():
                if not put(q, item):
                    return
            put(q, _END)
        except BaseException as e:  # noqa: BLE001 - handed to the consuming thread, raised there
            put(q, _Failed(e))

    started = [threading.Thread(target=run, args=(m, q), daemon=True, name=f"training_adapter-reader-{w}")
               for w, (m, q) in enumerate(zip(makers, queues))]
    if threads is not None:
        threads += started
    for t in started:
        t.start()
    live = list(range(len(makers)))
    try:
        j = 0
        while live:
            w = live[j % len(live)]
            item = queues[w].get()
            if item is _END:
                live.remove(w)
                continue
            if isinstance(item, _Failed):
                raise item.error
            yield item
            j = live.index(w) + 1
    finally:
        stop.set()
        for q in queues:  # let go of the batches made ahead, and unblock a thread waiting to put
            while True:
                try:
                    q.get_nowait()
                except empty:
                    break
        for t in started:  # each finishes the item it is making, at most
            t.join(JOIN_TIMEOUT)
