"""The commands over ``wds_tools.inspect`` and the index: ``diff``, ``dups``, ``index``, ``stats``, ``verify``."""

from __future__ import annotations

import sys

import click

from ..errors import install_hint
from ..exitcodes import ExitCode
from ..similar.near import DEFAULT_THRESHOLD, MAX_THRESHOLD
from .common import Command, epoch_split_options, json_option, path_and_out, quiet_option
from .group import cli, emit

__all__ = ["diff", "dups", "index_files", "stats", "verify"]


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
    Each relabeled key is listed with its old and new label (--json: "relabels").

    \b
    Example:
      wds-tools diff shards/v1/224 shards/v2/224
    """
    from ..inspect.diff import diff_versions

    result = diff_versions(old, new)
    emit(result, as_json, limit=limit)


@cli.command(cls=Command)
@path_and_out
@click.option(
    "--threshold",
    type=click.IntRange(min=0),
    default=None,
    help="Largest Hamming distance (bits of the 64-bit perceptual hashes: one image's whole-image hash, "
    "under its flips and quarter turns, against the other's whole-image or window hashes) between "
    f"near-duplicates, 0 to {MAX_THRESHOLD}. Default: {DEFAULT_THRESHOLD}, the largest with precision >= 0.99 "
    "on scripts/bench_dups.py's set that keeps the search to one-bit probes (docs/guide/figures.md). "
    f"Above {MAX_THRESHOLD} it is refused: the search would probe seven times as many buckets per hash or "
    "more, and unrelated photos come that near (precision 0.987 at 11). A long search shows its progress "
    "on stderr.",
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
    OUT/<version>/<size>/. Candidates: every sample's whole-image perceptual hash (samples.npz phash,
    docs/FORMAT.md), under its eight flips and quarter turns, is compared with every other's hashes
    of the whole image and of six windows (for slightly cropped copies; an edge window against the
    other's centre, for shifted ones), and each distinct hash keeps its 32 nearest within --threshold
    bits. Each sample's 8 candidates nearest by a coarse look are then checked on their stored pixels
    (read for the candidates only): colours that agree (the mean chroma of each quarter; a grey
    picture agrees with any) and grey images that, aligned by a scale and shift (crops to 85%,
    shifts) and mapped by a brightness curve, differ by little more than a recompression leaves.
    A cluster is a representative and the samples that passed the check against it (never a chain);
    each member's line shows its distance and score against the representative. A cluster is
    CROSS-SPLIT when its samples sit in more than one split (leakage), LABEL-CONFLICT when they
    carry different labels, CROSS-GROUP when they have different values of the group column (e.g.
    one lesion filed under two lesion ids). A flat picture (fewer than 16 of its hash's bits from
    firm DCT coefficients) or a smooth one (its detail the sum of four patterns or fewer: a colour
    grid interpolated, soft blobs, a blurred photo; docs/FORMAT.md) is too flat to hash: it is
    listed, and searched by its hashes as they are, which a copy may not share. Indexes of format
    versions 1 and 2 have no hash column, and one written before index.json recorded
    phash_flat_rules has flags from older rules: the hashes are computed from the stored pixels.

    \b
    Examples:
      wds-tools dups shards/v1/224
      wds-tools dups shards/v1/224 --group lesion_id --plot dups.png
      wds-tools dups clinic/v1/224 --across ham10000/v1/224 --json
    """
    from ..dataset.resolve import newest_dataset
    from ..similar.dups import find_dups, plot_dups

    result = find_dups(
        path if path is not None else newest_dataset(out),
        threshold=DEFAULT_THRESHOLD if threshold is None else threshold,
        across=across,
        group=group,
        progress=not quiet,
    )
    if plot_path:
        plot_dups(result, plot_path)
    emit(result, as_json, limit=limit)
    if plot_path and not as_json and not quiet:
        click.echo(f"\ncontact sheet written to {plot_path}")


@cli.command("index", cls=Command)
@path_and_out
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
    from ..convert.reindex import write_reader_indexes
    from ..dataset.resolve import newest_dataset

    if not wids and not dali:
        wids = dali = True
    result = write_reader_indexes(path if path is not None else newest_dataset(out), wids=wids, dali=dali)
    emit(result, as_json)


# ---------------------------------------------------------------- stats and verify


@cli.command(cls=Command)
@path_and_out
@epoch_split_options
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
    help="Also draw samples per shard and a class-share heatmap into this PNG. Needs matplotlib: "
    f"{install_hint('plot')}.",
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
    from ..inspect.stats import compute_stats
    from ..inspect.stats.plot import plot_stats, require_matplotlib

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
        progress=not quiet,
    )
    if plot_path:
        plot_stats(report, plot_path)
    emit(report, as_json)
    if plot_path and not as_json and not quiet:
        click.echo(f"\nplot written to {plot_path}")


@cli.command(cls=Command)
@path_and_out
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
    "split; off by default, since some teams keep deliberate copies. It reads the stored pixels of the "
    "samples the hashes pair, for their colour, even with --quick.",
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
    from ..inspect.verify import verify as run_verify

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
    emit(report, as_json)
    if not report.ok:
        sys.exit(int(ExitCode.DATA))
