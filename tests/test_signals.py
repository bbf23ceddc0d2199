"""wds_tools.signals and the entry point (wds_tools/__main__.py): the handlers are in before the
command line's modules are imported, for the console script users run and for ``python -m``."""

from __future__ import annotations

import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# imports the entry point, then makes the first import of `click` (the CLI's first heavy import)
# send the given signal to this process, then runs the command as the console script does
_SCRIPT = """
import os, signal, sys
from wds_tools.__main__ import main

class SignalOnClick:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            sys.meta_path.remove(self)
            try:
                os.kill(os.getpid(), signal.{sig})
            except BaseException as e:
                if {wrapped}:  # as class creation wraps it: RuntimeError: Error calling __set_name__ ...
                    raise RuntimeError("Error calling __set_name__ on 'cached_property' instance") from e
                raise
        return None

sys.meta_path.insert(0, SignalOnClick())
sys.argv = ["wds-tools", "--help"]
sys.exit(main())
"""


def test_the_console_script_is_the_entry_point_that_installs_the_handlers_first():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"wds-tools": "wds_tools.__main__:main"}


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_cli_modules_import_ends_with_the_resume_line(sig, wrapped):
    """Also when the import machinery wraps the signal in another error (torture seed 7: a SIGINT while
    platform.py created a class came out as RuntimeError, exit 1 with a traceback)."""
    res = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(sig=sig, wrapped=wrapped)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert res.returncode == 128 + getattr(signal, sig), res.stderr
    assert f"interrupted ({sig}) while starting" in res.stderr
    assert "run the same command again to resume" in res.stderr
    assert "Traceback" not in res.stderr and "KeyboardInterrupt" not in res.stderr
    assert "Usage" not in res.stdout  # the command never ran


def test_without_a_signal_the_entry_point_runs_the_command():
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from wds_tools.__main__ import main; sys.argv = ['wds-tools', '--version']; main()",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert res.returncode == 0 and "wds-tools, version" in res.stdout


def test_exit_code_is_128_plus_the_signal():
    from wds_tools.signals import exit_code

    assert (exit_code(signal.SIGINT), exit_code(signal.SIGTERM)) == (130, 143)


class _MaskingClose:
    """A context manager whose exit fails when an exception is passing through it, as zipfile's
    ZipFile does when a signal left one of its member handles open."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            raise ValueError("Can't close the ZIP file while there is an open writing handle on it.")
        return False


def test_interruption_finds_the_signal_behind_a_clean_up_error():
    from wds_tools.signals import Interrupted, interruption

    try:
        with _MaskingClose():
            raise Interrupted(signal.SIGINT)
    except ValueError as e:
        found = interruption(e)
    assert isinstance(found, Interrupted) and found.signum == signal.SIGINT
    assert interruption(ValueError("a plain bug")) is None


def test_a_command_whose_clean_up_fails_after_a_signal_ends_as_interrupted():
    """The CI failure: SIGINT inside zipfile's member close during convert; ZipFile.__exit__ then raised
    ValueError, which the CLI reported as a bug (exit 4, a traceback) instead of exit 130 and the resume line."""
    import click
    from click.testing import CliRunner

    from wds_tools.cli.common import Command
    from wds_tools.signals import Interrupted

    @click.command(cls=Command)
    def boom() -> None:
        with _MaskingClose():
            raise Interrupted(signal.SIGINT)

    with pytest.raises(Interrupted) as got:  # main() turns it into exit 130 and the resume line
        CliRunner().invoke(boom, [], catch_exceptions=False)
    assert got.value.signum == signal.SIGINT

    @click.command(cls=Command)
    def bug() -> None:
        raise ValueError("a plain bug")

    res = CliRunner().invoke(bug, [])
    assert res.exit_code == 4 and "a plain bug" in res.output  # a bug with no signal stays a bug
