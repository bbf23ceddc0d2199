"""The ``wds-tools`` group (the global options and wds-tools.toml), ``main`` (SIGINT and SIGTERM
end any command with one line), and what every command shares: ``emit`` and ``interrupted``."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, NoReturn

import click

from ..signals import SIGNALS, exit_code, install, interruption
from ..version import __version__
from .common import apply_config
from .defaults import CONFIG_FILE

__all__ = ["cli", "main", "emit", "interrupted"]


def interrupted(signum: int, what: str) -> NoReturn:
    """One line for a SIGINT or SIGTERM, then exit 128 + its number at once: the command's clean-up
    has run, and no thread left behind (a pool's) may hold the exit up."""
    name = signal.Signals(signum).name
    click.echo(f"\ninterrupted ({name}): {what}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code(signum))


def emit(report: Any, as_json: bool, **text_options: Any) -> None:
    """Print a result object: one JSON object with --json, else its own text."""
    click.echo(json.dumps(report.to_dict(), sort_keys=True) if as_json else report.to_text(**text_options))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(
    __version__,
    prog_name="wds-tools",
    help="Show the program's version (wds-tools itself, not a dataset's) and exit.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help=f"Options file (TOML). Default: ./{CONFIG_FILE} when it exists.",
)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Convert image corpora once into versioned WebDataset shards of pre-decoded uint8 arrays.

    \b
    Typical use:
      wds-tools convert --source data/manifest.csv --version v1 --size 224
      -> shards/v1/224/train-000000.tar ... plus index.json, samples.npz

    Options can also come from a wds-tools.toml in the working directory:

    \b
      source = "data/manifest.csv"   # used by every command that takes it
      out = "shards"
      [convert]
      workers = 8

    Exit status: 0 done, 1 error, 2 usage, 3 the data fails (verify, --max-errors), 4 a bug,
    130/143 SIGINT/SIGTERM (docs/exit-codes.md).
    """
    # a bad wds-tools.toml stops the command when it runs, not its --help (help is the same in every folder)
    apply_config(ctx, config_path)


def main() -> None:
    """The ``wds-tools`` command: SIGINT and SIGTERM end any command with one line and 128 + the signal."""
    install()
    try:
        try:
            cli(prog_name="wds-tools")
        finally:
            # the command is done: a signal from here on must not kill the interpreter's exit (which
            # puts the default handlers back) with no message and exit -15; held back, it dies with
            # the process, whose exit status stands
            signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    except BaseException as error:  # the signal, or an error raised while unwinding from it
        e = interruption(error)
        if e is None:
            raise
        interrupted(e.signum, "stopped before it finished; run the same command again to resume.")
