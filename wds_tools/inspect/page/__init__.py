"""``wds-tools report``: one self-contained HTML page about a converted folder (a version at one size).

``write_report``: the index (``facts``, with ``inspect.stats``' report) -> thumbnails per class (``thumbs``)
-> near-duplicates and the changes against the base version (``evidence``) -> inline SVG charts (``charts``)
-> the page (``render``, Jinja2), written atomically; the same folder and options give the same bytes.
Needs the ``report`` extra (docs/guide/report.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from ...dataset.resolve import resolve_target
from ...errors import OptionError, unwritable_file_error
from ...format.index import read_sample_table
from ...format.meta import MetaValues, npz_names, read_metadata
from ...format.model import IndexMeta
from ...progress import Delayed
from ...similar.near import PROGRESS_AFTER
from ...storage.fsutil import atomic_write_bytes
from ...storage.transport import join
from ...version import __version__
from ..stats import model_reader
from ..stats.collect import from_index
from . import charts, evidence, facts, render, thumbs

__all__ = ["MAX_PAGE_BYTES", "THUMBS_PER_CLASS", "GRID_LIMIT", "ReportResult", "write_report", "default_output"]

MAX_PAGE_BYTES = 10_000_000
"""The page's size at most, whatever the dataset's: thumbnails are capped (``thumbs.THUMB_BYTES``) and so
are the tables and charts (``facts.MAX_*``, ``evidence.MAX_*``)."""
THUMBS_PER_CLASS = 12
"""Thumbnails per class in the sample grid, by default."""
GRID_LIMIT = 480
"""Thumbnails in the sample grid at most: with many classes, fewer per class (at least one), and past
this many classes the first ones only (the page says how many it leaves out)."""

_STEPS = 9  # the step() calls of write_report


@dataclass
class ReportResult:
    """What ``write_report`` wrote: the page, its size and what it shows."""

    path: str
    folder: str
    dataset_version: str | None
    size: int | None
    bytes: int
    replaced: bool  # a file was at path before (replaced, as stats --plot and dups --plot do)
    samples: int
    thumbnails: int  # shown on the page
    thumbnails_left_out: int  # over the page's thumbnail budget: named, not shown
    duplicates: str  # "searched" or why not
    compared_with: str | None
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """The result as plain JSON types (``--json``)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"seconds": round(self.seconds, 3)}

    def to_text(self) -> str:
        """A line saying where the page is, then its warnings."""
        lines = [
            f"report of {self.folder} ({self.samples:,} samples) {'replaced' if self.replaced else 'written'}: "
            f"{self.path} ({self.bytes / 1e6:.1f} MB, {self.thumbnails:,} thumbnails"
            + (f", {self.thumbnails_left_out:,} left out by the size cap" if self.thumbnails_left_out else "")
            + ")",
            f"  near-duplicates: {self.duplicates}",
        ]
        if self.compared_with:
            lines.append(f"  compared with {self.compared_with}")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def default_output(info: IndexMeta) -> str:
    """``report-<version>-<size>.html``, in the working directory: one page per converted folder."""
    return f"report-{info.dataset_version}-{info.size}.html"


def write_report(
    path: str | os.PathLike | None = None,
    *,
    output: str | os.PathLike | None = None,
    out: str | os.PathLike = "shards",
    against: str | os.PathLike | None = None,
    dups: bool | None = None,
    thumbs_per_class: int = THUMBS_PER_CLASS,
    world_size: int = 1,
    workers: int | None = None,
    reader: str = "auto",
    seed: int = 0,
    progress: bool = False,
) -> ReportResult:
    """Write one self-contained HTML page about a converted folder: the conversion, each split's classes and
    metadata, thumbnails per class, near-duplicates, shard balance and the epoch split, and the changes
    against the version it was built from. Charts are inline SVG and thumbnails inline JPEG data URIs:
    the page opens from disk in any browser, with no network.

    Read: index.json, samples.npz, errors.jsonl and the pixels of the samples shown (never a whole shard).

    Args:
        path: A shards folder (OUT/<version>/<size>) or its index.json, local or a URL; None: the newest
            version under ``out``.
        output: The page's path; None: ``report-<version>-<size>.html`` in the working directory. A file
            there is replaced (atomically), as ``stats --plot`` and ``dups --plot`` do.
        out: The root folder searched for the newest version when ``path`` is None.
        against: An earlier version's folder to compare with; None: the version this one was built from
            (index.json ``build.base``), if any.
        dups: Search near-duplicates: None for sets of format version 3 up to ``evidence.DUPS_LIMIT``
            samples (the page says how to run it on larger ones), True always, False never.
        thumbs_per_class: Thumbnails per class in the sample grid (at most ``GRID_LIMIT`` in all).
        world_size: The ranks of the training run whose epoch split is shown (as ``stats``).
        workers: DataLoader workers per rank in that model; None: the usable CPUs (as ``stats``).
        reader: The training reader modelled (``stats``' ``reader``).
        seed: The seed of the thumbnails' draw: the same seed, the same samples.
        progress: Show the steps on stderr once the report has run 2 s.

    Returns:
        A ``ReportResult``; its ``to_dict()`` is the ``--json`` output.

    Raises:
        ExtraNotInstalledError: Jinja2 or matplotlib is missing (the ``report`` extra).
        OptionError: An option out of range, or a path naming some shards rather than a folder.
        IndexFormatError: No readable index at ``path``.
        ShardError: A shard the thumbnails are read from is missing or cut short.
        ReadOnlyOutputError: The page cannot be written at ``output``.
    """
    t0 = time.perf_counter()
    render.require_jinja2()
    charts.require_matplotlib()
    if isinstance(thumbs_per_class, bool) or not isinstance(thumbs_per_class, int) or thumbs_per_class < 0:
        raise OptionError(f"thumbs_per_class {thumbs_per_class!r}: expected an integer >= 0")
    from ...cpus import usable_cpus

    workers = usable_cpus() if workers is None else workers
    if reader not in ("auto", "index", "stream"):
        raise OptionError(f"reader {reader!r}: expected auto, index or stream (make_loader's reader=)")
    target = resolve_target(path, out=out)
    if target.selected or target.info is None or target.index_base is None:
        raise OptionError(
            f"{target.spec}: a report is of a whole converted folder; give the folder (OUT/<version>/<size>) or "
            "its index.json, not a shard pattern"
        )
    step = Delayed(_STEPS, "report", "step", enabled=progress, after=PROGRESS_AFTER)
    folder, info = target.index_base, target.info
    dest = os.fspath(output) if output is not None else default_output(info)
    try:
        report = from_index(
            target, world_size, workers, None, None, model_reader(target, False) if reader == "auto" else reader
        )
        step()
        names = [c.name for c in info.metadata]
        arrays = [a for i, c in enumerate(info.metadata) for a in npz_names(i, c.type)]
        table = read_sample_table(folder, info, ("key", "label", "shard", "npy_offset", *arrays))
        label = table.label
        split_of = np.array([list(report.splits).index(s.split) for s in info.shards], np.int64)
        row_split = split_of[table.shard]
        failed, warned, problems = facts.read_errors(folder, info)
        warns = [facts.Warn("conversion", p) for p in problems]
        conv = facts.conversion(folder, info, failed, warned)
        if conv["unaccounted"]:
            warns.append(
                facts.Warn(
                    "conversion",
                    f"{conv['unaccounted']:,} source rows are neither converted nor listed as failed in errors.jsonl",
                )
            )
        step()
        splits, w = facts.splits_section(report)
        warns += w
        step()
        values = read_metadata(table.columns, info.metadata, names, join(folder, info.samples_file.name))
        columns, columns_left_out, w = facts.metadata_section(values, row_split, list(report.splits), info.group)
        warns += w
        step()
        budget = thumbs.Budget()
        pixels = evidence.folder_pixels(folder, info, table)
        grid, grid_note = _grid(
            report.classes, label, row_split, list(report.splits), values, pixels, budget, thumbs_per_class, seed
        )
        step()
        dup, w = evidence.dups_section(folder, info, dups, budget, progress=progress)
        warns += w
        step()
        versions, w = evidence.versions_section(folder, info, table, against, budget)
        warns += w
        step()
        shards = facts.shards_section(report)
        epoch, w = facts.epoch_section(report)
        warns += w
        step()
        context = {
            "version": __version__,
            "conversion": conv,
            "narrow": warned[: facts.MAX_FAILED],
            "stats": report.to_dict(),
            "splits": splits,
            "columns": columns,
            "columns_left_out": columns_left_out,
            "grid": grid,
            "grid_note": grid_note,
            "dups": dup,
            "versions": versions,
            "shards": shards,
            "epoch": epoch,
            "warnings": warns,
            "budget": budget,
            "thumb_px": thumbs.THUMB_PX,
        }
        html = render.render_page(context).encode("utf-8")
        step()
    finally:
        step.close()
    if len(html) > MAX_PAGE_BYTES:  # the caps keep it under; a page over it is a bug, not a page to write
        raise AssertionError(f"the report page came to {len(html):,} bytes, over {MAX_PAGE_BYTES:,}")
    replaced = os.path.exists(dest)
    try:
        atomic_write_bytes(dest, html)  # never a half-written page at dest
    except OSError as e:
        raise unwritable_file_error(dest, e, "the report") from None
    return ReportResult(
        path=dest,
        folder=folder,
        dataset_version=info.dataset_version,
        size=info.size,
        bytes=len(html),
        replaced=replaced,
        samples=report.samples,
        thumbnails=budget.shown,
        thumbnails_left_out=budget.refused,
        duplicates=dup["skipped"] or "searched",
        compared_with=versions.get("old"),
        warnings=[w.text for w in warns],
        seconds=time.perf_counter() - t0,
    )


def _grid(
    classes: list[str],
    label: np.ndarray,
    row_split: np.ndarray,
    split_names: list[str],
    values: dict[str, MetaValues],
    pixels: thumbs.Pixels,
    budget: thumbs.Budget,
    per_class: int,
    seed: int,
) -> tuple[list[dict], str]:
    """The sample grid: per class, a fixed-seed draw of its samples (``thumbs.draw_per_class``)."""
    n = len(classes)
    if n == 0 or per_class == 0:
        return [], "" if per_class else "no thumbnails (--thumbs 0)"
    per = max(1, min(per_class, GRID_LIMIT // n))
    shown = min(n, GRID_LIMIT // per)
    drawn = thumbs.draw_per_class(label, n, per, seed)[:shown]
    rows = [int(r) for d in drawn for r in d]
    got = pixels.read(rows, "for the sample grid")
    per_label = np.bincount(label, minlength=n)
    grid = []
    for c, d in enumerate(drawn):
        titles = []
        for r in d.tolist():
            meta = "".join(f"\n{facts.clip(name, 40)}: {facts.clip(_value(v, r))}" for name, v in values.items())
            titles.append(f"{pixels.key(r)}\nsplit: {split_names[row_split[r]]}\nlabel: {facts.clip(classes[c])}{meta}")
        grid.append(
            {
                "name": classes[c],
                "samples": int(per_label[c]),
                "thumbs": thumbs.thumbs_of(
                    [pixels.key(r) for r in d.tolist()], [got[r] for r in d.tolist()], titles, budget
                ),
            }
        )
    note = ""
    if per < per_class:
        note = f"{per} per class (not {per_class}): {n:,} classes, at most {GRID_LIMIT:,} thumbnails in the grid"
    if shown < n:
        note += f"; the first {shown:,} classes shown, {n - shown:,} left out"
    return grid, note


def _value(v: MetaValues, r: int) -> str:
    x = v.value(r)
    return "missing" if x is None else str(x)
