"""A manifest as a table: its columns, which of them are the key, label, path (or a path template),
split and group, and every other column kept as typed metadata (docs/FORMAT.md, "Metadata").

``read_table`` reads a CSV/TSV or JSON-lines file, ``bind`` checks the chosen ``Columns`` against its header,
``column_type`` and ``typed`` type a column from all its values.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, TextIO

from ..errors import OptionError, SourceError
from ..format.meta import MetaColumn
from ..format.meta import is_float_text as _is_float
from ..format.meta import is_int_text as _is_int
from ..storage.objects import open_input
from ..storage.transport import is_remote
from .scan import HASH_ALGORITHMS

__all__ = [
    "Columns",
    "Choice",
    "PathTemplate",
    "ANY_EXTENSION",
    "Table",
    "Bound",
    "read_table",
    "bind",
    "cell_text",
    "column_type",
    "typed",
]


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


class Choice(NamedTuple):
    """A part of a path template that may be one of several texts: ``{jpg,png,heic}`` lists them, in the
    order tried; ``.*`` at the end (``options`` empty) is any image file extension (source.IMAGE_EXTENSIONS)."""

    options: tuple[str, ...]


ANY_EXTENSION = "*"
"""What a candidate path ends with where the template ends with ``.*`` (``PathTemplate.candidates``)."""


@dataclass(frozen=True)
class PathTemplate:
    """``--path``: a column name, or a template such as ``images/{image_id}.jpg`` naming columns in braces
    (``{{``, ``}}``: braces); ``{jpg,png,heic}`` (a comma inside the braces) lists texts to try, in order,
    and a template ending with ``.*`` takes any image extension (``Choice``)."""

    text: str
    parts: tuple  # str (literal text), tuple (column name,) or Choice

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
                parts.append(Choice(tuple(name.split(","))) if "," in name else (name,))
                i = end + 1
            elif ch == "}":
                raise OptionError(
                    f"--path {text!r}: a '}}' at position {i} closes no '{{'; name columns in braces, "
                    "e.g. images/{image_id}.jpg ('}}' for a brace)"
                )
            elif ch == ANY_EXTENSION:
                if i != len(text) - 1 or not text.endswith(".*"):
                    raise OptionError(
                        f"--path {text!r}: a '*' at position {i}: '.*' ends a template to take any image "
                        "extension (images/{image_id}.*); to list some, put them in braces: "
                        "images/{image_id}.{jpg,png,heic}"
                    )
                if literal:
                    parts.append("".join(literal))
                    literal = []
                parts.append(Choice(()))
                i += 1
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
        return list(dict.fromkeys(p[0] for p in self.parts if _is_column(p)))

    @property
    def choices(self) -> bool:
        """Whether the template lists texts to try or takes any extension (a row's file is looked for)."""
        return any(isinstance(p, Choice) for p in self.parts)

    def candidates(self, cells: dict[str, str]) -> list[str]:
        """Every path the row's cells may name, in the order tried: each choice's texts in the order
        listed, the leftmost choice varying slowest; one ending with ``.*`` ends with ``*`` (any
        image extension: ``source`` looks the folder up)."""
        paths = [""]
        for p in self.parts:
            if isinstance(p, Choice):
                paths = [a + option for a in paths for option in (p.options or (ANY_EXTENSION,))]
            else:
                text = p if isinstance(p, str) else cells[p[0]]
                paths = [a + text for a in paths]
        return paths


def _is_column(part: object) -> bool:
    return isinstance(part, tuple) and not isinstance(part, Choice)


@dataclass
class Table:
    """A manifest file read whole: its kind, header and rows, and where its rows and lines part."""

    kind: str  # "csv" (also .tsv) or "jsonl"
    path: str
    columns: list[str]  # header order (JSON lines: the order keys first appear)
    records: list[tuple[int, dict]]  # (the line the row starts on, {column: cell})
    lines: int = 0  # physical lines (the header's and blank ones included)
    spans: list[tuple[int, int, tuple[str, ...]]] = field(default_factory=list)  # a .csv row on several lines:
    # (first line, last line, the columns whose quoted cells hold the line breaks)
    open_quotes: list[tuple[int, str]] = field(default_factory=list)  # a .tsv cell opening a double quote its
    # line does not close, kept as written: (line, column)

    def notes(self) -> list[str]:
        """For the summary: where rows and lines part (.csv rows on several lines) and the .tsv cells whose
        opening quote was kept as written."""
        out = []
        if self.spans:
            n = len(self.spans)
            listed = "; ".join(f"lines {a}-{b} ({', '.join(cols)})" for a, b, cols in self.spans[:_LISTED])
            more = f"; and {n - _LISTED:,} more" if n > _LISTED else ""
            out.append(
                f"{self.path}: {len(self.records):,} rows on {self.lines:,} lines: {n:,} "
                f"{'row spans' if n == 1 else 'rows span'} several lines, a cell in double quotes holding "
                f"line breaks (each such row is one sample): {listed}{more}"
            )
        if self.open_quotes:
            n = len(self.open_quotes)
            listed = "; ".join(f"line {line} ({col})" for line, col in self.open_quotes[:_LISTED])
            more = f"; and {n - _LISTED:,} more" if n > _LISTED else ""
            out.append(
                f"{self.path}: {n:,} {'cell starts' if n == 1 else 'cells start'} with a double quote that "
                f"{'its' if n == 1 else 'their'} line does not close, kept as written (a .tsv row is one "
                f"line): {listed}{more}"
            )
        return out


_LISTED = 10  # lines a note names
_FIELD_LIMIT = 2**31 - 1  # for csv.field_size_limit (a C long on every platform): a long cell is read whole


class _Row(NamedTuple):
    """One non-blank row of a .csv or .tsv file."""

    start: int  # its first physical line
    end: int  # its last
    cells: list[str]
    lines: list[str]  # its physical lines when it spans several (.csv), else empty
    opened: list[int]  # (.tsv) its cells that open a double quote the line does not close, kept as written


def _open_text(path: str) -> TextIO:
    if is_remote(path):
        return io.TextIOWrapper(open_input(path), encoding="utf-8-sig", newline="")
    return open(path, newline="", encoding="utf-8-sig")


def _csv_rows(f: TextIO, path: str, counted: list[int]) -> Iterator[_Row]:
    """Every non-blank row of a .csv (RFC 4180, as spreadsheets write it: a cell in double quotes may
    hold commas, quotes written twice and line breaks), read strictly: a quote left open to the end of
    the file, or a quoted cell that goes on after its closing quote, is refused naming its line.
    ``counted[0]``: the physical lines read so far."""
    held: list[str] = []  # the physical lines of the row being read

    def physical() -> Iterator[str]:
        for line in f:
            held.append(line)
            yield line

    reader = csv.reader(physical(), strict=True)
    limit = csv.field_size_limit(_FIELD_LIMIT)  # no cell limit of csv's own (131,072 characters)
    try:
        while True:
            start = counted[0] + 1
            held.clear()
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise _bad_quoting(path, str(e), start, reader.line_num) from None
            counted[0] = reader.line_num
            if cells:  # csv gives [] for a blank line
                yield _Row(start, reader.line_num, cells, list(held) if reader.line_num > start else [], [])
    finally:
        csv.field_size_limit(limit)


def _bad_quoting(path: str, reason: str, start: int, now: int) -> SourceError:
    if "unexpected end of data" in reason:
        return SourceError(
            f"{path}: line {start}: a double quote opens a cell that is never closed, so the rest of the "
            f"file (lines {start}-{now}) would be read as that one cell. Close the quote where the cell ends, "
            f'or remove it (a quote inside a cell is written twice, ""). Nothing was written.'
        )
    where = f"line {start}" if now == start else f"lines {start}-{now}"
    return SourceError(
        f"{path}: {where}: malformed quoting ({reason}): a cell in double quotes must end at its closing "
        f'quote, and a quote inside it is written twice (""). Nothing was written.'
    )


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _tsv_rows(f: TextIO, counted: list[int]) -> Iterator[_Row]:
    """Every non-blank line of a .tsv as a row (``_tsv_cells``)."""
    lines = _LINE_BREAK.split(f.read())
    if lines and not lines[-1]:
        lines.pop()  # the last line's break
    counted[0] = len(lines)
    for number, line in enumerate(lines, 1):
        if line:
            cells, opened = _tsv_cells(line)
            yield _Row(number, number, cells, [], opened)


def _tsv_cells(line: str) -> tuple[list[str], list[int]]:
    """A .tsv line's cells, and which of them open a double quote the line does not close.

    A row is one line: a cell holds no tab and no line break (text/tab-separated-values). A cell wholly
    in double quotes, ``"..."`` with each inner quote written twice (what spreadsheets and pandas write
    around a cell holding a quote), is unquoted; any other double quote is a character of its cell."""
    cells: list[str] = []
    opened: list[int] = []
    i, n = 0, len(line)
    while True:
        if line.startswith('"', i):
            parts, j, end = [], i + 1, -1
            while (k := line.find('"', j)) >= 0:
                if line.startswith('""', k):  # a quote written twice
                    parts.append(line[j : k + 1])
                    j = k + 2
                    continue
                parts.append(line[j:k])
                end = k + 1
                break
            if end >= 0 and (end == n or line[end] == "\t"):  # the whole cell is quoted
                cells.append("".join(parts))
                if end == n:
                    return cells, opened
                i = end + 1
                continue
            if end < 0:
                opened.append(len(cells))
        k = line.find("\t", i)
        if k < 0:
            cells.append(line[i:])
            return cells, opened
        cells.append(line[i:k])
        i = k + 1


def _reads_as_row(line: str, delimiter: str, width: int) -> bool:
    """Whether a physical line, read alone, is a row of ``width`` cells."""
    try:
        cells = next(csv.reader([line.rstrip("\r\n")], delimiter=delimiter), [])
    except csv.Error:
        return False
    return len(cells) == width


def read_table(path: str) -> Table:
    """A manifest's rows: CSV (UTF-8, optional BOM; ``_csv_rows``), TSV (``_tsv_cells``) or JSON lines
    (blank lines skipped). Every row is a record or a refusal naming its line: a .csv cell in quotes
    spanning lines is kept (``Table.spans``) unless one of those lines reads as a row of its own."""
    suffix = os.path.splitext(path)[1].lower()
    records: list[tuple[int, dict]] = []
    try:
        with _open_text(path) as f:
            if suffix in (".jsonl", ".ndjson"):
                names: dict[str, None] = {}
                line_no = 0
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
                return Table("jsonl", path, list(names), records, lines=line_no)
            if suffix not in (".csv", ".tsv"):
                raise SourceError(
                    f"{path}: unknown manifest type {suffix!r}; expected .csv, .tsv or .jsonl "
                    "(or pass an image folder ROOT/<label>/<file>)"
                )
            return _read_delimited(f, path, "\t" if suffix == ".tsv" else ",")
    except OSError as e:
        raise SourceError(f"cannot read manifest {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _read_delimited(f: TextIO, path: str, delimiter: str) -> Table:
    counted = [0]
    rows = _tsv_rows(f, counted) if delimiter == "\t" else _csv_rows(f, path, counted)
    first = next(rows, None)
    header = first.cells if first is not None else []
    if delimiter == "," and len(header) == 1 and ";" in header[0]:
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
    nameless = [i for i, n in enumerate(header) if not n.strip()]
    table = Table("csv", path, [n for n in header if n.strip()], [])
    opened_before: int | None = None  # (.tsv) the last line with a cell opening a quote left open
    for row in rows:
        if len(row.cells) != len(header):
            hint = (
                f" Line {opened_before} has a cell that opens a double quote its line does not close: a .tsv "
                "row is one line, so a cell cannot hold a line break (save the file as .csv, which quotes such "
                "cells, or as .jsonl)."
                if opened_before is not None and opened_before < row.start
                else ""
            )
            raise SourceError(
                f"{path}: line {row.start} has {len(row.cells)} cells, but the header has {len(header)} columns: "
                f"a cell that holds the delimiter {delimiter!r} must be in double quotes, and every row needs a "
                f"cell for every column (empty for a missing value).{hint} Nothing was written."
            )
        if row.lines:  # a quoted cell holds line breaks: none of its lines may read as a row of its own
            for number, line in enumerate(row.lines[1:], row.start + 1):
                if _reads_as_row(line, delimiter, len(header)):
                    raise SourceError(
                        f"{path}: line {row.start}: a double quote opens a cell that closes only on line "
                        f"{row.end}, so lines {row.start + 1}-{row.end} would be read as part of that cell; yet "
                        f"line {number} reads as a row of its own ({line.rstrip()[:80]!r}): a quote left open "
                        f"swallows the rows after it. Remove the quote or close it on line {row.start} (a quote "
                        f'inside a cell is written twice, ""); if the cell really holds those lines, write the '
                        f"manifest as JSON lines (.jsonl). Nothing was written."
                    )
            table.spans.append(
                (row.start, row.end, tuple(header[i] for i, c in enumerate(row.cells) if "\n" in c or "\r" in c))
            )
        filled = [i for i in nameless if row.cells[i].strip()]
        if filled:
            raise SourceError(
                f"{path}: column {filled[0] + 1} has no name in the header but holds values (line "
                f"{row.start}); name it in the header"
            )
        for i in row.opened:
            table.open_quotes.append((row.start, header[i]))
            opened_before = row.start
        table.records.append((row.start, dict(zip(header, row.cells))))
    table.lines = counted[0]
    return table


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
