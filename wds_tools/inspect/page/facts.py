"""The page's figures, from index.json, samples.npz and errors.jsonl (no shard is read here), as plain values
(dicts, lists, SVG text) that the template lays out; the caps (``MAX_*``) keep the page small whatever the
dataset's size, and each cut is said on the page."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ...format.meta import MetaValues
from ...format.model import IndexMeta
from ...storage.transport import join, read_bytes
from ..stats.figures import StatsReport, group_report, plural
from . import charts

__all__ = [
    "MAX_CHART_CATEGORIES",
    "MAX_TABLE_ROWS",
    "MAX_FAILED",
    "MAX_COLUMNS",
    "MAX_RANKS",
    "IDENTIFIER_VALUES",
    "CLIP",
    "clip",
    "HISTOGRAM_INTS",
    "MAX_BINS",
    "Warn",
    "conversion",
    "read_errors",
    "share_rule",
    "splits_section",
    "metadata_section",
    "shards_section",
    "epoch_section",
]

MAX_CHART_CATEGORIES = 20
"""Classes or values a bar chart shows, the most frequent; the rest are one bar ("other")."""
MAX_TABLE_ROWS = 200
"""Rows of a class table (the most frequent classes); the page says how many it leaves out."""
MAX_FAILED = 200
"""Failed files the page lists (errors.jsonl has them all)."""
MAX_COLUMNS = 24
"""Metadata columns drawn; the page names the others."""
MAX_RANKS = 16
"""Ranks (and workers per rank) of the epoch table."""
IDENTIFIER_VALUES = 200
"""A string column with more distinct values than this, or with more than ``MAX_CHART_CATEGORIES`` of which
most rows hold one of their own (distinct values over half the rows), is an identifier (a patient, a
lesion): not drawn; the page counts its values found in more than one split."""
MAX_BINS = 30
"""Bins of a metadata histogram at most (the square root of the rows, at least 5)."""
HISTOGRAM_INTS = 20
"""An int column with more distinct values than this is drawn as a histogram, else as bars."""
_NAMED = 8  # classes or values one warning names
CLIP = 60
"""Characters of a value (a metadata value, a class name) in a tooltip or a warning; longer ones are cut."""


@dataclass
class Warn:
    """A warning on the page, in the section (its anchor) it is about."""

    section: str
    text: str
    label: str = ""  # the link's text on the summary (default: the section's anchor)


def clip(text: object, most: int = CLIP) -> str:
    """``text`` as a string of at most ``most`` characters (cut with an ellipsis): a free-text value must not
    swell the page (it is repeated in tooltips and warnings)."""
    t = str(text)
    return t if len(t) <= most else t[: most - 1] + "…"


# ------------------------------------------------------------------ the conversion


def read_errors(folder: str, info: IndexMeta) -> tuple[list[dict], list[dict], list[str]]:
    """(failed files, warnings such as narrow pixels, problems reading the file) of errors.jsonl."""
    if info.errors_file is None:
        return [], [], []
    url = join(folder, info.errors_file)
    try:
        data = read_bytes(url)
    except FileNotFoundError:
        return [], [], [f"{url}: index.json names it but it is missing; the failed files cannot be listed"]
    except OSError as e:
        return [], [], [f"{url}: cannot read it ({e.strerror or e}); the failed files cannot be listed"]
    failed, warned, problems = [], [], []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            problems.append(f"{url} line {n}: not JSON; skipped")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{url} line {n}: not a JSON object; skipped")
        elif "error" in obj:
            failed.append(obj)
        else:
            warned.append(obj)
    return failed, warned, problems


def conversion(folder: str, info: IndexMeta, failed: list[dict], warned: list[dict]) -> dict:
    """What was converted, from what, how: the facts index.json records, and the counts."""
    b, d = info.build, info.decode
    rows = b.source.rows if b is not None and b.source is not None else None
    return {
        "folder": folder,
        "dataset_version": info.dataset_version,
        "size": info.size,
        "format_version": info.format_version,
        "created_by": info.created_by,
        "source_path": b and b.source_path,
        "source_kind": b.source.kind if b is not None and b.source is not None else None,
        "rows": rows,
        "samples": info.samples,
        "failed": len(failed),
        # rows neither written nor listed as failed: none in a conversion that kept its errors.jsonl
        "unaccounted": rows - info.samples - len(failed) if rows is not None else None,
        "narrow": len(warned),
        "resize": info.resize,
        "filter": d and d.filter,
        "draft": d and d.draft,
        "pad_fill": d and list(d.pad_fill),
        "alpha_background": d and list(d.alpha_background),
        "max_pixels": d and d.max_pixels,
        "colour": d.colour if d is not None else "raw",
        "colour_recorded": d is not None and "colour" in d.raw,
        "decoder_versions": dict(info.decoder_versions or {}),
        "shard_size": b and b.shard_size,
        "seed": b and b.seed,
        "val_fraction": b and b.val_fraction,
        "split_column": (b.columns or {}).get("split") if b is not None else None,
        "group": info.group,
        "stratify": b is not None and b.stratify,
        "dedup": b and b.dedup,
        "base": b and b.base,
        "split_base": b and b.split_base,
        "failed_list": failed[:MAX_FAILED],
        "failed_left_out": max(0, len(failed) - MAX_FAILED),
    }


# ------------------------------------------------------------------ the split rule


def share_rule(
    names: list[str], counts: np.ndarray, split_names: list[str], what: str, *, every_missing: bool
) -> list[str]:
    """Warnings for values (classes, or a column's values) that a split lacks or holds too few or too many of.

    ``counts`` is [values, splits]. For a split s holding a share f of all samples and a value with n
    samples in all: *missing* when s has none of it although n·f >= 2 (with ``every_missing``, as for
    classes, whenever n > 0); *share* when n·f >= 2 and the value's share in s, n_s / n, is outside
    f ± max(0.05, f / 2): convert's rule for the val split (docs/FORMAT.md, Splits per group), applied to
    every split with its own share.
    """
    counts = np.asarray(counts, np.int64).reshape(len(names), len(split_names))
    total = int(counts.sum())
    out: list[str] = []
    if total == 0:
        return out
    whole = counts.sum(axis=1)
    for j, s in enumerate(split_names):
        f = counts[:, j].sum() / total
        if f == 0:
            continue
        tol = max(0.05, f / 2)
        expected = whole * f
        missing = (counts[:, j] == 0) & (whole > 0) & ((expected >= 2) | every_missing)
        share = np.divide(counts[:, j], whole, out=np.zeros(len(whole)), where=whole > 0)
        off = ~missing & (expected >= 2) & (np.abs(share - f) > tol)
        gone = [clip(names[i]) for i in np.flatnonzero(missing)]
        if gone:
            more = f" and {len(gone) - _NAMED:,} more" if len(gone) > _NAMED else ""
            out.append(
                f"{s}: no sample of {plural(len(gone), what)} ({', '.join(gone[:_NAMED])}{more}) although "
                f"{s} holds {f:.1%} of the samples"
            )
        far = [f"{clip(names[i])} {share[i]:.1%}" for i in np.flatnonzero(off)]
        if far:
            more = f" and {len(far) - _NAMED:,} more" if len(far) > _NAMED else ""
            out.append(
                f"{s}: the share of {plural(len(far), what)} found in {s} is outside {f:.1%} ± {tol:.1%} "
                f"(the split's share of all samples): {', '.join(far[:_NAMED])}{more}"
            )
    return out


# ------------------------------------------------------------------ splits and classes


def splits_section(report: StatsReport, chart_id: str = "classes") -> tuple[dict, list[Warn]]:
    """Each split's samples, shards and bytes; the classes per split as a chart of shares and a table."""
    names = list(report.splits)
    total = report.samples
    rows = [
        {
            "name": s,
            "samples": sp.samples,
            "shards": sp.shards,
            "bytes": int(sp.shard_bytes.sum()),
            "share": sp.samples / total if total else 0.0,
        }
        for s, sp in report.splits.items()
    ]
    n_classes = len(report.classes)
    counts = (
        np.stack([sp.class_counts for sp in report.splits.values()], axis=1)
        if names
        else np.zeros((n_classes, 0), np.int64)
    )
    whole = counts.sum(axis=1) if names else np.zeros(n_classes, np.int64)
    by_size = np.argsort(-whole, kind="stable")
    shown = sorted(by_size[:MAX_TABLE_ROWS].tolist())  # the most frequent, in class order
    split_totals = counts.sum(axis=0)
    table = [
        {
            "name": report.classes[c],
            "counts": [int(x) for x in counts[c]],
            "shares": [float(counts[c, j] / split_totals[j]) if split_totals[j] else 0.0 for j in range(len(names))],
            "total": int(whole[c]),
        }
        for c in shown
    ]
    chart = None
    if names and n_classes:
        cats, shares = _top_shares(report.classes, counts, split_totals)
        series = {names[j]: v for j, v in shares.items()}
        chart = charts.bars(cats, series, chart_id=chart_id, ylabel="share of the split", percent=True)
    warns = [Warn("splits", w) for w in share_rule(report.classes, counts, names, "class", every_missing=True)]
    return {
        "splits": rows,
        "split_names": names,
        "classes": table,
        "classes_left_out": n_classes - len(shown),
        "n_classes": n_classes,
        "chart": chart,
    }, warns


def _top_shares(labels: list[str], counts: np.ndarray, split_totals: np.ndarray) -> tuple[list[str], dict]:
    """The ``MAX_CHART_CATEGORIES`` most frequent rows of ``counts`` [values, splits] (the rest summed as
    "other (N)"), as each split's shares."""
    whole = counts.sum(axis=1)
    order = np.argsort(-whole, kind="stable")
    top = order[:MAX_CHART_CATEGORIES]
    if len(labels) <= MAX_CHART_CATEGORIES:
        top = np.arange(len(labels))  # few: in their own order
    cats = [labels[i] for i in top]
    rows = counts[top]
    rest = order[MAX_CHART_CATEGORIES:]
    if len(rest):
        cats.append(f"other ({len(rest):,})")
        rows = np.vstack([rows, counts[rest].sum(axis=0, keepdims=True)])
    denom = np.where(split_totals > 0, split_totals, 1)
    names = list(range(counts.shape[1]))
    return cats, {j: (rows[:, j] / denom[j]).tolist() for j in names}


# ------------------------------------------------------------------ metadata


def metadata_section(
    values: dict[str, MetaValues], row_split: np.ndarray, split_names: list[str], group: str | None
) -> tuple[list[dict], list[str], list[Warn]]:
    """Per metadata column (``MAX_COLUMNS`` at most): a chart of its values per split (bars for categories,
    a histogram for numbers), missing values per split, and the split rule's warnings; an identifier-like
    column (and the ``group`` column) is counted, not drawn: its values found in more than one split.
    Returns (columns, names of the columns left out, warnings)."""
    cols: list[dict] = []
    warns: list[Warn] = []
    k = len(split_names)
    split_totals = np.bincount(row_split, minlength=k) if k else np.zeros(0, np.int64)
    names = list(values)
    for i, name in enumerate(names[:MAX_COLUMNS]):
        v = values[name]
        missing = np.bincount(row_split[v.missing], minlength=k) if k else np.zeros(0, np.int64)
        col: dict = {
            "name": name,
            "type": v.column.type,
            "missing": [int(x) for x in missing],
            "anchor": f"column-{i}",
        }
        ids, distinct = v.factorize()
        n = len(distinct)
        col["distinct"] = n
        is_id = name == group or (
            v.column.type == "string" and (n > IDENTIFIER_VALUES or (n > MAX_CHART_CATEGORIES and 2 * n > len(v)))
        )
        numeric = v.column.type == "float" or (v.column.type == "int" and n > HISTOGRAM_INTS)
        if is_id:
            g = group_report(v, row_split, split_names)
            col["kind"] = "identifier"
            col["in_several"] = len(g.in_several)
            col["in_several_examples"] = [clip(x["group"]) for x in g.in_several[:_NAMED]]
            if g.in_several:
                ex = ", ".join(col["in_several_examples"])
                warns.append(
                    Warn(
                        col["anchor"],
                        f"column {name!r}: {plural(len(g.in_several), 'value')} found in more than one split "
                        f"(e.g. {ex})" + (" — the column the splits were drawn by" if name == group else ""),
                        "metadata",
                    )
                )
        elif numeric and n:
            present = ~v.missing
            x = v.values[present].astype(np.float64)
            lo, hi = float(x.min()), float(x.max())
            bins = min(MAX_BINS, max(5, int(np.sqrt(len(x)))))  # a bin per ~sqrt(n) samples: few rows, few bins
            edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
            series = {}
            for j, s in enumerate(split_names):
                mine = x[row_split[present] == j]
                series[s] = np.histogram(mine, edges)[0] / split_totals[j] if split_totals[j] else np.zeros(bins)
            col["kind"] = "histogram"
            col["range"] = (lo, hi)
            col["chart"] = charts.histogram(edges, series, chart_id=f"meta-{i}", xlabel=name)
        elif n:
            counts = np.zeros((n, k), np.int64)
            present = ids >= 0
            np.add.at(counts, (ids[present], row_split[present]), 1)
            labels = [str(d) for d in distinct]
            cats, shares = _top_shares(labels, counts, split_totals)
            col["kind"] = "bars"
            col["chart"] = charts.bars(
                cats,
                {split_names[j]: s for j, s in shares.items()},
                chart_id=f"meta-{i}",
                ylabel="share of the split",
                percent=True,
            )
            for w in share_rule(labels, counts, split_names, "value", every_missing=False):
                warns.append(Warn(col["anchor"], f"column {name!r}: {w}", "metadata"))
        else:
            col["kind"] = "empty"
        cols.append(col)
    return cols, names[MAX_COLUMNS:], warns


# ------------------------------------------------------------------ shards and the epoch


def shards_section(report: StatsReport) -> dict:
    """Samples and bytes per shard, per split: two charts and each split's spread (``stats``' figures)."""
    d = report.to_dict()
    rows = []
    for s, sp in d["splits"].items():
        rows.append(
            {
                "name": s,
                "shards": sp["shards"],
                "samples": sp["samples_per_shard"],
                "bytes": sp["bytes_per_shard"],
                "drift": sp["class_drift"],
            }
        )
    samples = {s: sp.shard_samples for s, sp in report.splits.items()}
    sizes = {s: sp.shard_bytes / 1e6 for s, sp in report.splits.items()}
    has = any(len(v) for v in samples.values())
    return {
        "rows": rows,
        "samples_chart": charts.per_shard(samples, chart_id="shard-samples", ylabel="samples") if has else None,
        "bytes_chart": charts.per_shard(sizes, chart_id="shard-bytes", ylabel="MB") if has else None,
        "as_histogram": sum(len(v) for v in samples.values()) > charts.MAX_BARS,
    }


def epoch_section(report: StatsReport) -> tuple[dict, list[Warn]]:
    """How the training loader deals each split's epoch to ranks and workers (``stats``' model)."""
    splits = []
    warns = []
    for s, sp in report.splits.items():
        d = sp.distribution
        table = None
        if d.worker_samples is not None:
            table = [row[:MAX_RANKS] for row in d.worker_samples[:MAX_RANKS]]
        splits.append(
            {
                "name": s,
                "mode": d.mode,
                "rank_samples": d.rank_samples[:MAX_RANKS],
                "rank_shards": None if d.rank_shards is None else d.rank_shards[:MAX_RANKS],
                "worker_samples": table,
                "left_out": d.left_out,
                "idle": d.idle_workers,
                "ranks_cut": d.world_size > MAX_RANKS,
                "workers_cut": d.workers > MAX_RANKS,
                "warnings": d.warnings,
            }
        )
        warns += [Warn("epoch", f"{s}: {w}") for w in d.warnings]
    return {
        "reader": report.reader,
        "world_size": report.world_size,
        "workers": report.workers,
        "splits": splits,
    }, warns
