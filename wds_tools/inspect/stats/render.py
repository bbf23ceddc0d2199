"""The text ``wds-tools stats`` prints, rendered from a report's ``to_dict()`` (its ``--json``), so
text and JSON cannot disagree; ``plot`` draws the same report."""

from __future__ import annotations

import unicodedata

__all__ = [
    "TEXT_CLASSES",
    "TEXT_VALUES",
    "TEXT_GROUPS",
    "render_text",
    "render_metadata",
    "even_text",
    "group_warnings",
    "display_width",
    "printable",
    "pad",
    "size_text",
    "num",
]

TEXT_CLASSES = 20
"""Classes listed in the text table; ``--json`` has them all."""
TEXT_VALUES = 30
"""Values of a ``--by`` column listed per split in the text output; ``--json`` has them all."""
TEXT_GROUPS = 10
"""Groups found in several splits listed in the text output."""


def even_text(below: int | None, above: int) -> str:
    """The nearest shard counts that divide evenly over the readers, as words ("6 or 8")."""
    return f"{above}" if below in (None, above) else f"{below} or {above}"


def group_warnings(column: str, in_several: list[dict]) -> list[str]:
    """One warning per group of ``column`` found in more than one split, naming the splits."""
    return [
        f"group {g['group']!r} of column {column!r} is in {len(g['splits'])} splits: "
        + ", ".join(f"{s} ({n:,})" for s, n in g["splits"].items())
        for g in in_several
    ]


def size_text(n: float | int | None) -> str:
    """Bytes in B, kB, MB or GB ("-": unknown); the report page's ``bytes`` filter too."""
    if n is None:
        return "-"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:,.1f} {unit}"
    return f"{int(n):,} B"


def num(x: object) -> str:
    """A count with thousands separators, a fraction to 3 (or 1) decimals, "-" for None; the page's ``num``."""
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.3f}" if abs(x) < 10 else f"{x:,.1f}"
    if isinstance(x, (int, float)):
        return f"{int(x):,}"
    return str(x)


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(display_width(r[c]) for r in rows) for c in range(len(rows[0]))]
    return [indent + "  ".join(pad(cell, widths[c], left=c == 0) for c, cell in enumerate(r)).rstrip() for r in rows]


READER_TEXT = {
    "index": "the index reader (make_loader's default where an index lists the shards): samples dealt "
    "to ranks, batches to workers; any number of workers per shard count",
    "stream": "the streaming reader: whole shards dealt to ranks, then to each rank's workers",
}


def _distribution_lines(dist: dict) -> list[str]:
    """The per-epoch lines of one split's distribution (``report.Distribution.to_dict``)."""
    rn = dist["rank_samples"]
    head = f"  per epoch with {dist['world_size']} rank(s) × {dist['workers']} worker(s), {dist['reader']} reader:"
    if dist["reader"] == "index" and dist["mode"] == "eval":
        low, high = min(rn), max(rn)
        counts = num(low) if low == high else f"{num(low)} to {num(high)}"
        more = sum(x == high for x in rn) if low != high else 0
        return [
            head,
            f"    samples per rank: {counts} (evaluation: every sample once across the ranks"
            + (f"; the first {more} rank(s) read one more)" if more else ")"),
        ]
    if dist["reader"] == "index":
        lines = [head, f"    samples per rank: {num(min(rn))} (training; each rank the same)"]
        if dist["left_out"]:
            lines.append(
                f"    {dist['left_out']:,} sample(s) left out per training epoch (samples % ranks, a different "
                "set each epoch); evaluation reads every sample once"
            )
        return lines
    rs = dist["rank_shards"]
    ws = [x for row in dist["worker_shards"] for x in row]
    wn = [x for row in dist["worker_samples"] for x in row]
    return [
        head,
        *_table(
            [
                ["", "shards min", "max", "samples min", "max"],
                ["per rank", num(min(rs)), num(max(rs)), num(min(rn)), num(max(rn))],
                ["per worker", num(min(ws)), num(max(ws)), num(min(wn)), num(max(wn))],
            ],
            "    ",
        ),
        f"    shard counts that divide evenly over {dist['world_size'] * dist['workers']} "
        f"readers: {even_text(dist['even_shards_below'], dist['even_shards_above'])}",
    ]


def render_text(d: dict, notes: list[str], loud: list[str] | None = None) -> str:
    """The text ``wds-tools stats`` prints, from a report's ``to_dict()``, its notes on the whole report
    and ``loud``, its warnings printed as WARNING first (classes without train or val samples)."""
    lines = []
    classes = d["classes"]
    what = (
        f"{d['dataset_version']}, {d['size']} px"
        if d["dataset_version"]
        else (f"{d['size']} px" if d["size"] else "size unknown")
    )
    src = f"index {d['index']}" if d["source"] == "index" else f"scan of {d['shards']} tars (no index used)"
    lines.append(f"{d['root']}  ({what}; from the {src})")
    lines.append(
        f"  {d['samples']:,} samples in {d['shards']:,} shard{'s' if d['shards'] != 1 else ''}; "
        f"{size_text(d['bytes']['total'])} on disk "
        f"({size_text(d['bytes']['shards'])} shards + {size_text(d['bytes']['index'])} index)"
    )
    if d["mean"]:
        lines.append(
            f"  mean {' '.join(f'{x:.4f}' for x in d['mean'])}   std {' '.join(f'{x:.4f}' for x in d['std'])}"
            f"   (R G B, 0-1, over {d['stats_split']})"
        )
    lines.append(f"  training loader modelled: {READER_TEXT[d['reader']]}")
    lines.append(_metadata_line(d.get("metadata")))
    lines += [f"  WARNING: {w}" for w in loud or ()]
    lines += [f"  warning: {n}" for n in notes]
    for name, sp in d["splits"].items():
        dist = sp["distribution"]
        lines.append("")
        lines.append(
            f"{name}: {sp['samples']:,} samples in {sp['shards']:,} shard{'s' if sp['shards'] != 1 else ''}, "
            f"{size_text(sp['bytes'])}"
        )
        s, b = sp["samples_per_shard"], sp["bytes_per_shard"]
        imb = "-" if s["imbalance"] is None else f"{s['imbalance']:.3f}"
        cv = "-" if s["cv"] is None else f"{s['cv']:.4f}"
        lines += _table(
            [
                ["per shard", "min", "median", "max", "max/min", "cv"],
                ["samples", num(s["min"]), num(s["median"]), num(s["max"]), imb, cv],
                ["bytes", num(b["min"]), num(b["median"]), num(b["max"]), "", ""],
            ]
        )
        drift = sp["class_drift"]
        rows = [["class", "samples", "share"]]
        for c, (count, share) in enumerate(zip(sp["class_counts"], sp["class_share"])):
            if c < TEXT_CLASSES:
                rows.append([printable(classes[c]), f"{count:,}", f"{share * 100:.2f}%"])  # a "\n" stays in its row
        lines += _table(rows)
        if len(classes) > TEXT_CLASSES:
            lines.append(f"  ... {len(classes) - TEXT_CLASSES} more classes (all in --json)")
        if drift["max_pp"] is not None:
            worst = ", ".join(f"{w['shard']} {w['pp']:.1f} pp ({printable(str(w['class']))})" for w in drift["worst"])
            lines.append(
                f"  class drift per shard: max {drift['max_pp']:.2f} pp, median "
                f"{drift['median_pp']:.2f} pp; most: {worst}"
            )
        if sp["mean"]:
            lines.append(
                f"  mean {' '.join(f'{x:.4f}' for x in sp['mean'])}   std {' '.join(f'{x:.4f}' for x in sp['std'])}"
            )
        lines += _distribution_lines(dist)
        for w in dist["warnings"]:
            lines.append(f"  warning: {w}")
    lines += render_metadata(d.get("by"), d.get("groups"), classes, TEXT_CLASSES)
    return "\n".join(lines)


def _metadata_line(metadata: list[dict] | None) -> str:
    """The index's metadata columns, by name and type: what make_loader(metadata=), subset and --by take."""
    if metadata is None:
        return "  metadata columns: not read (--scan reads the tars; index.json lists them)"
    if not metadata:
        return "  metadata columns: none (the source had no columns beyond key, path, label and split)"
    shown = ", ".join(f"{printable(c['name'])} ({c['type']})" for c in metadata)
    return f"  metadata columns (make_loader(metadata=...), --by): {shown}"


def display_width(text: str) -> int:
    """Terminal columns of ``text``: East Asian wide and fullwidth characters take two, combining
    marks none (so a table of ``頭皮`` and ``back`` lines up)."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def printable(text: str) -> str:
    """``text`` for one table cell: a character that is not printable (newline, tab, other controls)
    as its Python escape (``\\n``), the rest as is."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def pad(text: str, width: int, *, left: bool) -> str:
    """``text`` padded with spaces to ``width`` display columns, on the right (``left``: text
    aligned left) or on the left."""
    fill = " " * max(0, width - display_width(text))
    return text + fill if left else fill + text


def render_metadata(by: dict | None, groups: dict | None, classes: list[str], max_classes: int) -> list[str]:
    """Lines for ``--by`` and the groups in several splits, from the report's ``by`` and ``groups`` dicts."""
    lines: list[str] = []
    if by is not None:
        shown = classes[:max_classes]
        for split, counts in by["splits"].items():
            lines.append("")
            lines.append(f"{split} by {by['column']} ({by['type']}): samples per class")
            rows = [[printable(by["column"]), *map(printable, shown), "total"]]
            for v, row in list(zip(by["values"], counts))[:TEXT_VALUES]:
                cell = "(missing)" if v is None else printable(str(v))
                rows.append([cell, *(f"{int(x):,}" for x in row[:max_classes]), f"{int(sum(row)):,}"])
            lines += _table(rows)
            if len(by["values"]) > TEXT_VALUES:
                lines.append(f"  ... {len(by['values']) - TEXT_VALUES} more values (all in --json)")
            if len(classes) > max_classes:
                lines.append(f"  ... {len(classes) - max_classes} more classes (all in --json)")
    if groups is not None:
        lines.append("")
        several = groups["in_several_splits"]
        lines.append(
            f"groups of {groups['column']}: {groups['groups']:,}; "
            + (f"{len(several):,} in more than one split" if several else "each in one split")
        )
        for w in group_warnings(groups["column"], several)[:TEXT_GROUPS]:
            lines.append(f"  warning: {w}")
        if len(several) > TEXT_GROUPS:
            lines.append(f"  ... {len(several) - TEXT_GROUPS} more (all in --json)")
    return lines
