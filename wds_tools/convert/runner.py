"""Run work in-process or on a spawn process pool, with progress messages from the workers."""

from __future__ import annotations

import os
import queue as queue_mod
import signal
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context

from ..format.cpus import usable_cpus

__all__ = ["Runner", "RayRunner", "make_runner", "report_progress", "orphaned", "usable_cpus", "EXECUTORS"]

EXECUTORS = ("local", "ray")

_progress: Callable[[int], None] | None = None
_parent_pid: int | None = None


def report_progress(n: int) -> None:
    """Called by work functions: n more items done (a no-op when nobody listens)."""
    if _progress is not None:
        _progress(n)


def orphaned() -> bool:
    """True in a pool worker whose parent has died (kill -9): stop rather than race a rerun."""
    return _parent_pid is not None and os.getppid() != _parent_pid


def _init_worker(q) -> None:
    global _progress, _parent_pid
    _progress = q.put
    _parent_pid = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _noop() -> None:
    """Submitted once per worker so the pool starts every process up front."""


def make_runner(executor: str, workers: int | None, ray_address: str | None = None):
    """A Runner for ``executor`` ("local" or "ray")."""
    if executor == "ray":
        return RayRunner(workers, ray_address)
    return Runner(workers or 1)


class Runner:
    """Calls functions in-process (workers=1) or in a spawn process pool."""

    streams_progress = True  # work functions' report_progress() calls reach on_progress

    def __init__(self, workers: int):
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self.queue = None
        if workers > 1:
            ctx = get_context("spawn")
            self.queue = ctx.Queue()
            self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                            initargs=(self.queue,))
            # The pool spawns a process only when a task finds no idle one; start them all now,
            # while the source is scanned, instead of one by one during the first shards.
            for _ in range(workers):
                self.pool.submit(_noop)

    def map(self, fn, args_list: list[tuple], on_progress: Callable[[int], None],
            on_result: Callable[[int, object], None]) -> None:
        """Call fn(*args) for each, at most 2 x workers in flight; results in completion order."""
        global _progress
        if self.pool is None:
            _progress = on_progress
            try:
                for i, args in enumerate(args_list):
                    on_result(i, fn(*args))
            finally:
                _progress = None
            return
        todo = iter(enumerate(args_list))
        running: dict[Future, int] = {}

        def fill() -> None:
            while len(running) < 2 * self.workers:
                nxt = next(todo, None)
                if nxt is None:
                    return
                running[self.pool.submit(fn, *nxt[1])] = nxt[0]

        fill()
        while running:
            done, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
            self._drain(on_progress)
            for fut in done:
                i = running.pop(fut)
                on_result(i, fut.result())
            fill()
        self._drain(on_progress)

    def _drain(self, on_progress: Callable[[int], None]) -> None:
        while True:
            try:
                on_progress(self.queue.get_nowait())
            except queue_mod.Empty:
                return

    def close(self, cancel: bool = False) -> None:
        if self.pool is None:
            return
        if cancel:  # interrupted: stop the workers now instead of letting their shards finish
            for proc in list(getattr(self.pool, "_processes", {}).values()):
                proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=cancel)
        self.pool = None


class RayRunner:
    """Calls functions as Ray tasks on whatever cluster ``ray.init`` reaches.

    Progress follows completed tasks: Ray workers have no channel back for per-item messages.
    """

    streams_progress = False

    def __init__(self, workers: int | None, address: str | None = None):
        try:
            import ray
        except ImportError:
            from ..errors import ExtraNotInstalledError

            raise ExtraNotInstalledError("--executor ray needs Ray, an optional extra: pip install 'wds-tools[ray]'") from None
        import logging

        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            ray.init(address=address, num_cpus=workers if address is None else None,
                     include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, min(workers, cpus) if workers else cpus)
        self._running: dict = {}

    def map(self, fn, args_list: list[tuple], on_progress: Callable[[int], None],
            on_result: Callable[[int, object], None]) -> None:
        ray = self._ray
        remote = ray.remote(num_cpus=1, max_retries=2)(fn)
        todo = iter(enumerate(args_list))
        running = self._running
        while True:
            while len(running) < 2 * self.workers:
                nxt = next(todo, None)
                if nxt is None:
                    break
                running[remote.remote(*nxt[1])] = nxt[0]
            if not running:
                return
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.2)
            for ref in done:
                on_result(running.pop(ref), ray.get(ref))

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in list(self._running):
                self._ray.cancel(ref, force=True)
        self._running.clear()
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns = False
