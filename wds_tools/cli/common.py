"""What every ``wds-tools`` command shares: ``-q/--quiet`` and ``--json``, help that shows the
built-in defaults, and errors turned into a message and the exit status of ``exitcodes``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from ..errors import OptionError, WdsToolsError
from ..exitcodes import ExitCode, for_error
from ..signals import Interrupted, signal_behind
from .defaults import CONFIG_FILE, SHARED_KEYS, default_map, load_cli_defaults

__all__ = [
    "path_and_out",
    "epoch_split_options",
    "apply_config",
    "Command",
    "TomlOption",
    "Failure",
    "fail",
    "json_option",
    "quiet_option",
    "CONFIG_ERROR",
    "DEFAULTS_NOTE",
]

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_ERROR = "wds_tools.config_error"
"""The ``ctx.meta`` key holding a wds-tools.toml error, raised when a command runs (so ``--help`` still works)."""
DEFAULTS_NOTE = (
    f"Defaults shown are built in; any option takes its default from {CONFIG_FILE} when one applies "
    f"(./{CONFIG_FILE}, or wds-tools --config FILE)."
)
"""The line every command's ``--help`` ends with: defaults shown are built in."""


class Failure(click.ClickException):
    """A command's error: its message on stderr and the exit status ``exitcodes`` gives it."""

    def __init__(self, message: str, code: int = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.exit_code = int(code)  # type: ignore[misc]  # click types it a ClassVar; ours is per error


def fail(e: WdsToolsError) -> NoReturn:
    """Stop the command with ``e``'s message and exit status (``exitcodes.for_error``)."""
    raise Failure(str(e), for_error(e))


class TomlOption(click.Option):
    """An option that says whether wds-tools.toml may set it (``toml``; a plain ``click.Option`` may)."""

    def __init__(self, *args: Any, toml: bool = True, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.toml = toml


class Command(click.Command):
    """A subcommand: help with built-in defaults, errors as exit statuses."""

    def get_help(self, ctx: click.Context) -> str:
        """The help text with the built-in defaults, whatever wds-tools.toml the folder holds."""
        saved, ctx.default_map = ctx.default_map, None
        try:
            return super().get_help(ctx)
        finally:
            ctx.default_map = saved

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The note on defaults and wds-tools.toml after the options."""
        super().format_epilog(ctx, formatter)
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text(DEFAULTS_NOTE)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a WdsToolsError becomes its message and exit status, any other exception
        (a bug) its traceback and ``ExitCode.INTERNAL``."""
        error = ctx.meta.get(CONFIG_ERROR)
        if error is not None:
            fail(error)
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as e:
            # an error raised while the command unwinds from SIGINT/SIGTERM (its clean-up cut short) is
            # the signal's consequence: the command ends as interrupted (exit 130/143, the resume line)
            signum = signal_behind(e)
            if signum is not None:
                raise Interrupted(signum) from None
            if isinstance(e, WdsToolsError):
                fail(e)
            click.echo(traceback.format_exc().rstrip(), err=True)
            click.echo(
                f"error: an unexpected error in wds-tools {ctx.info_name} (a bug; please report it with the "
                "traceback above)",
                err=True,
            )
            ctx.exit(ExitCode.INTERNAL)


def path_and_out(f: F) -> F:
    """PATH (a shards folder, its index.json or a shard pattern) and ``--out``, which every command over
    converted shards takes: without PATH, the newest version under OUT."""
    f = click.option(
        "--out",
        type=click.Path(file_okay=False),
        default="shards",
        show_default=True,
        help="Root folder of all versions; without PATH, the newest version under it is used.",
    )(f)
    return click.argument("path", required=False)(f)


def epoch_split_options(f: F) -> F:
    """``--world-size``, ``--loader-workers`` and ``--reader``: the training run whose epoch split over ranks and workers
    ``stats`` and ``report`` show."""
    # click lists options in the reverse order of the decorators applied: --world-size first
    f = click.option(
        "--reader",
        type=click.Choice(["auto", "index", "stream"]),
        default="auto",
        show_default=True,
        help="The training loader's reader to model (make_loader's reader=): auto is the one make_loader "
        "picks, the index reader where an index lists the shards (local or object storage), else streaming.",
    )(f)
    f = click.option(
        "--loader-workers",
        "loader_workers",
        type=click.IntRange(min=1),
        default=None,
        metavar="W",
        help="DataLoader workers per rank of the training loader this models (make_loader's num_workers). "
        "Default: this machine's cores.",
    )(f)
    return click.option(
        "--world-size",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Training ranks (processes) the shards are split over, shard i to rank i % R.",
    )(f)


def quiet_option(f: F) -> F:
    """``-q/--quiet``: no progress and no informational lines (the result and errors still print)."""
    return click.option(
        "--quiet",
        "-q",
        "quiet",
        is_flag=True,
        help="No progress and no informational lines; the result (text or --json) and errors still print.",
    )(f)


def json_option(what: str) -> Callable[[F], F]:
    """``--json``: the result as one JSON object on stdout (``what`` says which)."""

    def deco(f: F) -> F:
        return click.option("--json", "as_json", is_flag=True, help=f"Print {what} as one JSON object on stdout.")(f)

    return deco


def table_keys(path: str, command: str, table: dict, params: list[click.Parameter]) -> dict:
    """A [command] table of wds-tools.toml with its keys as click parameter names: a key is an option's
    long name without the dashes (``shard-size``, ``from``, ``json``; ``_`` for ``-`` also goes).
    A key that names none of the command's options, or one that the file may not set (``TomlOption``), is
    refused, naming the file and the options."""
    names = {
        o[2:]: p for p in params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts if o[:2] == "--"
    }
    out = {}
    for key, value in table.items():
        option = names.get(key) or names.get(key.replace("_", "-"))
        if option is None or option.name is None:
            raise OptionError(f"{path}: [{command}] unknown key {key!r}; expected one of {', '.join(sorted(names))}")
        if not getattr(option, "toml", True):
            raise OptionError(
                f"{path}: [{command}] {key!r} is not taken from {CONFIG_FILE}: give {option.opts[0]} when you run"
            )
        out[option.name] = value
    return out


def apply_config(ctx: click.Context, config_path: str | None) -> None:
    """Set the group's ``default_map`` from wds-tools.toml (``config.load_cli_defaults``), its keys
    turned into each command's parameter names (``table_keys``). A bad file is kept in ``ctx.meta``
    and stops the command when it runs (``Command.invoke``), not its ``--help``."""
    try:
        config = load_cli_defaults(config_path)
        dm = default_map(config)
        commands = ctx.command.commands  # type: ignore[attr-defined]
        for command, table in dm.items():
            params = commands[command].params
            takes = {p.name for p in params}
            # source and out at the top feed only the commands that take them; other keys must name an option
            table = {k: v for k, v in table.items() if k in takes or k not in SHARED_KEYS}
            dm[command] = table_keys(config.get("_path", CONFIG_FILE), command, table, params)
        ctx.default_map = dm
    except WdsToolsError as e:
        ctx.meta[CONFIG_ERROR] = e
