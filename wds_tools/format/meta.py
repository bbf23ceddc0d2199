"""Per-sample metadata (format version 2): a manifest's other columns, typed, kept with every sample.

index.json ``metadata`` lists the columns (``[{"name", "type"}]``, in manifest order); column i is
stored in samples.npz under the names ``npz_names(i, type)``; each sample's ``.json`` holds them as
``"meta": {name: value or null}``. The bytes are specified in docs/FORMAT.md ("Metadata").
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import IndexFormatError
from .packed import pack_strings

__all__ = [
    "META_TYPES",
    "MetaColumn",
    "MetaValues",
    "metadata_columns",
    "npz_names",
    "npz_dtypes",
    "encode_columns",
    "read_metadata",
    "value_text",
    "column_names",
    "string_values",
    "is_int_text",
    "is_float_text",
]

META_TYPES = ("int", "float", "string")
"""The types of a metadata column."""
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")  # canonical: no sign but '-', no leading zero (ASCII digits only)
_FLOAT = re.compile(r"[+-]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # no leading zero
_INT64 = (-(2**63), 2**63 - 1)
_NPZ = {  # type -> (suffix, dtype) of each samples.npz array of a column, in stored order
    "int": (("", "<i8"), ("_missing", "|b1")),
    "float": (("", "<f8"),),
    "string": (("", "<i4"), ("_offsets", "<u8"), ("_data", "|u1")),
}


@dataclass(frozen=True)
class MetaColumn:
    """One metadata column of an index: its name and type (``int``, ``float`` or ``string``)."""

    name: str
    type: str  # "int", "float" or "string"

    def to_dict(self) -> dict:
        """The column as index.json's ``metadata`` lists it."""
        return {"name": self.name, "type": self.type}


def metadata_columns(meta: Mapping | Sequence[MetaColumn]) -> list[MetaColumn]:
    """The metadata columns an index lists ([] for version 1, or an index without metadata): given as
    columns (``format.model.IndexMeta.metadata``) or as index.json's dict."""
    if not isinstance(meta, Mapping):
        return list(meta)
    items = meta.get("metadata") or []
    if not isinstance(items, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) and c.get("type") in META_TYPES for c in items
    ):
        raise IndexFormatError(
            "index.json metadata is not a list of {name, type} with type int, float or string; "
            "the index is damaged (run wds-tools verify)"
        )
    return [MetaColumn(c["name"], c["type"]) for c in items]


def npz_names(i: int, type: str) -> tuple[str, ...]:
    """samples.npz arrays of metadata column ``i``: ``meta<i>`` and its companions, in stored order."""
    return tuple(npz_dtypes(i, type))


def npz_dtypes(i: int, type: str) -> dict[str, str]:
    """samples.npz array name -> dtype of metadata column ``i`` (``npz_names``, in stored order)."""
    return {f"meta{i}{suffix}": dtype for suffix, dtype in _NPZ[type]}


def is_int_text(text: str) -> bool:
    """A cell an int column holds: a canonical decimal integer within int64 (docs/FORMAT.md, Metadata)."""
    return bool(_INT.fullmatch(text)) and _INT64[0] <= int(text) <= _INT64[1]


def is_float_text(text: str) -> bool:
    """A cell a float column holds: such an integer that a double holds exactly (not 2**53 + 1: an
    integer keeps every digit or the column is text), or a finite decimal number without a leading zero."""
    if _INT.fullmatch(text):
        return is_int_text(text) and float(int(text)) == int(text)
    return bool(_FLOAT.fullmatch(text)) and math.isfinite(float(text))


def value_text(value: object) -> str:
    """A value as text: a group's identity, the same whatever type its column has in a version (one
    new cell can turn an int column float, or a float column text): a number as its value, a whole
    one as the int it equals (``5``, ``5.0`` and a text cell ``5.0`` are all ``5``), another as
    Python's ``repr`` of the float (``45.5``); a text cell an int or float column would hold is that
    number (``-0`` -> ``0``, ``1e3`` -> ``1000``; integers past int64 keep all their digits); any
    other text is itself (``007``, ``HAM_01``)."""
    if isinstance(value, str):
        if _INT.fullmatch(value):
            return str(int(value))
        if _FLOAT.fullmatch(value) and math.isfinite(float(value)):
            value = float(value)
        else:
            return value
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def encode_columns(columns: Sequence[MetaColumn], values: Sequence[Sequence]) -> dict[str, np.ndarray]:
    """samples.npz arrays of the metadata: ``values[r][i]`` is row r's value of column i (None: missing)."""
    out: dict[str, np.ndarray] = {}
    n = len(values)
    for i, c in enumerate(columns):
        col = [row[i] for row in values]
        names = npz_names(i, c.type)
        if c.type == "int":
            out[names[0]] = np.array([0 if v is None else v for v in col], dtype="<i8").reshape(n)
            out[names[1]] = np.array([v is None for v in col], dtype="|b1").reshape(n)
        elif c.type == "float":
            out[names[0]] = np.array([math.nan if v is None else v for v in col], dtype="<f8").reshape(n)
        else:
            categories = sorted({v for v in col if v is not None})
            code = {v: j for j, v in enumerate(categories)}
            out[names[0]] = np.array([-1 if v is None else code[v] for v in col], dtype="<i4").reshape(n)
            out[names[1]], out[names[2]] = pack_strings(categories)
    return out


@dataclass
class MetaValues:
    """One metadata column of some rows: ``values`` (int64, float64, or int32 codes into
    ``categories`` for strings) and ``missing`` (bool)."""

    column: MetaColumn
    values: np.ndarray
    missing: np.ndarray
    categories: list[str] | None = None

    def __len__(self) -> int:
        return len(self.values)

    def take(self, rows: np.ndarray) -> MetaValues:
        """These rows only."""
        return MetaValues(self.column, self.values[rows], self.missing[rows], self.categories)

    def value(self, i: int) -> int | float | str | None:
        """Row i's value as the sample's .json has it (None: missing)."""
        if self.missing[i]:
            return None
        v = self.values[i]
        if self.categories is not None:
            return self.categories[int(v)]
        return int(v) if self.column.type == "int" else float(v)

    def tolist(self) -> list:
        """Every row's value (``value``)."""
        return [self.value(i) for i in range(len(self))]

    def mask(self, wanted: Iterable) -> np.ndarray:
        """Rows whose value is one of ``wanted`` (None selects the missing ones), compared as the
        column's type: 45 and 45.0 both match an int column's 45. A value of another kind (a number
        for a string column, a string for a number column) raises TypeError."""
        out = np.zeros(len(self), bool)
        numbers = []
        for w in wanted:
            if w is None:
                out |= self.missing
            elif self.categories is not None:
                if not isinstance(w, str):
                    raise TypeError(f"{self.column.name!r} is a string column; {w!r} is not a string")
                if w in self._code:
                    out |= self.values == self._code[w]
            elif isinstance(w, (int, float, np.integer, np.floating)) and not isinstance(w, bool):
                if self.column.type == "float":
                    numbers.append(float(w))
                elif float(w).is_integer() and -(2**63) <= int(w) < 2**63:  # exact, however large
                    numbers.append(int(w))
            else:
                raise TypeError(f"{self.column.name!r} is a column of {self.column.type}s; {w!r} is not a number")
        if numbers:
            out |= np.isin(self.values, np.array(numbers, self.values.dtype)) & ~self.missing
        return out

    @property
    def _code(self) -> dict[str, int]:
        return {v: j for j, v in enumerate(self.categories or [])}

    def array(self) -> np.ndarray:
        """A numpy view for functions of the columns: strings as an object array (None where missing),
        ints as int64 (float64 with NaN where missing values exist), floats with NaN where missing."""
        if self.categories is not None:
            cats = np.array(self.categories + [None], dtype=object)
            return cats[np.where(self.missing, len(self.categories), self.values)]
        if self.column.type == "int" and self.missing.any():
            return np.where(self.missing, np.nan, self.values.astype(np.float64))
        return self.values

    def factorize(self) -> tuple[np.ndarray, list]:
        """(id per row, -1 where missing; the distinct values by id): equal values, equal ids."""
        if self.categories is not None:
            return np.where(self.missing, -1, self.values).astype(np.int64), list(self.categories)
        present = ~self.missing
        uniq, inverse = np.unique(self.values[present], return_inverse=True)
        ids = np.full(len(self), -1, np.int64)
        ids[present] = inverse
        kind = int if self.column.type == "int" else float
        return ids, [kind(u) for u in uniq.tolist()]


def read_metadata(
    columns: Mapping[str, np.ndarray],
    listed: Sequence[MetaColumn],
    names: Iterable[str] | None = None,
    where: str = "samples.npz",
) -> dict[str, MetaValues]:
    """The metadata columns ``names`` (default: all) of an index (``listed``: ``format.model.IndexMeta.metadata``)
    from samples.npz arrays ``columns`` (which must hold their ``npz_names``), by name."""
    wanted = None if names is None else set(names)
    out = {}
    for i, c in enumerate(listed):
        if wanted is not None and c.name not in wanted:
            continue
        keys = npz_names(i, c.type)
        absent = [k for k in keys if k not in columns]
        if absent:
            raise IndexFormatError(
                f"{where} has no column {absent[0]!r} (metadata column {c.name!r}); the index "
                "is damaged (run wds-tools verify)"
            )
        values = columns[keys[0]]
        if c.type == "int":
            out[c.name] = MetaValues(c, values.astype(np.int64), columns[keys[1]].astype(bool))
        elif c.type == "float":
            values = values.astype(np.float64)
            out[c.name] = MetaValues(c, values, np.isnan(values))
        else:
            cats, problem = string_values(columns[keys[1]], columns[keys[2]], keys[1:], c.name)
            if cats is None:
                raise IndexFormatError(f"{where}: {problem}; the index is damaged (run wds-tools verify)")
            codes = values.astype(np.int64)
            if len(codes) and (codes.min() < -1 or codes.max() >= len(cats)):
                raise IndexFormatError(
                    f"{where}: column {keys[0]!r} (metadata {c.name!r}) holds codes outside "
                    f"-1..{len(cats) - 1}; the index is damaged (run wds-tools verify)"
                )
            out[c.name] = MetaValues(c, codes, codes < 0, cats)
    return out


def string_values(
    offsets: np.ndarray, data: np.ndarray, names: Sequence[str], column: str
) -> tuple[list[str] | None, str | None]:
    """(the values, what breaks the rule) of a string column's ``meta<i>_offsets`` and ``meta<i>_data``
    (``names``): offsets rising from 0 to the data's end, UTF-8, distinct and in code-point order. The
    values are None where they cannot be read; the order alone, when broken, leaves them readable."""
    o, blob = offsets.astype(np.int64), data.tobytes()
    if not len(o) or o[0] != 0 or np.any(np.diff(o) <= 0) or o[-1] != len(blob):
        rule = f"len({names[1]}) = {len(blob):,} in steps of at least 1"
        return None, f"{names[0]} (metadata {column!r}) does not rise from 0 to {rule}"
    try:
        values = [blob[a:b].decode("utf-8") for a, b in zip(o[:-1].tolist(), o[1:].tolist())]
    except UnicodeDecodeError as e:
        return None, f"{names[1]} (metadata {column!r}) is not UTF-8: {e}"
    if any(a >= b for a, b in zip(values, values[1:])):
        return values, f"the values of metadata {column!r} ({names[1]}) are not distinct and in code-point order"
    return values, None


def column_names(meta: Mapping | Sequence[MetaColumn]) -> list[str]:
    """Every samples.npz array name of the metadata, in stored order."""
    return [name for i, c in enumerate(metadata_columns(meta)) for name in npz_names(i, c.type)]
