"""The ``report`` command: one HTML page about a converted folder (``wds_tools.inspect.page``)."""

from __future__ import annotations

import click

from .common import Command, epoch_split_options, json_option, path_and_out, quiet_option
from .group import cli, emit

__all__ = ["report"]


@cli.command(cls=Command)
@path_and_out
@click.option(
    "--output",
    "-o",
    "output",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="The page to write. Default: report-<version>-<size>.html in the working directory. A file there "
    "is replaced (written to a temporary name, then renamed), as stats --plot and dups --plot do.",
)
@click.option(
    "--against",
    default=None,
    metavar="OLD",
    help="An earlier version's folder to compare with (added, removed, relabelled samples). Default: the "
    "version this one was built from (its pixels were copied from it), if any.",
)
@click.option(
    "--dups/--no-dups",
    "dups",
    default=None,
    help="Search near-duplicates (as wds-tools dups). Default: for sets of up to 200,000 samples with "
    "perceptual hashes in their index (format version 3); the search takes about a minute per million "
    "samples, and the page says when it was left out.",
)
@click.option(
    "--thumbs",
    "thumbs_per_class",
    type=click.IntRange(min=0),
    default=12,
    show_default=True,
    help="Thumbnails per class in the sample grid (480 in all at most; 0: none).",
)
@epoch_split_options
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the thumbnails' draw: the same seed, the same samples (and the same page).",
)
@json_option("what was written")
@quiet_option
def report(
    path: str | None,
    out: str,
    output: str | None,
    against: str | None,
    dups: bool | None,
    thumbs_per_class: int,
    world_size: int,
    loader_workers: int | None,
    reader: str,
    seed: int,
    as_json: bool,
    quiet: bool,
) -> None:
    """Write one HTML page about a converted folder, to look at the dataset in a browser.

    PATH is a shards folder (shards/v1/224) or its index.json, local or a URL. Default: the newest
    OUT/<version>/<size>/. The page holds everything inline (charts as SVG, thumbnails as JPEG data
    URIs): it opens from disk, offline, in any browser, and stays under 10 MB whatever the dataset's
    size. It shows the conversion (source, size, resize, colour, converted and failed files with their
    reasons); each split's samples and classes and each metadata column per split, with a warning for
    a class or value a split lacks or holds too much or too little of; thumbnails of a fixed-seed draw
    per class (hover for key and metadata); near-duplicate clusters side by side, cross-split ones
    first; samples and bytes per shard and the loader's epoch split over ranks and workers; and the
    samples added, removed and relabelled against the version it was built from.

    Read: index.json, samples.npz, errors.jsonl and the pixels of the samples shown. The same folder
    and options give the same page. Needs the report extra (Jinja2 and matplotlib; from a checkout,
    pip install -e '.[report]' -c constraints.txt); without it the command says so.

    \b
    Examples:
      wds-tools report shards/v1/224                        # writes report-v1-224.html
      wds-tools report shards/v2/224 -o v2.html --against shards/v1/224
      wds-tools report --no-dups -q                         # the newest version under ./shards
    """
    from ..inspect.page import write_report

    result = write_report(
        path,
        output=output,
        out=out,
        against=against,
        dups=dups,
        thumbs_per_class=thumbs_per_class,
        world_size=world_size,
        workers=loader_workers,
        reader=reader,
        seed=seed,
        progress=not quiet,
    )
    emit(result, as_json)
