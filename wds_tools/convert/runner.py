"""Run work in-process, on a process pool (plus the calling process) or on Ray."""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Runner",
    "BatchRunner",
    "PoolRunner",
    "LocalRunner",
    "RayRunner",
    "make_runner",
    "orphaned",
    "shared_memory",
    "EXECUTORS",
]

EXECUTORS = ("local", "ray")
"""The values of ``executor``."""


@runtime_checkable
class Runner(Protocol):
    """Runs a work function over argument tuples, on ``workers`` processes or cluster CPUs."""

    workers: int

    def map(
        self,
        fn: Callable[..., Any],
        args_list: list[tuple],
        on_result: Callable[[int, Any], None],
    ) -> None:
        """Call fn(*args) for each; ``on_result(i, result)`` as each finishes."""

    def close(self, cancel: bool = False) -> None:
        """Stop the workers: after their calls finish, or at once with ``cancel``."""


@runtime_checkable
class BatchRunner(Runner, Protocol):
    """A runner whose results stream back in order, so the converter hands it small batches of
    samples rather than whole shards (see schedule.py)."""

    def ordered(
        self,
        fn: Callable[..., Any],
        args_iter: Iterable[tuple],
        window: int | None = None,
    ) -> Iterator[Any]:
        """Yield fn(*args) for each args, in order."""


@runtime_checkable
class PoolRunner(BatchRunner, Protocol):
    """A runner whose calls can be started one by one and that may share memory with its workers
    (the converter's writing, schedule.py)."""

    shared: mmap.mmap | None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Start fn(*args) on a worker."""


_parent_pid: int | None = None
_shared: mmap.mmap | None = None


def orphaned() -> bool:
    """True in a pool worker whose parent has died (kill -9): stop rather than race a rerun."""
    return _parent_pid is not None and os.getppid() != _parent_pid


def shared_memory() -> mmap.mmap | None:
    """In a pool worker: the memory it shares with the process that made the pool (``LocalRunner.shared``);
    None in any other process, or where the pool was spawned."""
    return _shared


def _init_worker(parent: int, shared: mmap.mmap | None = None) -> None:
    global _parent_pid, _shared
    _parent_pid = parent
    _shared = shared
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # a forked worker inherits the CLI's SIGTERM handler (wds_tools.signals); a worker must die of
    # SIGTERM (the pool's own terminate() sends it), not unwind the parent's clean-up in its copy
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A worker must not outlive a parent killed with -9: an idle one blocks reading its task queue,
    # and it would hold the caller's stdout/stderr open (a script reading them to EOF would hang),
    # and keep the resource tracker (spawn) alive, which waits for every holder of its pipe.
    _die_with_parent()
    _detach_stdio()
    if orphaned():  # the parent died before the lines above took effect
        os._exit(1)
    threading.Thread(target=_exit_when_orphaned, daemon=True).start()  # where prctl is missing


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this process when its parent dies (PR_SET_PDEATHSIG).

    The signal follows the thread that forked the worker; the pool forks from the thread that
    creates the Runner or submits to it, the main thread of the converter, which lives as long
    as its process.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # the watchdog thread still ends the worker within 0.2 s


def _detach_stdio() -> None:
    """Point the worker's stdin, stdout and stderr at /dev/null, so that no worker, even one that
    lingers (stuck in the kernel, say), keeps the caller's pipes open. A worker reports through its
    results: an exception comes back to the parent, which prints it; a crash breaks the pool, which
    the parent reports."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in (0, 1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def _exit_when_orphaned() -> None:
    while not orphaned():
        time.sleep(0.2)
    os._exit(1)


_DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Defer SIGINT and SIGTERM while the pool forks its workers: one that comes meanwhile is noted,
    and raised again, to the handler in place before, once the forks are done. That handler
    (wds_tools.signals) raises, and a fork runs the interpreter's at-fork callbacks (logging's, for
    one) in this process: an exception raised there is printed as "Exception ignored" and lost, and
    the command would go on (a torture trial's SIGTERM at 0.76 s did so). Masking the signals would
    not do: numpy's native threads, which do not mask them, would take them."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; it also runs them
        return
    came: list[int] = []
    before = {sig: signal.getsignal(sig) for sig in _DEFERRED}
    for sig, handler in before.items():
        if handler is not None:  # None: set outside Python, left alone
            signal.signal(sig, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)
        if came:
            signal.raise_signal(came[0])


def _noop() -> None:
    """Submitted once per worker so the pool starts every process up front."""


def _start_method() -> str:
    """ "fork" where it is safe and cheap, else "spawn".

    A forked worker is ready in ~10 ms with everything imported; a spawned one needs ~0.3-0.5 s
    of imports, which a run of a few dozen photos feels. Forking is safe only while this process
    has no other thread (one could hold a lock the child inherits locked), and only on Linux
    (macOS frameworks are not fork-safe). The pool forks all its processes at once, before its
    own manager thread starts.
    """
    return "fork" if sys.platform == "linux" and threading.active_count() == 1 else "spawn"


def make_runner(executor: str, workers: int | None, ray_address: str | None = None, shared_bytes: int = 0) -> Runner:
    """A Runner for ``executor`` ("local" or "ray"); ``shared_bytes``: see ``LocalRunner``."""
    if executor == "ray":
        return RayRunner(workers, ray_address)
    return LocalRunner(workers or 1, shared_bytes)


def _map_shared(nbytes: int) -> mmap.mmap | None:
    """Anonymous shared memory, inherited by the processes forked after it; None where the system refuses it.

    Only the pages touched take memory (a slot holds what its batch needs), and the kernel frees it
    with the last process that maps it, whichever way they end."""
    if nbytes <= 0:
        return None
    try:
        return mmap.mmap(-1, nbytes)
    except (OSError, ValueError, OverflowError):
        return None


class LocalRunner:
    """Calls functions in this process (``workers`` = 1), or on a pool of ``workers`` processes.

    With a pool this process only hands out work and takes the results (the converter writes them):
    a decode here would hold the next result for as long as it takes. A forked pool shares
    ``shared_bytes`` of memory with this process (``shared``; workers see it as ``shared_memory()``),
    where workers leave what is too large to send back through a pipe cheaply.
    """

    def __init__(self, workers: int, shared_bytes: int = 0) -> None:
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self.shared: mmap.mmap | None = None
        if workers > 1:
            method = _start_method()
            ctx = get_context(method)
            if method == "fork":  # a spawned worker would have to map it by name; it gets results by pipe
                self.shared = _map_shared(shared_bytes)
            self.pool = ProcessPoolExecutor(
                workers,
                mp_context=ctx,
                initializer=_init_worker,
                initargs=(os.getpid(), self.shared),
            )
            # The pool spawns a process only when a task finds no idle one; start them all now,
            # while the source is scanned, instead of one by one during the first shards.
            try:
                with _signals_deferred():
                    for _ in range(workers):
                        self.pool.submit(_noop)
            except BaseException:  # a signal deferred during the forks is raised here: stop the pool
                self.close(cancel=True)
                raise

    @property
    def window(self) -> int:
        """Calls started and not yet taken at most: results wait in memory only that far ahead."""
        return 4 * self.workers + 2

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Start fn(*args) on the pool."""
        if self.pool is None:
            raise RuntimeError("submit() needs a pool: workers > 1")
        return self.pool.submit(fn, *args)

    def map(
        self,
        fn: Callable[..., Any],
        args_list: list[tuple],
        on_result: Callable[[int, Any], None],
    ) -> None:
        """Call fn(*args) for each; on_result(i, result) in order."""
        for i, result in enumerate(self.ordered(fn, args_list)):
            on_result(i, result)

    def ordered(
        self,
        fn: Callable[..., Any],
        args_iter: Iterable[tuple],
        window: int | None = None,
    ) -> Iterator[Any]:
        """Yield fn(*args) for each args, in order.

        At most ``window`` calls (default ``self.window``) are started and not yet yielded, so
        results that finish early wait in memory only that far ahead of the one needed next.
        """
        todo = iter(args_iter)
        if self.pool is None:
            for args in todo:
                yield fn(*args)
            return
        window = max(2, window or self.window)
        running: dict[int, Future] = {}  # seq -> its call, started and not yet yielded
        next_seq = issued = 0
        exhausted = False
        while True:
            while not exhausted and issued - next_seq < window:
                call = next(todo, None)
                if call is None:
                    exhausted = True
                    break
                running[issued] = self.pool.submit(fn, *call)
                issued += 1
            if next_seq == issued:
                break
            fut = running.pop(next_seq)
            next_seq += 1
            yield fut.result()

    def close(self, cancel: bool = False) -> None:
        """Shut the pool down: after its calls finish, or at once with ``cancel``."""
        pool, self.pool = self.pool, None
        if pool is not None:
            if not cancel:
                pool.shutdown(wait=True)
            else:
                _stop(pool)
        shared, self.shared = self.shared, None
        if shared is not None:
            try:
                shared.close()
            except BufferError:  # a view of it is still held (an exception's frame): the last reference frees it
                pass


def _stop(pool: ProcessPoolExecutor, timeout: float = 5.0) -> None:
    """Stop ``pool`` now (interrupted, or a worker died), waiting at most about ``timeout`` seconds
    per step: never for a worker's call to finish.

    ``shutdown(wait=True)`` after killing workers can wait forever: a worker killed while it sends
    a result leaves the pool's manager thread reading half a message from the result pipe (2 of 15
    SIGINTs to the main pid alone hung so). With every worker gone, closing this process's own copy
    of that pipe's write end ends the read (EOF); the manager thread then finds the pool broken,
    closes the call queue's read end itself (CPython's gh-94777: its feeder thread may be blocked
    writing to a pipe nobody reads) and ends. This thread closes only the result pipe's write end,
    which the manager thread never touches: two threads closing one descriptor race (a torture
    trial saw the manager's close fail with EBADF after ours), and a descriptor closed twice may
    already belong to another file.
    """
    # the pool's internals, read before shutdown() drops them
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    result_writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    for proc in procs:
        proc.kill()  # SIGKILL: the workers ignore SIGINT, and their shards are redone on resume
    end = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, end - time.monotonic()))
    pool.shutdown(wait=False, cancel_futures=True)
    if result_writer is not None and not any(proc.is_alive() for proc in procs):
        result_writer.close()
    if manager is not None:
        manager.join(timeout)


class RayRunner:
    """Calls functions as Ray tasks on whatever cluster ``ray.init`` reaches.

    Progress follows completed tasks: Ray workers have no channel back for per-item messages.
    """

    # no ``ordered``: each shard is one task (a cluster's corpus has many more shards than CPUs, and
    # the pixels never travel through the driver)

    def __init__(self, workers: int | None, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            from ..errors import ExtraNotInstalledError, install_hint

            raise ExtraNotInstalledError(
                f"--executor ray needs Ray, an optional extra: {install_hint('ray')}"
            ) from None
        import logging

        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            ray.init(
                address=address,
                num_cpus=workers if address is None else None,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, min(workers, cpus) if workers else cpus)
        self._running: dict[Any, int] = {}

    def map(
        self,
        fn: Callable[..., Any],
        args_list: list[tuple],
        on_result: Callable[[int, Any], None],
    ) -> None:
        """Call fn(*args) for each as a Ray task; on_result(i, result) as each finishes."""
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
        """Cancel what still runs (``cancel``) and shut down the Ray instance this runner started."""
        if cancel:
            for ref in list(self._running):
                self._ray.cancel(ref, force=True)
        self._running.clear()
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns = False
