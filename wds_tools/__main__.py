"""``python -m wds_tools``: the SIGINT/SIGTERM handlers first (a signal during the imports ends
the same way as one later), then the command line."""

import os
import signal
import sys

from .signals import Interrupted, exit_code, install

install()
try:
    from .cli import main
except Interrupted as e:  # nothing has been done yet
    sys.stderr.write(
        f"\ninterrupted ({signal.Signals(e.signum).name}) while starting, before anything "
        "was written; run the same command again to resume.\n"
    )
    sys.stderr.flush()
    os._exit(exit_code(e.signum))

main()
