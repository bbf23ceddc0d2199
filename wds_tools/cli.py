"""The ``wds-tools`` command line: parse options, call one library function, print its result."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, NoReturn

import click

from .clikit import Command, DeprecatedAlias, Failure, apply_config, fail, json_option, quiet_option
from .config import CONFIG_FILE
from .convert.decode import COLOUR_MODES, RESIZE_MODES, DecodeSettings
from .convert.runner import EXECUTORS
from .errors import OptionError, WdsToolsError
from .exitcodes import ExitCode
from .signals import SIGNALS, Interrupted, exit_code, install, received
from .version import __version__

__all__ = ["cli", "main"]


def _interrupted(signum: int, what: str) -> NoReturn:
    """One line for a SIGINT or SIGTERM, then exit 128 + its number at once: the command's clean-up
    has run, and no thread left behind (a pool's) may hold the exit up."""
    name = signal.Signals(signum).name
    click.echo(f"\ninterrupted ({name}): {what}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code(signum))


class _Sizes(click.ParamType):
    """--size: 224, or several sizes 224,384 (also a list in wds-tools.toml)."""

    name = "SIZE[,SIZE...]"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | list[int]:
        from .convert import parse_sizes

        try:
            sizes = parse_sizes(value)
        except WdsToolsError as e:
            self.fail(str(e), param, ctx)
        return sizes[0] if len(sizes) == 1 else sizes


_SIZES = _Sizes()


def _emit(report: Any, as_json: bool, **text_options: Any) -> None:
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


@cli.command(cls=Command)
@click.option(
    "--source",
    type=click.Path(),
    required=True,
    help="Manifest (.csv/.tsv/.jsonl with key,path,label[,split][,sha256 or md5], or a dataset's own "
    "metadata file with --key/--label/--path; paths relative to the manifest's folder) or an image "
    "folder ROOT/<label>/<file>.",
)
@click.option(
    "--version",
    "version",
    required=True,
    metavar="NAME",
    help="Name of the dataset version to write, e.g. v1; shards go to OUT/VERSION/SIZE/. (Not the "
    "program's version: that is wds-tools --version.)",
)
@click.option(
    "--size",
    type=_SIZES,
    required=True,
    help="Side of the square output images in pixels, e.g. 224; several sizes, e.g. 224,384, "
    "give one folder each (OUT/VERSION/224, OUT/VERSION/384), each identical to a run at that "
    "size alone, from one read and decode of each source.",
)
@click.option(
    "--out", type=click.Path(file_okay=False), default="shards", show_default=True, help="Root folder of all versions."
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Decoding processes, this one included (batches of samples are spread over "
    "them whatever the number of shards). Default: all cores.",
)
@click.option(
    "--shard-size", default=None, help="Samples per shard (2000) or a target size (256MB). Default: ~256 MB per shard."
)
@click.option(
    "--resize",
    type=click.Choice(RESIZE_MODES),
    default="center-crop",
    show_default=True,
    help="center-crop: scale the short side to SIZE and crop the middle; squash: scale "
    "both sides to SIZE, ignoring aspect; pad: fit the long side and pad with black.",
)
@click.option(
    "--val-fraction",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.1,
    show_default=True,
    help="Fraction of keys (of groups, with --group) put in split 'val' when the manifest has no split column.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the key hash that orders samples and assigns splits.",
)
@click.option(
    "--key",
    "key",
    default="key",
    show_default=True,
    metavar="COL",
    help="Manifest column holding each sample's key, e.g. image_id.",
)
@click.option(
    "--label",
    "label",
    default="label",
    show_default=True,
    metavar="COL",
    help="Manifest column holding the class name, e.g. dx.",
)
@click.option(
    "--path",
    "path",
    default="path",
    show_default=True,
    metavar="TEMPLATE",
    help="Manifest column holding each image's path, or a template naming columns in braces, e.g. "
    "'images/{image_id}.jpg' (relative to the manifest's folder; '{{' and '}}' for braces). A row "
    "whose path names a missing file is skipped and listed in errors.jsonl.",
)
@click.option(
    "--split",
    "split",
    default=None,
    metavar="COL",
    help="Manifest column holding each sample's split (train, val, ...); a row with an empty one gets "
    "a drawn split. Default: the column 'split' when the manifest has one. With --group, a group "
    "it puts in two splits is refused, naming the group.",
)
@click.option(
    "--group",
    "group",
    default=None,
    metavar="COL",
    help="Manifest column grouping samples that must share a split (lesion_id, patient_id): splits are "
    "drawn per group and --val-fraction applies to groups. Groups an earlier version holds keep "
    "their split (see --from).",
)
@click.option(
    "--dedup",
    is_flag=True,
    help="Keep near-duplicate images (wds-tools dups, default threshold) in one split: each cluster is "
    "joined with the --group values it touches (or its keys) before splits are drawn; an earlier "
    "version's assignments are kept and new copies follow them. Decodes every source once more.",
)
@click.option(
    "--stratify",
    is_flag=True,
    help="Draw splits so that each class's val share is close to --val-fraction: per class, groups "
    "(or samples) in a seeded hash order go to val while they keep it under the target, so each "
    "class ends within half its largest group of it (rule: docs/FORMAT.md, Splits per group).",
)
@click.option(
    "--resplit",
    is_flag=True,
    help="With --group or --stratify, draw every group's split afresh for this version instead of "
    "keeping the splits an earlier version holds (the summary says which it did).",
)
@click.option(
    "--sanitize-keys",
    is_flag=True,
    help="Map invalid or clashing keys to valid ones instead of refusing them "
    "(the original key is kept in each sample's json).",
)
@click.option(
    "--max-errors",
    default="1%",
    show_default=True,
    help="Bad source files tolerated: a count (25), a fraction (0.01) or a percentage (1%). "
    "Past it the command stops with a non-zero exit and no index.json; the shards written "
    "are kept, and the same command with a higher limit finishes the rest.",
)
@click.option(
    "--from",
    "base",
    default=None,
    help="Reuse pixels from this earlier version (same --size and decode settings), and with --group "
    "or --stratify keep the splits of its groups. Default: the newest such version under --out.",
)
@click.option("--no-reuse", is_flag=True, help="Decode every image, even those an earlier version holds.")
@click.option(
    "--checksum",
    is_flag=True,
    help="Read and fingerprint every source to find what changed since the base. Default: a "
    "source whose manifest sha256/md5 the base recorded, or else whose path, size and mtime "
    "equal the base's, is taken as unchanged without being read (misses an edit that kept "
    "size and mtime; see the README).",
)
@click.option(
    "--trust-mtime",
    is_flag=True,
    help="Deprecated, no effect: taking a source with the base's path, size and mtime as "
    "unchanged is now the default (--checksum reads every source).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be decoded, reused and removed; write nothing.")
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    default="local",
    show_default=True,
    help="local: a process pool on this machine; ray: Ray tasks on the cluster ray.init "
    "reaches (needs the 'ray' extra; sources and --out must be visible to every node).",
)
@click.option(
    "--ray-address",
    default=None,
    help="Ray cluster address for --executor ray, e.g. ray://head:10001 or auto. Default: start a local Ray instance.",
)
@click.option(
    "--colour",
    "colour",
    type=click.Choice(COLOUR_MODES),
    default="srgb",
    show_default=True,
    help="An image's embedded ICC colour profile: srgb converts its pixels to sRGB (Display P3 phone "
    "photos, Adobe RGB scans); raw keeps the stored values and ignores the profile.",
)
@json_option("the summary")
@quiet_option
def convert(
    source: str | None,
    version: str | None,
    size: int | list[int] | None,
    out: str,
    workers: int | None,
    shard_size: str | None,
    resize: str,
    val_fraction: float,
    seed: int,
    key: str,
    label: str,
    path: str,
    split: str | None,
    group: str | None,
    dedup: bool,
    stratify: bool,
    resplit: bool,
    sanitize_keys: bool,
    max_errors: str,
    base: str | None,
    no_reuse: bool,
    checksum: bool,
    trust_mtime: bool,
    dry_run: bool,
    executor: str,
    ray_address: str | None,
    colour: str,
    as_json: bool,
    quiet: bool,
) -> None:
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
    from .convert import convert as run_convert

    if trust_mtime:
        click.echo(
            "note: --trust-mtime is deprecated and has no effect: the quick check by path, size "
            "and mtime is now the default; --checksum reads every source.",
            err=True,
        )
        if checksum:
            fail(OptionError("--trust-mtime and --checksum contradict each other; pass --checksum alone"))
    try:
        result = run_convert(
            source,
            version=version,
            size=size,
            out=out,
            workers=workers,
            shard_size=shard_size,
            resize=resize,
            val_fraction=val_fraction,
            seed=seed,
            sanitize_keys=sanitize_keys,
            key=key,
            label=label,
            path=path,
            split=split,
            group=group,
            dedup=dedup,
            stratify=stratify,
            resplit=resplit,
            max_errors=max_errors,
            reuse=not no_reuse,
            decode=DecodeSettings(colour=colour),
            base=base,
            checksum=checksum,
            dry_run=dry_run,
            executor=executor,
            ray_address=ray_address,
            progress=not quiet,
        )
    except (KeyboardInterrupt, Interrupted) as e:
        _interrupted(
            getattr(e, "signum", signal.SIGINT), "finished shards are kept; run the same command again to resume."
        )
    except WdsToolsError as e:
        signum = received()
        if signum is not None:  # a worker that died of the group's SIGTERM broke the pool first
            _interrupted(signum, "finished shards are kept; run the same command again to resume.")
        fail(e)
    _emit(result, as_json)
    for r in getattr(result, "results", [result]):
        if r.max_errors_exceeded:
            raise Failure(
                f"{r.failed} source files failed, more than --max-errors allows ({r.max_errors_allowed}); "
                f"see {r.errors_file}",
                ExitCode.DATA,
            )


@cli.command(cls=Command)
@click.argument("old", type=click.Path(exists=True))
@click.argument("new", type=click.Path(exists=True))
@json_option("the full key lists")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Keys listed per category in the text output.",
)
@quiet_option
def diff(old: str, new: str, as_json: bool, limit: int, quiet: bool) -> None:
    """List keys added, removed, changed (other source bytes) and relabeled between two versions.

    OLD and NEW are shards folders (or their index.json), local or URLs (s3://..., https://...).

    \b
    Example:
      wds-tools diff shards/v1/224 shards/v2/224
    """
    from .inspect.diff import diff_versions

    try:
        result = diff_versions(old, new)
    except WdsToolsError as e:
        fail(e)
    _emit(result, as_json, limit=limit)


@cli.command(cls=Command)
@click.argument("path", required=False)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="shards",
    show_default=True,
    help="Root folder of all versions; without PATH, the newest version under it is used.",
)
@click.option(
    "--threshold",
    type=click.IntRange(0, 63),
    default=None,
    help="Largest Hamming distance (bits of the 64-bit perceptual hashes: one image's whole-image hash, "
    "under its flips and quarter turns, against the other's whole-image or window hashes) between "
    "near-duplicates. Default: 5, the largest with precision >= 0.99 on scripts/bench_dups.py's set "
    "that keeps the search to one-bit probes (README).",
)
@click.option(
    "--across",
    default=None,
    metavar="OTHER",
    help="Only clusters spanning PATH and OTHER, another version or dataset (e.g. a clinic's photos against HAM10000).",
)
@click.option(
    "--group",
    default=None,
    metavar="COL",
    help="Flag clusters whose samples have different values of this metadata column (a missed group). "
    "Default: the --group column the set was converted with, if any.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Draw a contact sheet of the worst clusters, one row each, into this PNG.",
)
@click.option(
    "--limit", type=click.IntRange(min=0), default=20, show_default=True, help="Clusters listed in the text output."
)
@json_option("every cluster")
@quiet_option
def dups(
    path: str | None,
    out: str,
    threshold: int | None,
    across: str | None,
    group: str | None,
    plot_path: str | None,
    limit: int,
    as_json: bool,
    quiet: bool,
) -> None:
    """List clusters of near-duplicate images, flagging those that cross splits, labels or groups.

    PATH is a shards folder (shards/v1/224) or its index.json, local or a URL. Default: the newest
    OUT/<version>/<size>/. Every sample's whole-image perceptual hash (samples.npz phash,
    docs/FORMAT.md), under its eight flips and quarter turns, is compared with every other's hashes
    of the whole image and of six windows (for slightly cropped copies); pairs within --threshold
    bits are joined into clusters. A cluster is CROSS-SPLIT when its samples sit in more than one
    split (leakage), LABEL-CONFLICT when they carry different labels, CROSS-GROUP when they have
    different values of the group column (e.g. one lesion filed under two lesion ids). Indexes of
    format versions 1 and 2 have no hash column: it is computed from the stored pixels.

    \b
    Examples:
      wds-tools dups shards/v1/224
      wds-tools dups shards/v1/224 --group lesion_id --plot dups.png
      wds-tools dups clinic/v1/224 --across ham10000/v1/224 --json
    """
    from .format.resolve import newest_dataset
    from .inspect.dups import DEFAULT_THRESHOLD, find_dups, plot_dups

    try:
        result = find_dups(
            path if path is not None else newest_dataset(out),
            threshold=DEFAULT_THRESHOLD if threshold is None else threshold,
            across=across,
            group=group,
        )
        if plot_path:
            plot_dups(result, plot_path)
    except WdsToolsError as e:
        fail(e)
    _emit(result, as_json, limit=limit)
    if plot_path and not as_json and not quiet:
        click.echo(f"\ncontact sheet written to {plot_path}")


@cli.command("index", cls=Command)
@click.argument("path", required=False)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="shards",
    show_default=True,
    help="Root folder of all versions; without PATH, the newest version under it is used.",
)
@click.option(
    "--wids", "wids", is_flag=True, help="Write <split>.wids.json, the shard list wids.ShardListDataset takes."
)
@click.option(
    "--dali",
    "dali",
    is_flag=True,
    help="Write <shard>.idx per shard, the index NVIDIA DALI's fn.readers.webdataset takes "
    "(the format of DALI's wds2idx tool).",
)
@json_option("the names written")
@quiet_option
def index_files(path: str | None, out: str, wids: bool, dali: bool, as_json: bool, quiet: bool) -> None:
    """Write index files that other readers need, beside an existing conversion's index.json.

    PATH is a shards folder (shards/v1/224) or its index.json, local or an fsspec URL (s3://...).
    Default: the newest OUT/<version>/<size>/. convert writes both kinds itself; use this for a folder converted without them. They are
    derived from index.json and samples.npz (every member's offset and length): no shard is read.
    Without --wids or --dali, both are written.

    \b
    Examples:
      wds-tools index shards/v1/224
      wds-tools index shards/v1/224 --dali
      wds-tools index s3://bucket/shards/v1/224 --wids
    """
    from .convert.reindex import write_reader_indexes
    from .format.resolve import newest_dataset

    if not wids and not dali:
        wids = dali = True
    try:
        result = write_reader_indexes(path if path is not None else newest_dataset(out), wids=wids, dali=dali)
    except WdsToolsError as e:
        fail(e)
    _emit(result, as_json)


# ---------------------------------------------------------------- stats and verify


@cli.command(cls=Command)
@click.argument("path", required=False)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="shards",
    show_default=True,
    help="Root folder of all versions; without PATH, the newest version under it is used.",
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Training ranks (processes) the shards are split over, shard i to rank i % R.",
)
@click.option(
    "--loader-workers",
    "loader_workers",
    type=click.IntRange(min=1),
    default=None,
    metavar="W",
    help="DataLoader workers per rank of the training loader this models (make_loader's num_workers). "
    "Default: this machine's cores.",
)
@click.option(
    "--reader",
    type=click.Choice(["auto", "index", "stream"]),
    default="auto",
    show_default=True,
    help="The training loader's reader to model (make_loader's reader=): auto is the one make_loader "
    "picks, the index reader where an index lists the shards (local or object storage), else streaming.",
)
@click.option(
    "--workers",
    "old_workers",
    cls=DeprecatedAlias,
    new="--loader-workers",
    dest="loader_workers",
    type=click.IntRange(min=1),
)
@click.option(
    "--scan",
    is_flag=True,
    help="Read the tars instead of the index (works without index.json; reads every byte, slower).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also draw samples per shard and a class-share heatmap into this PNG "
    "(needs the plot extra: pip install 'wds-tools[plot]').",
)
@click.option(
    "--by",
    "by",
    default=None,
    metavar="COL",
    help="Break each split's class counts down by this metadata column (a column of the dataset's "
    "metadata file, e.g. localization or sex; missing values counted apart).",
)
@click.option(
    "--group",
    "group",
    default=None,
    metavar="COL",
    help="Report the groups of this metadata column (e.g. patient_id) found in more than one split. "
    "Default: the --group column the set was converted with, if any.",
)
@click.option(
    "--allow-mixed",
    is_flag=True,
    help="Accept shards of different datasets (index.json files of another dataset_version, classes, "
    "size or build), refused by default with a message naming both; they can only be read as one "
    "set with --scan, as any reader of the tars would see them.",
)
@json_option("the report")
@quiet_option
def stats(
    path: str | None,
    out: str,
    world_size: int,
    loader_workers: int | None,
    reader: str,
    scan: bool,
    plot_path: str | None,
    by: str | None,
    group: str | None,
    allow_mixed: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Show per split how balanced the shards are and how an epoch splits over ranks and workers.

    PATH is a shards folder (shards/v1/224), its index.json, or a shard pattern
    (shards/v1/224/train-{000000..000041}.tar), local or a URL (s3://bucket/shards/v1/224,
    https://host/shards/v1/224/index.json). Default: the newest OUT/<version>/<size>/.
    Shards of different datasets (e.g. v1 and v2 patterns joined with ::) are refused (see
    --allow-mixed); a pattern naming only some shards of a split is reported on, with a warning
    naming the shards it leaves out.

    Per split: shard count; samples and bytes per shard (min, median, max, max/min, coefficient
    of variation); the class distribution and each shard's largest deviation from it; and how the
    training loader (the --reader it would use, named in the report) deals an epoch to --world-size
    ranks × --loader-workers workers: the index reader deals samples (equal counts per rank, any
    number of workers), the streaming reader whole shards, with a warning when some reader gets no
    shard or ranks get unequal sample counts, and the nearest shard counts that divide evenly.
    Also the dataset's mean/std and its size on disk; with --by, each split's class counts per value
    of a metadata column; and any group of the --group column (by default the one the set was
    converted with) found in more than one split.

    \b
    Examples:
      wds-tools stats shards/v1/224
      wds-tools stats shards/v1/224 --by localization
      wds-tools stats shards/v1/224 --group patient_id     # a set converted without --group: any leakage?
      wds-tools stats --world-size 8 --loader-workers 6   # newest version under ./shards
      wds-tools stats shards/v1/224 --reader stream --loader-workers 4
      wds-tools stats shards/v1/224/index.json --json
      wds-tools stats s3://bucket/shards/v1/224
      wds-tools stats "shards/v1/224/train-{000000..000009}.tar" --scan --plot shards.png
    """
    from .inspect.stats import compute_stats
    from .inspect.stats.plot import plot_stats, require_matplotlib

    try:
        if plot_path:
            require_matplotlib()
        report = compute_stats(
            path,
            out=out,
            world_size=world_size,
            workers=loader_workers,
            reader=reader,
            scan=scan,
            by=by,
            group=group,
            allow_mixed=allow_mixed,
        )
        if plot_path:
            plot_stats(report, plot_path)
    except WdsToolsError as e:
        fail(e)
    _emit(report, as_json)
    if plot_path and not as_json and not quiet:
        click.echo(f"\nplot written to {plot_path}")


@cli.command(cls=Command)
@click.argument("path", required=False)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="shards",
    show_default=True,
    help="Root folder of all versions; without PATH, the newest version under it is used.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Small reads: the index, sizes, member tables, .npy headers, .cls and .json against the index; "
    "no sha256, .npy checksums or mean/std (the pixels are not read).",
)
@click.option(
    "--scan", is_flag=True, help="No index: check the tars' structure, .npy headers and unique keys against each other."
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Threads checking shards at once. Default: twice this machine's cores (reads and hashing overlap).",
)
@click.option(
    "--threads", "old_threads", cls=DeprecatedAlias, new="--workers", dest="workers", type=click.IntRange(min=1)
)
@click.option(
    "--no-stats",
    is_flag=True,
    help="Do not recompute mean/std from the pixels (about a third less CPU for a full verify); they are "
    "then only compared with splits.train's.",
)
@click.option(
    "--allow-mixed",
    is_flag=True,
    help="Accept shards of different datasets (index.json files of another dataset_version, classes, "
    "size or build), refused by default with a message naming both; they can only be read as one "
    "set with --scan, as any reader of the tars would see them.",
)
@click.option(
    "--no-leakage",
    is_flag=True,
    help="Also fail when near-duplicate images (wds-tools dups, default threshold) sit in more than one "
    "split; off by default, since some teams keep deliberate copies.",
)
@click.option(
    "--phash",
    is_flag=True,
    help="Also recompute each sample's perceptual hashes (samples.npz phash, format version 3) from its pixels "
    "and report those that differ from the index; about doubles a full verify's time.",
)
@json_option("the report")
@quiet_option
def verify(
    path: str | None,
    out: str,
    quick: bool,
    scan: bool,
    workers: int | None,
    no_stats: bool,
    allow_mixed: bool,
    no_leakage: bool,
    phash: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Check that every shard is intact; exit non-zero and name the bad shards and samples if not.

    PATH is a shards folder (shards/v1/224), its index.json, or a shard pattern
    (shards/v1/224/train-{000000..000041}.tar), local or a URL (s3://bucket/shards/v1/224,
    https://host/shards/v1/224/index.json). Default: the newest OUT/<version>/<size>/.

    Checks index.json against itself (every field and its type, counts, splits, URL patterns,
    shard names inside the folder) and against samples.npz, and every shard against both: size
    and sha256, every member's name, offset and length, every .npy header (dtype |u1, shape
    [S, S, 3]) and XXH3-64, each sample's label (.cls), class name, key, fingerprint, width,
    height and source path (.json), every key exactly once, and mean/std recomputed from the
    pixels. A missing, truncated or altered shard or index field is reported by name. Shards of
    different datasets are refused (see --allow-mixed); a pattern naming only some shards of a
    split checks those, with a warning naming the shards it leaves out.

    \b
    Examples:
      wds-tools verify shards/v1/224
      wds-tools verify --quick                             # newest version under ./shards
      wds-tools verify "shards/v1/224/val-{000000..000003}.tar" --json
      wds-tools verify old-shards/ --scan                  # no index.json there
      wds-tools verify "shards/v1/224::shards/v2/224" --scan --allow-mixed   # both as one set: duplicate keys
      wds-tools verify https://host/shards/v1/224/index.json --quick
    """
    from .inspect.verify import verify as run_verify

    try:
        report = run_verify(
            path,
            out=out,
            quick=quick,
            scan=scan,
            workers=workers,
            stats=not no_stats,
            allow_mixed=allow_mixed,
            progress=not quiet,
            no_leakage=no_leakage,
            phash=phash,
        )
    except WdsToolsError as e:
        fail(e)
    _emit(report, as_json)
    if not report.ok:
        sys.exit(int(ExitCode.DATA))


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
    except Interrupted as e:
        _interrupted(e.signum, "stopped before it finished; run the same command again to resume.")


if __name__ == "__main__":
    main()
