"""Threads: the index reader's workers as threads of the main process, where they only copy.

Copies release the GIL, and threads need no process start or hand-over; the calling thread makes
batches too rather than wait (why, on a shared 2-core VM: docs/guide/loader-internals.md, Workers).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["in_order"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class _State:
    """``in_order``'s bookkeeping, read and written under its condition variable."""

    started: int = 0  # tasks started
    taken: int = 0  # results the caller has taken
    end: int | None = None  # the number of tasks, once the task list has ended
    stop: bool = False  # the caller stopped


def in_order(
    tasks: Iterable[T], run: Callable[[int, T], R], workers: int, *, ahead: int, caller: bool = False
) -> Generator[R, None, None]:
    """``run(w, task)`` for every task, on ``workers`` background threads (``w``: 0 to workers - 1,
    so that each uses its own state) and, with ``caller``, in the calling thread too (``w`` =
    ``workers``) while the result it waits for is not ready. At most ``ahead`` tasks are started
    beyond the results the caller has taken; results in task order. An exception is raised here,
    in its turn. When the caller stops early, tasks not started are dropped and running ones
    waited for."""
    ahead = max(1, ahead)
    caller = caller or not workers  # without threads the caller runs every task
    it = iter(tasks)
    cv = threading.Condition()
    results: dict[int, tuple[bool, Any]] = {}  # task number -> (ok, result or exception)
    state = _State()

    def claim(limit: int) -> tuple[int, T] | None:
        """The next task and its number, if one may start below ``limit`` (under ``cv``)."""
        if state.stop or state.end is not None or state.started >= limit:
            return None
        try:
            task = next(it)
        except BaseException as e:  # the task list itself failed (or ended): no more tasks
            end = state.started
            if not isinstance(e, StopIteration):
                results[end] = (False, e)
                end += 1
            state.end = end
            cv.notify_all()
            return None
        state.started += 1
        return state.started - 1, task

    def do(w: int, got: tuple[int, T]) -> None:
        i, task = got
        out: tuple[bool, Any]
        try:
            out = (True, run(w, task))
        except BaseException as e:  # raised in the caller, in its turn
            out = (False, e)
        with cv:
            results[i] = out
            cv.notify_all()

    def background(w: int) -> None:
        while True:
            with cv:
                while (got := claim(state.taken + ahead)) is None:
                    if state.stop or state.end is not None:
                        return
                    cv.wait()
            do(w, got)

    threads = [
        threading.Thread(target=background, args=(w,), name=f"training_adapter-reader-{w}", daemon=True)
        for w in range(workers)
    ]
    for t in threads:
        t.start()
    try:
        i = 0
        while True:
            with cv:
                while i not in results:
                    got = claim(i + ahead) if caller else None
                    if got is not None:
                        break
                    if state.end is not None and i >= state.end:
                        return
                    cv.wait()
                else:
                    ok, out = results.pop(i)
                    state.taken = i = i + 1
                    cv.notify_all()
                    got = None
            if got is not None:  # nothing ready: make the next batch here rather than wait
                do(workers, got)
                continue
            if not ok:
                raise out
            yield out
    finally:
        with cv:
            state.stop = True
            cv.notify_all()
        for t in threads:
            t.join()
