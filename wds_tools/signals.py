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

__all__ = [
    "Interrupted",
    "install",
    "received",
    "exit_code",
    "interruption",
    "reraise_interruption",
    "signal_behind",
    "SIGNALS",
]

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


def interruption(exc: BaseException) -> Interrupted | None:
    """The ``Interrupted`` that ``exc`` was raised while unwinding from, if any.

    A clean-up that fails because a signal cut the work short (a zip member's handle left open when
    the signal came inside its ``close``, so the archive's own ``close`` raises ValueError) raises a
    new exception whose ``__context__`` chain holds the ``Interrupted``: that error is the signal's
    consequence, and the command ends as interrupted, not as a bug."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, Interrupted):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def reraise_interruption(exc: BaseException) -> None:
    """Raise the ``Interrupted`` behind ``exc`` (see ``interruption``), if any: an ``except Exception``
    that turns errors into a result (a file that does not decode, a cache that does not read) calls it
    first, so a signal that surfaced as such an error still stops the command."""
    found = interruption(exc)
    if found is not None:
        raise found


def signal_behind(exc: BaseException) -> int | None:
    """The signal a command's error is the consequence of, if any: the ``Interrupted`` in its chain
    (``interruption``), else one already received (a worker that died of the group's SIGTERM broke the
    pool before this process's own handler ran)."""
    found = interruption(exc)
    return found.signum if found is not None else received()
