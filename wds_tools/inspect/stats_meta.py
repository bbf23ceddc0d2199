"""Statistics of the per-sample metadata (format version 2): class counts broken down by one column
(``stats --by COL``) and the groups of a column found in more than one split (``build.group``, or
``stats --group COL``)."""

from __future__ import annotations

import difflib
import unicodedata
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError
from ..format.meta import MetaValues, metadata_columns, npz_names

__all__ = ["Breakdown", "GroupReport", "metadata_arrays", "check_column", "breakdown", "group_report",
           "render_text", "TEXT_VALUES", "TEXT_GROUPS"]

TEXT_VALUES = 30  # values of a --by column listed per split in the text output; --json has them all
TEXT_GROUPS = 10  # groups in several splits listed in the text output


@dataclass
class Breakdown:
    """Samples per (value of ``column``, class) per split; ``values`` sorted, None (missing) last."""

    column: str
    type: str
    values: list
    counts: dict[str, np.ndarray]  # split -> int64 [values, classes]

    def to_dict(self) -> dict:
        return {"column": self.column, "type": self.type, "values": self.values,
                "splits": {s: c.tolist() for s, c in self.counts.items()}}


@dataclass
class GroupReport:
    """How the groups of ``column`` fall into splits."""

    column: str
    groups: int
    in_several: list[dict] = field(default_factory=list)  # {"group": value, "splits": {split: samples}}

    def to_dict(self) -> dict:
        return {"column": self.column, "groups": self.groups, "in_several_splits": self.in_several}

    @property
    def warnings(self) -> list[str]:
        return [f"group {g['group']!r} of column {self.column!r} is in {len(g['splits'])} splits: "
                + ", ".join(f"{s} ({n:,})" for s, n in g["splits"].items()) for g in self.in_several]


def check_column(meta: dict, name: str, option: str) -> None:
    """Refuse a column the index's metadata does not have, listing those it has (with a close match)."""
    names = [c.name for c in metadata_columns(meta)]
    if name in names:
        return
    columns = (meta.get("build") or {}).get("columns") or {}
    role = next((r for r in ("label", "key", "path", "split") if isinstance(columns, dict) and columns.get(r) == name),
                None)
    listed = f"Its metadata columns: {', '.join(names)}." if names else "It has no metadata columns."
    if role == "label":
        raise OptionError(f"{option} {name!r}: {name!r} is this conversion's label column (--label), whose classes "
                          f"are the table's columns already; name a metadata column. {listed}")
    if role is not None:
        raise OptionError(f"{option} {name!r}: {name!r} is this conversion's {role} column (--{role}), not "
                          f"metadata. {listed}")
    if not names:
        raise OptionError(f"{option} {name!r}: this index has no metadata columns (it was converted from a plain "
                          "key,path,label manifest, or in format version 1)")
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise OptionError(f"{option} {name!r}: the index has no metadata column {name!r}{hint} {listed}")


def metadata_arrays(meta: dict, names: list[str]) -> list[str]:
    """The samples.npz arrays holding the metadata columns ``names``."""
    return [a for i, c in enumerate(metadata_columns(meta)) if c.name in names for a in npz_names(i, c.type)]


def breakdown(values: MetaValues, labels: np.ndarray, row_split: np.ndarray, splits: list[str],
              n_classes: int) -> Breakdown:
    ids, distinct = values.factorize()
    n = len(distinct)
    slot = np.where(ids < 0, n, ids)  # missing last
    counts = {}
    for j, s in enumerate(splits):
        mine = row_split == j
        flat = np.bincount(slot[mine] * n_classes + labels[mine], minlength=(n + 1) * n_classes)
        counts[s] = flat.reshape(n + 1, n_classes)
    has_missing = bool(values.missing.any())
    if not has_missing:
        counts = {s: c[:n] for s, c in counts.items()}
    return Breakdown(values.column.name, values.column.type, distinct + ([None] if has_missing else []), counts)


def group_report(values: MetaValues, row_split: np.ndarray, splits: list[str]) -> GroupReport:
    ids, distinct = values.factorize()
    present = ids >= 0
    pairs = ids[present] * len(splits) + row_split[present]
    counts = np.bincount(pairs, minlength=len(distinct) * len(splits)).reshape(len(distinct), len(splits))
    several = np.flatnonzero((counts > 0).sum(axis=1) > 1)
    return GroupReport(values.column.name, len(distinct), [
        {"group": distinct[g], "splits": {splits[j]: int(counts[g, j]) for j in np.flatnonzero(counts[g])}}
        for g in several.tolist()])


def display_width(text: str) -> int:
    """Terminal columns of ``text``: East Asian wide and fullwidth characters take two, combining
    marks none (so a table of ``頭皮`` and ``back`` lines up)."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def printable(text: str) -> str:
    """``text`` for one table cell: a character that is not printable (newline, tab, other controls)
    as its Python escape (``\\n``), the rest as is."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def pad(text: str, width: int, *, left: bool) -> str:
    """``text`` padded with spaces to ``width`` display columns, on the right (``left``: text
    aligned left) or on the left."""
    fill = " " * max(0, width - display_width(text))
    return text + fill if left else fill + text


def render_text(by: Breakdown | None, groups: GroupReport | None, classes: list[str], max_classes: int) -> list[str]:
    lines: list[str] = []
    if by is not None:
        shown = classes[:max_classes]
        for split, counts in by.counts.items():
            lines.append("")
            lines.append(f"{split} by {by.column} ({by.type}): samples per class")
            rows = [[printable(by.column), *map(printable, shown), "total"]]
            for v, row in list(zip(by.values, counts))[:TEXT_VALUES]:
                cell = "(missing)" if v is None else printable(str(v))
                rows.append([cell, *(f"{int(x):,}" for x in row[:max_classes]),
                             f"{int(row.sum()):,}"])
            widths = [max(display_width(r[c]) for r in rows) for c in range(len(rows[0]))]
            lines += ["  " + "  ".join(pad(cell, widths[c], left=c == 0) for c, cell in enumerate(r)).rstrip()
                      for r in rows]
            if len(by.values) > TEXT_VALUES:
                lines.append(f"  ... {len(by.values) - TEXT_VALUES} more values (all in --json)")
            if len(classes) > max_classes:
                lines.append(f"  ... {len(classes) - max_classes} more classes (all in --json)")
    if groups is not None:
        lines.append("")
        several = groups.in_several
        lines.append(f"groups of {groups.column}: {groups.groups:,}; "
                     + (f"{len(several):,} in more than one split" if several else "each in one split"))
        for w in groups.warnings[:TEXT_GROUPS]:
            lines.append(f"  warning: {w}")
        if len(several) > TEXT_GROUPS:
            lines.append(f"  ... {len(several) - TEXT_GROUPS} more (all in --json)")
    return lines
