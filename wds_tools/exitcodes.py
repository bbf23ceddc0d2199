"""The exit status of every ``wds-tools`` command, in one place (the table is docs/exit-codes.md).

``for_error`` maps an exception of the tree in ``errors`` to its status; the CLI uses it for every
error it reports, and a test checks the documented table against ``EXIT_CODES``.
"""

from __future__ import annotations

import signal
from enum import IntEnum

from .errors import OptionError, TooManyErrorsError, WdsToolsError
from .signals import exit_code

__all__ = ["ExitCode", "EXIT_CODES", "for_error"]


class ExitCode(IntEnum):
    """What a command's exit status means."""

    OK = 0
    ERROR = 1
    USAGE = 2
    DATA = 3
    INTERNAL = 4
    SIGINT = exit_code(signal.SIGINT)
    SIGTERM = exit_code(signal.SIGTERM)


# status -> when a command returns it (docs/exit-codes.md holds the same table; tests/test_cli_vocabulary.py compares)
EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "Done: the data is what was asked for (verify: no problem found).",
    ExitCode.ERROR: "The command could not do what was asked: a source, index or shard it cannot read, an "
    "output folder it may not write (another conversion holds it, read-only, full disk, made with other "
    "options), a missing extra. The message names the file and what to do.",
    ExitCode.USAGE: "An option, argument or wds-tools.toml key is wrong: unknown, missing, out of range, "
    "malformed, or contradicting another; a PATH or --source that does not exist.",
    ExitCode.DATA: "The command ran and the data fails: verify found a problem (or, with --no-leakage, "
    "near-duplicates across splits); convert stopped with more bad source files than --max-errors allows "
    "(the shards written are kept, no index.json).",
    ExitCode.INTERNAL: "An unexpected error (a bug in wds-tools): the traceback is printed; please report it.",
    ExitCode.SIGINT: "Interrupted by SIGINT (Ctrl-C): clean-up done; run the same command again to resume.",
    ExitCode.SIGTERM: "Ended by SIGTERM (a scheduler's preemption): as SIGINT.",
}
"""Each exit status and when a command returns it: the table of docs/exit-codes.md."""


def for_error(e: WdsToolsError) -> ExitCode:
    """The exit status of a command that stops with ``e``."""
    if isinstance(e, OptionError):
        return ExitCode.USAGE
    if isinstance(e, TooManyErrorsError):
        return ExitCode.DATA
    return ExitCode.ERROR
