"""Metadata (format version 2) checked: index.json ``metadata`` and ``build.group``, the samples.npz
``meta<i>`` columns, each sample's ``.json`` ``"meta"`` against its row, and no group in two splits.

``check_field`` is index.json's part (``index_file``); ``check_columns`` the columns' dtypes, shapes
and string values (``verify``); ``GroupSplits`` gathers (group, split) pairs block by block while
``table`` scans the table, so memory grows with the groups, not the rows; ``row_meta`` gives
the ``"meta"`` objects a shard's rows expect (``shards``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from ...format.meta import META_TYPES, MetaColumn, npz_dtypes, npz_names
from .report import INDEX, MAX_PER_KIND, Problem

__all__ = ["check_field", "check_columns", "GroupSplits", "row_meta", "same_meta"]


class Columns(Protocol):
    """What ``check_columns`` reads of samples.npz (``table.SampleColumns`` is one)."""

    name: str

    @property
    def columns(self) -> Mapping[str, Any]:
        """The arrays of samples.npz by name."""
        ...

    def read(self, names: list[str], start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows [start, stop) of the arrays ``names``."""
        ...


def check_field(meta: dict) -> tuple[list[MetaColumn] | None, str | None, list[Problem]]:
    """(columns, group column, problems) of index.json's ``metadata`` and ``build.group``; columns is
    None where the field is unusable."""
    problems: list[Problem] = []
    items = meta.get("metadata", [])
    columns: list[MetaColumn] | None = []
    if not isinstance(items, list):
        problems.append(
            Problem(INDEX, "field", f"metadata is {type(items).__name__}; expected a list of {{name, type}}")
        )
        columns = None
    else:
        seen: set[str] = set()
        for i, c in enumerate(items):
            ok = (
                isinstance(c, dict)
                and isinstance(c.get("name"), str)
                and c["name"] != ""
                and c.get("type") in META_TYPES
                and set(c) == {"name", "type"}
            )
            if not ok:
                problems.append(
                    Problem(
                        INDEX,
                        "field",
                        f"metadata[{i}] is {str(c)[:60]}; expected "
                        f"{{name: a non-empty string, type: {' | '.join(META_TYPES)}}}",
                    )
                )
                columns = None
            elif c["name"] in seen:
                problems.append(Problem(INDEX, "field", f"metadata[{i}] names column {c['name']!r} again"))
                columns = None
            elif columns is not None:
                seen.add(c["name"])
                columns.append(MetaColumn(c["name"], c["type"]))
    build = meta.get("build")
    group = build.get("group") if isinstance(build, dict) else None
    if group is not None and columns is not None and group not in {c.name for c in columns}:
        problems.append(
            Problem(INDEX, "field", f"build.group is {str(group)[:60]!r}, which is not a column of metadata")
        )
        group = None
    return columns, group if columns is not None else None, problems


def check_columns(
    table: Columns, rows: int, columns: list[MetaColumn]
) -> tuple[bool, dict[int, list[str]], list[Problem]]:
    """(usable, string values by column position, problems): each metadata column's arrays in samples.npz
    (``table``: table.SampleColumns) of the dtype and shape the format gives, string values
    distinct, in code-point order and UTF-8, int values 0 where missing."""
    problems: list[Problem] = []
    name = table.name
    usable = True
    categories: dict[int, list[str]] = {}
    for i, c in enumerate(columns):
        arrays = npz_dtypes(i, c.type)
        for array, dtype in arrays.items():
            col = table.columns.get(array)
            if col is None:
                problems.append(
                    Problem(
                        name, "column", f"samples.npz has no column {array!r} (metadata column {c.name!r}, {c.type})"
                    )
                )
                usable = False
                continue
            if array.endswith("_offsets"):
                shape = (col.shape[0],) if len(col.shape) == 1 and col.shape[0] >= 1 else None
            elif array.endswith("_data"):
                shape = (col.shape[0],) if len(col.shape) == 1 else None
            else:
                shape = (rows,)
            if col.dtype != np.dtype(dtype) or col.shape != shape:
                problems.append(
                    Problem(
                        name,
                        "column",
                        f"column {array!r} (metadata {c.name!r}) is {col.dtype.str} "
                        f"{list(col.shape)}; expected {np.dtype(dtype).str} "
                        f"{list(shape) if shape else '[n]'}",
                    )
                )
                usable = False
        if not usable:
            continue
        names = npz_names(i, c.type)
        if c.type == "string":
            offsets = table.read([names[1]], 0, table.columns[names[1]].shape[0])[names[1]].astype(np.int64)
            data = table.read([names[2]], 0, table.columns[names[2]].shape[0])[names[2]].tobytes()
            if offsets[0] != 0 or np.any(np.diff(offsets) <= 0) or offsets[-1] != len(data):
                problems.append(
                    Problem(
                        name,
                        "column",
                        f"{names[1]} (metadata {c.name!r}) does not rise from 0 to "
                        f"len({names[2]}) = {len(data):,} in steps of at least 1",
                    )
                )
                usable = False
                continue
            try:
                values = [data[a:b].decode("utf-8") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
            except UnicodeDecodeError as e:
                problems.append(Problem(name, "column", f"{names[2]} (metadata {c.name!r}) is not UTF-8: {e}"))
                usable = False
                continue
            if any(a >= b for a, b in zip(values, values[1:])):
                problems.append(
                    Problem(
                        name,
                        "column",
                        f"the values of metadata {c.name!r} ({names[2]}) are not distinct and in code-point order",
                    )
                )
            categories[i] = values
    return usable, categories, problems


def block_problems(
    name: str, start: int, block: dict[str, np.ndarray], columns: list[MetaColumn], categories: dict[int, list[str]]
) -> list[Problem]:
    """Rows ``start...`` of the metadata columns: string codes in -1..V-1, int values 0 where missing."""
    problems = []
    for i, c in enumerate(columns):
        names = npz_names(i, c.type)
        if c.type == "string":
            codes = block[names[0]].astype(np.int64)
            bad = np.flatnonzero((codes < -1) | (codes >= len(categories[i])))
            if len(bad):
                problems.append(
                    Problem(
                        name,
                        "column",
                        f"row {start + int(bad[0]):,}: {names[0]} (metadata "
                        f"{c.name!r}) is {int(codes[bad[0]])}, not -1 (missing) or a "
                        f"value 0..{len(categories[i]) - 1}",
                    )
                )
        elif c.type == "int":
            bad = np.flatnonzero(block[names[1]] & (block[names[0]] != 0))
            if len(bad):
                problems.append(
                    Problem(
                        name,
                        "column",
                        f"row {start + int(bad[0]):,}: metadata {c.name!r} is "
                        f"missing but {names[0]} holds {int(block[names[0]][bad[0]])}, "
                        "not 0",
                    )
                )
    return problems


def block_names(columns: list[MetaColumn]) -> list[str]:
    """The per-row arrays of the metadata (not the string values)."""
    return [n for i, c in enumerate(columns) for n in npz_names(i, c.type) if not n.endswith(("_offsets", "_data"))]


class GroupSplits:
    """(group, split) pairs with sample counts, gathered block by block; ``problems`` names each group
    found in more than one split."""

    def __init__(self, column: MetaColumn, position: int, split_names: list[str], categories: list[str] | None) -> None:
        self.column, self.names, self.split_names, self.categories = (
            column,
            npz_names(position, column.type),
            split_names,
            categories,
        )
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, block: dict[str, np.ndarray], split_ids: np.ndarray) -> None:
        """Count the (group, split) pairs of one block of rows."""
        values = block[self.names[0]]
        if self.column.type == "string":
            present = values >= 0
        elif self.column.type == "int":
            present = ~block[self.names[1]]
        else:
            present = ~np.isnan(values)
        present &= split_ids >= 0
        uniq, counts = np.unique(_pairs(values[present], split_ids[present]), return_counts=True)
        self.parts.append((uniq["g"], uniq["s"], counts))

    def problems(self) -> list[Problem]:
        """One problem per group found in more than one split."""
        if not self.parts:
            return []
        pairs = _pairs(np.concatenate([p[0] for p in self.parts]), np.concatenate([p[1] for p in self.parts]))
        counts = np.concatenate([p[2] for p in self.parts])
        uniq, inverse = np.unique(pairs, return_inverse=True)
        totals = np.bincount(inverse.reshape(-1), weights=counts).astype(np.int64)
        groups, first, per_group = np.unique(uniq["g"], return_index=True, return_counts=True)
        several = np.flatnonzero(per_group > 1)
        problems = []
        for g in several[:MAX_PER_KIND].tolist():
            a = first[g]
            where = ", ".join(
                f"{self.split_names[int(s)]} ({int(n):,} sample{'s' if n != 1 else ''})"
                for s, n in zip(uniq["s"][a : a + per_group[g]], totals[a : a + per_group[g]])
            )
            value = self._show(groups[g])
            problems.append(
                Problem(
                    INDEX,
                    "group_split",
                    f"group {value} of column {self.column.name!r} (build.group) is in {per_group[g]} splits: {where}",
                )
            )
        if len(several) > MAX_PER_KIND:
            problems.append(
                Problem(INDEX, "group_split", f"... and {len(several) - MAX_PER_KIND} more groups in several splits")
            )
        return problems

    def _show(self, value: object) -> str:
        if self.categories is not None:
            return repr(self.categories[int(value)])
        return repr(int(value) if self.column.type == "int" else float(value))


def _pairs(groups: np.ndarray, splits: np.ndarray) -> np.ndarray:
    out = np.empty(len(groups), dtype=[("g", groups.dtype), ("s", np.int64)])
    out["g"], out["s"] = groups, splits
    return out


def row_meta(block: dict[str, np.ndarray], columns: list[MetaColumn], categories: dict[int, list[str]]) -> list[dict]:
    """The ``"meta"`` object of each row of ``block``, as its sample's .json should hold it."""
    per_column = []
    for i, c in enumerate(columns):
        names = npz_names(i, c.type)
        v = block[names[0]]
        if c.type == "string":
            cats = categories[i]
            per_column.append([cats[x] if 0 <= x < len(cats) else None for x in v.tolist()])
        elif c.type == "int":
            per_column.append([None if m else x for x, m in zip(v.tolist(), block[names[1]].tolist())])
        else:
            per_column.append([None if x != x else x for x in v.tolist()])  # NaN: missing
    n = len(block[names[0]]) if columns else 0
    return [{c.name: per_column[j][r] for j, c in enumerate(columns)} for r in range(n)]


def same_meta(got: object, want: dict) -> bool:
    """Equal values of equal JSON types (45 and 45.0 differ)."""
    return json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
