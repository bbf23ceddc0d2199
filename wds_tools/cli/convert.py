"""``wds-tools convert``: its options, made from their declaration (``ConvertOptions``), then one call of
``wds_tools.convert.convert_with``."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import click

from ..convert.options import ConvertOptions, Flag, Fraction, Integer, OneOf, Option, declared
from ..exitcodes import ExitCode
from ..signals import Interrupted, signal_behind
from .common import Command, Failure, TomlOption, json_option, quiet_option
from .group import cli, emit, interrupted

__all__ = ["convert"]


class _AsGiven(click.ParamType):
    """A value the options check when they are made: a string as typed, or a wds-tools.toml value as
    written (``size = [224, 384]``, ``shard-size = 2000``)."""

    def __init__(self, metavar: str | None) -> None:
        self.name = metavar or "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value


def _click_option(name: str, o: Option, default: Any) -> Callable[[Callable], Callable]:
    """The command line's option of a declared one: its kind from the check of its command-line value."""
    check, value = (o.cli.check, o.cli.default) if o.cli is not None else (o.check, default)
    kind: dict[str, Any]
    if isinstance(check, Flag):
        kind = {"is_flag": True}
    elif isinstance(check, Integer):
        kind = {"type": click.IntRange(min=check.lo) if check.lo is not None else click.INT}
    elif isinstance(check, Fraction):
        kind = {"type": click.FloatRange(0, 1, max_open=True)}
    elif isinstance(check, OneOf):
        kind = {"type": click.Choice(check.values)}
    else:
        kind = {"type": _AsGiven(o.metavar)}
    if o.metavar is not None:
        kind["metavar"] = o.metavar
    required = value is MISSING
    shown = not required and value is not None and not kind.get("is_flag")
    return click.option(
        o.spelled(name),
        name,
        cls=TomlOption,
        toml=o.config,
        required=required,
        default=None if required else value,
        show_default=shown,
        help=o.help,
        **kind,
    )


def _declared_options(f: Callable) -> Callable:
    """The command line's options of every ``ConvertOptions`` field with a flag, in declaration order."""
    for fd in reversed([fd for fd in fields(ConvertOptions) if fd.init]):
        o = fd.metadata["option"]
        if o.flag is not None:
            f = _click_option(fd.name, o, fd.default)(f)
    return f


@cli.command(cls=Command)
@click.option(
    "--source",
    type=click.Path(),
    required=True,
    help="Manifest (.csv/.tsv/.jsonl with key,path,label[,split][,sha256 or md5], or a dataset's own "
    "metadata file with --key/--label/--path; paths relative to the manifest's folder) or an image "
    "folder ROOT/<label>/<file>.",
)
@_declared_options
@json_option("the summary")
@quiet_option
def convert(source: str, as_json: bool, quiet: bool, **given: Any) -> None:
    """Convert a corpus into OUT/VERSION/SIZE/<split>-NNNNNN.tar shards.

    Each sample holds KEY.npy (uint8 [SIZE, SIZE, 3]), KEY.cls (label index) and KEY.json
    (source path, original size, label name, source fingerprint, and the manifest's other columns
    under "meta"). An index (index.json + samples.npz, with those columns typed) is written beside
    the shards, and bad source files are skipped and listed in errors.jsonl.

    A dataset's own metadata file is a manifest too: name its key and label columns and its image
    path (a column, or a template), and optionally a --group column (lesion, patient) whose groups
    never straddle two splits.

    Running the same command again resumes an interrupted conversion (Ctrl-C, kill -9, a full
    disk); a folder made with other options or another source is refused, never overwritten.
    One conversion at a time writes a folder: a second one is refused at once, naming the host,
    pid, start time and command of the one that holds it.

    A new version is built incrementally: when OUT holds an earlier version with the same size
    and decode settings, every source whose bytes it already holds is copied from its shards
    (checked against its index) instead of decoded; only new and changed images are decoded.
    The result is identical to a full conversion. Unchanged sources are found without reading
    them: by a sha256 or md5 column of the manifest, or else by path, size and mtime;
    --checksum reads and fingerprints every source instead.

    Decoding runs in small batches of samples on all --workers, however few shards the plan
    has; each shard is still written whole and in order.

    \b
    Examples:
      wds-tools convert --source data/manifest.csv --version v1 --size 224
      wds-tools convert --source data/manifest.csv --version v1 --size 224,384
      wds-tools convert --source HAM10000_metadata.csv --key image_id --label dx \\
          --path 'images/{image_id}.jpg' --group lesion_id --stratify --version v1 --size 224
      wds-tools convert --source data/manifest_v2.csv --version v2 --size 224 --dry-run
      wds-tools convert --source data/manifest.csv --version v1 --size 224 --executor ray --ray-address auto
      wds-tools convert --source photos/ --version v1 --size 256 --resize pad --workers 8
      wds-tools convert --version v1 --size 224 --json      # source and out from wds-tools.toml
    """
    from ..convert import convert_with

    try:
        values = {n: o.cli.to_option(given[n]) if o.cli else given[n] for n, o in declared().items() if n in given}
        options = ConvertOptions(**values, progress=not quiet)
        result = convert_with(source, options)
    except (KeyboardInterrupt, Interrupted) as e:
        interrupted(
            getattr(e, "signum", signal.SIGINT), "finished shards are kept; run the same command again to resume."
        )
    except Exception as e:  # the consequence of a signal (signals.signal_behind); else Command.invoke's
        signum = signal_behind(e)
        if signum is not None:
            interrupted(signum, "finished shards are kept; run the same command again to resume.")
        raise
    emit(result, as_json)
    for r in getattr(result, "results", [result]):
        if r.max_errors_exceeded:
            raise Failure(
                f"{r.failed} source files failed, more than --max-errors allows ({r.max_errors_allowed}); "
                f"see {r.errors_file}",
                ExitCode.DATA,
            )
