"""A manifest as a table: its columns, which of them are the key, label, path (or a path template),
split and group, and every other column kept as typed metadata (docs/FORMAT.md, "Metadata").

``read_table`` reads a CSV/TSV or JSON-lines file into rows of cells; ``Columns`` names the columns
the options chose and ``bind`` checks them against the file's header (a missing or misspelt name is
refused with the file's columns and a close match); ``column_type`` and ``typed`` turn a column's
cells into ints, floats or strings, decided from all its values.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
from dataclasses import dataclass
from typing import TextIO

from ..errors import OptionError, SourceError
from ..format.meta import MetaColumn
from ..format.meta import is_float_text as _is_float
from ..format.meta import is_int_text as _is_int
from ..format.transport import is_remote
from .scan import HASH_ALGORITHMS
from .storage import open_input

__all__ = ["Columns", "PathTemplate", "Table", "Bound", "read_table", "bind", "cell_text", "column_type", "typed"]


@dataclass(frozen=True)
class Columns:
    """Which manifest columns are the key, the label, the path (a column, or a template naming columns
    in braces), the split (None: the ``split`` column when there is one) and the group (None: none)."""

    key: str = "key"
    label: str = "label"
    path: str = "path"
    split: str | None = None
    group: str | None = None

    @property
    def default(self) -> bool:
        """The columns of a plain ``key,path,label[,split]`` manifest."""
        return (self.key, self.label, self.path, self.split) == ("key", "label", "path", None)

    def record(self) -> dict:
        """index.json ``build.columns``: the options as given (written when they are not the defaults)."""
        return {"key": self.key, "label": self.label, "path": self.path, "split": self.split}


@dataclass(frozen=True)
class PathTemplate:
    """``--path``: a column name, or a template such as ``images/{image_id}.jpg`` (``{{``, ``}}``: braces)."""

    text: str
    parts: tuple  # str (literal text) or tuple (column name,)

    @classmethod
    def parse(cls, text: str) -> PathTemplate:
        """A --path value: a column name, or a template naming columns in braces."""
        if "{" not in text and "}" not in text:
            return cls(text, ((text,),))
        parts: list = []
        i, literal = 0, []
        while i < len(text):
            ch = text[i]
            if text.startswith("{{", i) or text.startswith("}}", i):
                literal.append(ch)
                i += 2
            elif ch == "{":
                end = text.find("}", i + 1)
                name = text[i + 1 : end] if end > 0 else None
                if not name or "{" in name:
                    raise OptionError(
                        f"--path {text!r}: a '{{' at position {i} is not closed by a column name and "
                        "'}'; name columns in braces, e.g. images/{image_id}.jpg ('{{' for a brace)"
                    )
                if literal:
                    parts.append("".join(literal))
                    literal = []
                parts.append((name,))
                i = end + 1
            elif ch == "}":
                raise OptionError(
                    f"--path {text!r}: a '}}' at position {i} closes no '{{'; name columns in braces, "
                    "e.g. images/{image_id}.jpg ('}}' for a brace)"
                )
            else:
                literal.append(ch)
                i += 1
        if literal:
            parts.append("".join(literal))
        return cls(text, tuple(parts))

    @property
    def bare(self) -> bool:
        """A plain column name (no braces): the column holds the path."""
        return len(self.parts) == 1 and isinstance(self.parts[0], tuple) and "{" not in self.text

    @property
    def fields(self) -> list[str]:
        """The columns the template names, in order, once each."""
        return list(dict.fromkeys(p[0] for p in self.parts if isinstance(p, tuple)))

    def render(self, cells: dict[str, str]) -> str:
        """The path for a row's cells."""
        return "".join(p if isinstance(p, str) else cells[p[0]] for p in self.parts)


@dataclass
class Table:
    """A manifest file read whole: its kind, header and rows."""

    kind: str  # "csv" (also .tsv) or "jsonl"
    path: str
    columns: list[str]  # header order (JSON lines: the order keys first appear)
    records: list[tuple[int, dict]]  # (line, {column: cell})


def _open_text(path: str) -> TextIO:
    if is_remote(path):
        return io.TextIOWrapper(open_input(path), encoding="utf-8-sig", newline="")
    return open(path, newline="", encoding="utf-8-sig")


def read_table(path: str) -> Table:
    """A manifest's rows: CSV/TSV through ``csv`` (UTF-8, optional BOM), or JSON lines (blank lines skipped)."""
    suffix = os.path.splitext(path)[1].lower()
    records: list[tuple[int, dict]] = []
    try:
        with _open_text(path) as f:
            if suffix in (".jsonl", ".ndjson"):
                names: dict[str, None] = {}
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise SourceError(f"{path}: line {line_no} is not valid JSON: {e.msg}") from None
                    if not isinstance(obj, dict):
                        raise SourceError(f"{path}: line {line_no} is not a JSON object")
                    names.update(dict.fromkeys(obj))
                    records.append((line_no, obj))
                return Table("jsonl", path, list(names), records)
            if suffix not in (".csv", ".tsv"):
                raise SourceError(
                    f"{path}: unknown manifest type {suffix!r}; expected .csv, .tsv or .jsonl "
                    "(or pass an image folder ROOT/<label>/<file>)"
                )
            reader = csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ",")
            header = list(reader.fieldnames or [])
            if suffix == ".csv" and len(header) == 1 and ";" in header[0]:
                raise SourceError(
                    f"{path}: the header {header[0][:80]!r} is one column holding ';': the file looks "
                    "';'-delimited (what spreadsheets write where the decimal mark is a comma). A .csv manifest "
                    "is ','-delimited: save it with ',' as the delimiter, or with tabs as a .tsv"
                )
            dups = sorted({n for n in header if header.count(n) > 1 and n.strip()})
            if dups:
                raise SourceError(
                    f"{path}: the header names column(s) {', '.join(map(repr, dups))} more than once; "
                    "every column needs its own name"
                )
            for obj in reader:
                extra, short = obj.get(None), None in obj.values()
                if extra or short:  # DictReader keeps extra cells under None and fills short rows with None
                    n = len(header) + len(extra) if extra else sum(v is not None for v in obj.values())
                    raise SourceError(
                        f"{path}: line {reader.line_num} has {n} cells, but the header has {len(header)} columns: a "
                        f"cell that holds the delimiter {reader.reader.dialect.delimiter!r} must be in double "
                        f"quotes, and every row needs a cell for every column (empty for a missing value). Nothing "
                        f"was written."
                    )
                records.append((reader.line_num, obj))
            nameless = [i for i, n in enumerate(header) if not n.strip()]
            for i in nameless:
                filled = next((line for line, obj in records if (obj.get(header[i]) or "").strip()), None)
                if filled is not None:
                    raise SourceError(
                        f"{path}: column {i + 1} has no name in the header but holds values (line "
                        f"{filled}); name it in the header"
                    )
            return Table("csv", path, [n for n in header if n.strip()], records)
    except OSError as e:
        raise SourceError(f"cannot read manifest {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


@dataclass
class Bound:
    """``Columns`` checked against a table: the template, the split column (or None) and the metadata."""

    columns: Columns
    template: PathTemplate
    split: str | None
    metadata: list[str]  # every column not taken as key, label, bare path, split or sha256/md5, in table order


def _close(name: str, names: list[str]) -> str:
    match = difflib.get_close_matches(name, names, n=1, cutoff=0.6) or [n for n in names if n.lower() == name.lower()]
    return f"; did you mean {match[0]!r}?" if match else ""


def bind(table: Table, cols: Columns) -> Bound:
    """Check every column the options name against ``table``'s columns (before anything is written)."""
    template = PathTemplate.parse(cols.path)
    have = table.columns
    shown = ", ".join(have) if have else "none (no header)"
    wanted = [("--key", cols.key), ("--label", cols.label)]
    if template.bare:
        wanted.append(("--path", cols.path))
    if cols.split is not None:
        wanted.append(("--split", cols.split))
    if cols.group is not None:
        wanted.append(("--group", cols.group))
    missing = [(opt, name) for opt, name in wanted if name not in have]
    if missing:
        details = "; ".join(f"{name!r} ({opt}{_close(name, have)})" for opt, name in missing)
        hint = (
            " A dataset's own metadata file needs the column options, e.g. --key image_id --label dx "
            "--path 'images/{image_id}.jpg'."
            if cols.default
            else ""
        )
        raise SourceError(
            f"{table.path}: missing column(s) {', '.join(sorted(n for _, n in missing))}: {details}. "
            f"The file's columns: {shown}.{hint}"
        )
    unknown = [name for name in template.fields if name not in have]
    if not template.bare and unknown:
        close = _close(unknown[0], have)
        raise SourceError(
            f"{table.path}: --path {cols.path!r} names column {unknown[0]!r}, which the file does "
            f"not have{close}{'' if close else '.'} The file's columns: {shown}. Nothing was written."
        )
    split = cols.split if cols.split is not None else ("split" if "split" in have else None)
    roles: dict[str | None, str] = {
        **{h: "a hash column" for h in HASH_ALGORITHMS},
        split: "the split column",
        **({cols.path: "the --path column"} if template.bare else {}),
        cols.label: "the --label column",
        cols.key: "the --key column",
    }
    if cols.group is not None and cols.group in roles:  # a group must be a metadata column
        raise OptionError(
            f"--group {cols.group!r} is {roles[cols.group]} of {table.path}; a group column names "
            "what samples share (a lesion, a patient), e.g. --group lesion_id, and must be "
            "another column"
        )
    return Bound(cols, template, split, [c for c in have if c not in roles])


def cell_text(value: object) -> str | None:
    """A cell as text, or None when it is missing: an empty (or blank) cell, a JSON null or an absent
    key. JSON values: strings as they are, numbers as Python's json writes them, true/false, other
    values as compact JSON; all stripped of surrounding whitespace."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = json.dumps(value)
    else:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.strip() or None


def column_type(texts: list[str | None]) -> str:
    """``int`` when every present value is a canonical decimal integer within int64 (``-?(0|[1-9][0-9]*)``);
    else ``float`` when every one is such an integer or a finite decimal number
    (``[+-]?((0|[1-9][0-9]*)(.[0-9]*)?|.[0-9]+)([eE][+-]?[0-9]+)?``: no leading zero, so ``007`` and
    ``02134`` stay text); else ``string`` (also when none is present)."""
    present = [t for t in texts if t is not None]
    if not present:
        return "string"
    if all(_is_int(t) for t in present):
        return "int"
    if all(_is_float(t) for t in present):
        return "float"
    return "string"


def typed(text: str | None, type: str) -> int | float | str | None:
    """A cell's value in its column's type (None stays None)."""
    if text is None:
        return None
    return int(text) if type == "int" else float(text) if type == "float" else text


def metadata_values(table: Table, names: list[str]) -> tuple[list[MetaColumn], list[tuple]]:
    """The metadata columns (typed from all their values) and each record's values, in record order."""
    texts = [[cell_text(obj.get(n)) for n in names] for _, obj in table.records]
    types = [column_type([row[i] for row in texts]) for i in range(len(names))]
    values = [tuple(typed(t, ty) for t, ty in zip(row, types)) for row in texts]
    return [MetaColumn(n, t) for n, t in zip(names, types)], values
