"""The ``wds-tools`` command's entry point (the console script and ``python -m wds_tools``).

The SIGINT/SIGTERM handlers go in before the command line's modules are imported, so a signal
during those imports (a few hundred milliseconds: click, numpy, the converter) ends the same way
as one later: one line and exit 128 + the signal. Only the interpreter's own start-up, before
this module runs (about 50 ms), keeps Python's defaults: SIGTERM kills the process with no line,
SIGINT raises KeyboardInterrupt; nothing has been written then.
"""

from __future__ import annotations

import os
import signal
import sys

from .signals import exit_code, install, interruption

__all__ = ["main"]


def main() -> None:
    """Install the signal handlers, then import and run the command line."""
    install()
    try:
        from .cli import main as run
    except BaseException as error:  # nothing has been done yet
        # the signal itself, or an error it caused on its way out (a class being created when it came
        # is wrapped in RuntimeError: Error calling __set_name__ ...)
        e = interruption(error)
        if e is None:
            raise
        sys.stderr.write(
            f"\ninterrupted ({signal.Signals(e.signum).name}) while starting, before anything "
            "was written; run the same command again to resume.\n"
        )
        sys.stderr.flush()
        os._exit(exit_code(e.signum))
    run()


if __name__ == "__main__":
    main()
