"""``wds-tools convert``: its options, then one call of ``wds_tools.convert.convert``."""

from __future__ import annotations

import signal

import click

from ..convert.decode import COLOUR_MODES, RESIZE_MODES, DecodeSettings
from ..convert.runner import EXECUTORS
from ..errors import WdsToolsError
from ..exitcodes import ExitCode
from ..signals import Interrupted, signal_behind
from .common import Command, Failure, fail, json_option, quiet_option
from .group import cli, emit, interrupted

__all__ = ["convert"]


class _Sizes(click.ParamType):
    """--size: 224, or several sizes 224,384 (also a list in wds-tools.toml)."""

    name = "SIZE[,SIZE...]"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | list[int]:
        from ..convert import parse_sizes

        try:
            sizes = parse_sizes(value)
        except WdsToolsError as e:
            self.fail(str(e), param, ctx)
        return sizes[0] if len(sizes) == 1 else sizes


_SIZES = _Sizes()


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
    help="Decoding processes (batches of samples are spread over them whatever the number of shards; "
    "with 1, everything runs in this process). Default: all cores.",
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
    "'images/{image_id}.jpg' (relative to the manifest's folder; '{{' and '}}' for braces). Mixed "
    "extensions: 'images/{image_id}.{jpg,png,heic}' takes the first listed that exists, "
    "'images/{image_id}.*' any image extension. A row whose path names a missing file is skipped and "
    "listed in errors.jsonl, naming a file of the same name with another extension when there is one.",
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
    "version's assignments are kept and new copies follow them; a cluster that would join groups the "
    "earlier version holds in different splits is refused, naming them (--resplit draws all again). "
    "Pictures too flat to hash join nothing and are listed. Decodes every source once more.",
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
    from ..convert import convert as run_convert

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
        interrupted(
            getattr(e, "signum", signal.SIGINT), "finished shards are kept; run the same command again to resume."
        )
    except Exception as e:  # the consequence of a signal (signals.signal_behind), a user's error, or a bug
        signum = signal_behind(e)
        if signum is not None:
            interrupted(signum, "finished shards are kept; run the same command again to resume.")
        if isinstance(e, WdsToolsError):
            fail(e)
        raise
    emit(result, as_json)
    for r in getattr(result, "results", [result]):
        if r.max_errors_exceeded:
            raise Failure(
                f"{r.failed} source files failed, more than --max-errors allows ({r.max_errors_allowed}); "
                f"see {r.errors_file}",
                ExitCode.DATA,
            )
