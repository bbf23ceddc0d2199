"""Progress on stderr for every command: a tqdm bar on a terminal, plain lines anywhere else.

A bar redraws itself with carriage returns, which a log file or a CI page keeps as noise; off a
terminal ``progress`` prints whole lines instead: one when another tenth is done (at most one per
``MIN_SECONDS``, so a short job is not a page of lines) or ``LINE_SECONDS`` have passed, and a last
one when the work ends. Used by ``convert`` and ``verify``; ``Delayed`` shows only work that runs past a few
seconds (the near-duplicate search, the report).
"""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

__all__ = ["Progress", "progress", "Delayed", "LINE_SECONDS", "MIN_SECONDS"]

LINE_SECONDS = 30.0
"""Off a terminal: a progress line at least this often (seconds) while work goes on."""
MIN_SECONDS = 1.0
"""Off a terminal: a line at each new tenth done, but not sooner than this (seconds) after the last."""


class Progress(Protocol):
    """What a command uses of its progress display."""

    def update(self, n: int = 1) -> None:
        """Count ``n`` more items done."""

    def __enter__(self) -> Progress: ...

    def __exit__(self, *exc: object) -> None: ...


class _Silent:
    """No display (``--quiet``, or a library caller that asked for none); tqdm is not even imported."""

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int = 1) -> None:
        """Nothing to count."""


class _Lines:
    """Plain periodic lines: ``convert 224: 120/300 img (40%), 2.1 s, 57 img/s``."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO, every: float) -> None:
        self.total, self.desc, self.unit, self.stream, self.every = total, desc, unit, stream, every
        self.done = 0
        self.t0 = self.last = time.perf_counter()
        self.tenth = 0  # tenths of the total reported so far

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None and self.total and self.tenth < 10:  # the end, unless the 100% line was the last
            self.tenth = 10
            self._line()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more; print a line at each new tenth, or when ``every`` seconds passed since the last."""
        self.done += n
        now = time.perf_counter()
        tenth = 10 * self.done // self.total if self.total else 0
        if (tenth > self.tenth and now - self.last >= MIN_SECONDS) or now - self.last >= self.every:
            self.tenth = max(self.tenth, tenth)
            self._line(now)

    def _line(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        self.last = now
        seconds = now - self.t0
        share = f" ({100 * self.done // self.total}%)" if self.total else ""
        rate = f", {self.done / seconds:,.0f} {self.unit}/s" if seconds > 0 else ""
        self.stream.write(f"{self.desc}: {self.done:,}/{self.total:,} {self.unit}{share}, {seconds:.1f} s{rate}\n")
        self.stream.flush()


def progress(
    total: int, desc: str, unit: str, *, enabled: bool = True, stream: TextIO | None = None, every: float = LINE_SECONDS
) -> Progress:
    """The progress display of ``total`` items on ``stream`` (default: stderr): a tqdm bar on a
    terminal, plain lines (``_Lines``) elsewhere, nothing when not ``enabled``."""
    if not enabled:
        return _Silent()
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return _Lines(total, desc, unit, stream, every)
    from tqdm import tqdm  # imported only for a bar: importing tqdm alone costs ~0.1 s

    return tqdm(total=total, desc=desc, unit=unit, smoothing=0.1, dynamic_ncols=True, leave=True, file=stream)


class Delayed:
    """Counts ``total`` steps, one per call, and from ``after`` seconds on shows them (``progress``): work
    that usually ends sooner prints nothing. ``close`` ends the display if one was shown."""

    def __init__(self, total: int, desc: str, unit: str, *, enabled: bool, after: float) -> None:
        self.total, self.desc, self.unit, self.enabled, self.after = total, desc, unit, enabled, after
        self.done = 0
        self.t0 = time.perf_counter()
        self.bar: Progress | None = None

    def __call__(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled and time.perf_counter() - self.t0 >= self.after:
            bar = progress(self.total, self.desc, self.unit).__enter__()
            bar.update(self.done)
            self.bar = bar

    def close(self) -> None:
        """End the display, if one was shown."""
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
