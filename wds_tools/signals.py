"""SIGINT and SIGTERM for the command line: both end a command the same way, by an exception that
unwinds its clean-up (the pool stopped, the lock released), then a one-line message and exit
128 + the signal's number (130 for SIGINT, 143 for SIGTERM, what SLURM sends on preemption).

The handlers are installed before anything else is imported (``python -m wds_tools``), so a
signal at any point, even during the imports, ends the same way. Only the first signal raises: a
second one while the clean-up runs is noted and let go, so the clean-up (bounded: see
``convert.runner.LocalRunner.close``) is not cut short half way.
"""

from __future__ import annotations

import signal
from types import FrameType

__all__ = ["Interrupted", "install", "received", "exit_code", "SIGNALS"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that interrupt a run cleanly."""

_received: list[int] = []


class Interrupted(BaseException):
    """A SIGINT or SIGTERM reached the command (a BaseException, like KeyboardInterrupt, so no
    ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _handler(signum: int, frame: FrameType | None) -> None:
    first = not _received
    _received.append(signum)
    if first:
        raise Interrupted(signum)


def install() -> None:
    """Make SIGINT and SIGTERM raise ``Interrupted`` (the first one; later ones are only noted)."""
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def received() -> int | None:
    """The first signal received since ``install``, or None."""
    return _received[0] if _received else None


def exit_code(signum: int) -> int:
    """The shell's exit status of a command ended by ``signum``: 128 + its number."""
    return 128 + int(signum)
