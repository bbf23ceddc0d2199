"""Read a corpus into rows: a CSV/JSONL manifest or an image-folder tree ``ROOT/<label>/<file>``."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InvalidKeyError, OptionError, SourceError, SourceNotFoundError
from ..format.meta import MetaColumn, value_text
from ..similar.near import DEFAULT_THRESHOLD
from ..storage.transport import exists, is_remote, join
from .dedup import NearFinder, NearRows
from .manifest import ANY_EXTENSION, Bound, Columns, bind, cell_text, metadata_values, read_table
from .plan import Unit, split_groups
from .scan import HASH_ALGORITHMS
from .splitbase import SplitBase

if TYPE_CHECKING:
    from .options import ConvertOptions

__all__ = [
    "IMAGE_EXTENSIONS",
    "KEY_PATTERN",
    "MAX_KEY_LENGTH",
    "SourceRow",
    "Source",
    "read_source",
    "sanitize_keys",
    "check_keys",
    "dedup_notes",
    "with_other_extensions",
]

# .jfif/.jpe are JPEGs; .heic/.heif need pillow-heif (the 'heif' extra: without it each fails naming it),
# .avif Pillow's own codec
IMAGE_EXTENSIONS = {
    ".jpg",
    ".jpeg",
    ".jfif",
    ".jpe",
    ".png",
    ".webp",
    ".gif",
    ".tif",
    ".tiff",
    ".bmp",
    ".heic",
    ".heif",
    ".avif",
}
"""The file extensions an image folder's walk converts (lower case)."""
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
"""A valid sample key: it becomes tar member names ``<key>.npy`` (no dots, where webdataset splits, no slashes)."""
MAX_KEY_LENGTH = 95
"""The longest key: the longest member name, ``<key>.json``, must fit ustar's 100-byte name field."""
_SPLIT_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,32}")
_HEX = re.compile(r"[0-9a-f]+")
_MAX_LISTED = 10


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One manifest row (or image-folder file): where its image is, its key, label and split."""

    key: str  # the sample key written to the tars
    path: str  # absolute path used to read the file
    source_path: str  # the path as the manifest wrote it (or relative to the image folder)
    label: str  # class name
    split: str
    line: int  # manifest line (or 1-based file position in an image folder), for messages
    original_key: str | None = None  # set when the key was mapped by sanitizing
    content_hash: str | None = None  # "sha256:<hex>" or "md5:<hex>" from a manifest hash column
    meta: tuple | None = None  # the metadata columns' values (None: missing), in Source.metadata order
    error: str | None = None  # why the row fails before its file is looked at (a path template's empty cell)


@dataclass(frozen=True)
class Source:
    """A manifest or image folder read whole: its rows, classes and typed metadata columns."""

    kind: str  # "csv", "jsonl" or "image-folder"
    path: str
    rows: list[SourceRow]
    classes: list[str]  # class names; the label index of a row is its position here
    metadata: tuple[MetaColumn, ...] = ()  # the manifest's other columns, typed
    columns: Columns = Columns()
    split_base: str | None = None  # the version whose groups kept their split (ConvertOptions.draws_units)
    skipped: tuple[dict, ...] = ()  # an image folder's files not converted: {"path", "reason"}, in walk order
    dedup: int | None = None  # --dedup: the threshold near-duplicate clusters were joined within
    dedup_joined: tuple[int, int] = (0, 0)  # --dedup: (joined units of several units, the rows in them)
    dedup_flat: tuple[str, ...] = ()  # --dedup: the keys of the rows too flat to hash (joined with none)
    dedup_uncoloured: tuple[str, ...] = ()  # --dedup: keys whose colour could not be read (hashes alone)
    notes: tuple[str, ...] = ()  # the manifest's rows on several lines, its .tsv quotes kept (Table.notes)
    split_given: int = 0  # rows whose split a manifest split column gave (the others are drawn)

    def label_index(self) -> dict[str, int]:
        """Class name -> label index."""
        return {name: i for i, name in enumerate(self.classes)}

    def meta_json(self, row: SourceRow) -> str:
        """The row's ``"meta"`` object as its sample's .json writes it (keys sorted, compact)."""
        return json.dumps(dict(self.meta_items(row) or ()), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def meta_items(self, row: SourceRow) -> tuple | None:
        """(name, value) pairs of the row's metadata, or None without metadata columns."""
        return tuple(zip((c.name for c in self.metadata), row.meta or ())) if self.metadata else None

    def digest(self) -> str:
        """sha256 over (key, source_path, label, split[, meta]) of every row: the source's identity."""
        h = hashlib.sha256()
        for r in self.rows:
            tail = f"\t{self.meta_json(r)}" if self.metadata else ""
            h.update(f"{r.key}\t{r.source_path}\t{r.label}\t{r.split}{tail}\n".encode())
        return h.hexdigest()


def _key_hash(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=4).hexdigest()


def sanitize_keys(originals: list[str], bases: list[str] | None = None) -> list[str]:
    """Map arbitrary strings to valid, unique keys, deterministically.

    Characters of ``bases`` (default: the originals) outside ``[A-Za-z0-9_-]`` become ``_``;
    a key that was truncated or that collides with another after mapping gets
    ``-<8 hex digits of blake2b(original)>``.
    """
    mapped = []
    for k in bases if bases is not None else originals:
        m = re.sub(r"[^A-Za-z0-9_-]", "_", k) or "_"
        mapped.append((m[: MAX_KEY_LENGTH - 9], len(m) > MAX_KEY_LENGTH - 9))
    counts = Counter(m for m, _ in mapped)
    out = []
    for k, (m, truncated) in zip(originals, mapped):
        out.append(f"{m}-{_key_hash(k)}" if truncated or counts[m] > 1 else m)
    return out


def check_keys(rows: list[tuple[int, str]], where: str) -> None:
    """Refuse invalid or duplicate keys, naming the rows; ``rows`` is (line, key)."""
    bad = [(line, k) for line, k in rows if len(k) > MAX_KEY_LENGTH or not KEY_PATTERN.fullmatch(k)]
    if bad:
        listed = "; ".join(f"line {line}: {k!r}" for line, k in bad[:_MAX_LISTED])
        more = f" (and {len(bad) - _MAX_LISTED} more)" if len(bad) > _MAX_LISTED else ""
        raise InvalidKeyError(
            f"{where}: {len(bad)} invalid key(s){more}: {listed}. Keys become tar member names, so "
            f"they must match [A-Za-z0-9_-]{{1,{MAX_KEY_LENGTH}}} (no dots, slashes or spaces). "
            "Fix them, or pass --sanitize-keys to map them (the original is kept in the sample's json)."
        )
    lines = defaultdict(list)
    for line, k in rows:
        lines[k].append(line)
    dups = [(k, ls) for k, ls in lines.items() if len(ls) > 1]
    if dups:
        listed = "; ".join(f"{k!r} at lines {', '.join(map(str, ls[:5]))}" for k, ls in dups[:_MAX_LISTED])
        more = f" (and {len(dups) - _MAX_LISTED} more)" if len(dups) > _MAX_LISTED else ""
        raise InvalidKeyError(f"{where}: {len(dups)} duplicate key(s){more}: {listed}. Every key must be unique.")


_INTEGER_LABEL = re.compile(r"0|[1-9][0-9]*")  # ASCII only: str.isdigit also takes '²' and '٣'


def _classes(labels: set[str], where: str, lines: dict[str, int] | None = None) -> list[str]:
    """Class names in label-index order: plain integers by value (gaps filled) when every label is one
    (``0`` or ``[1-9][0-9]*``, so ``07`` and ``7`` never meet as one class), else sorted names.
    ``lines``: a label's first line, for the message."""
    if labels and all(_INTEGER_LABEL.fullmatch(s) for s in labels):
        top = max(labels, key=int)
        if int(top) > MAX_CLASS_INDEX:
            at = f" (line {lines[top]})" if lines and top in lines else ""
            raise SourceError(
                f"{where}: integer label {top}{at} is too large for a class index (at most {MAX_CLASS_INDEX}): "
                "when every label is an integer, the labels are the class indexes. Write the labels as names "
                "(e.g. with a letter in front) to have them sorted as names instead"
            )
        return [str(i) for i in range(int(top) + 1)]
    return sorted(labels)


MAX_CLASS_INDEX = 100_000
_INTEGER_TEXT = re.compile(r"(0|[1-9][0-9]*)(\.0+)?")  # 2, 2.0, 2.00: what pandas writes for an int column with gaps
_EXACT = 2**53  # a double holds every integer up to here, not every one past it


def _label_texts(values: list[tuple[int, object]], path: str) -> list[str]:
    """Each row's label text by value: a JSON number or a text ``2``/``2.0`` whose value is a
    non-negative integer is that integer's digits (so ``2``, ``2.0`` and ``"2"`` are one class
    ``"2"``), taken from the digits as written, never through a double; other text and numbers as
    written (JSON numbers as Python's json writes them); a JSON boolean is ``true``/``false``,
    refused among numbers (it would silently be 1 or 0). A JSON number with a fraction or exponent
    whose value is a whole number of 2**53 or more is refused: json has read it as a double, which
    may have lost its digits. Two texts that name one number (``2.5``, ``"2.50"``, compared as
    exact decimals) are refused, naming the rows."""
    out: list[str] = []
    booleans: list[int] = []
    inexact: list[int] = []
    numbers: dict[Decimal, dict[str, list[int]]] = {}
    for line, value in values:
        if isinstance(value, bool):
            booleans.append(line)
            out.append("true" if value else "false")
            continue
        text = cell_text(value) or ""
        if isinstance(value, float) and value.is_integer() and abs(value) >= _EXACT:
            inexact.append(line)
        if isinstance(value, (int, float)) or _INTEGER_TEXT.fullmatch(text):
            number = Decimal(text)  # exact: the digits as written (a JSON float: Python's repr of it)
            if number.is_finite() and number >= 0 and number == number.to_integral_value():
                text = str(int(number))
            numbers.setdefault(number, {}).setdefault(text, []).append(line)
        elif isinstance(value, str) and _FLOAT_TEXT.fullmatch(text):
            numbers.setdefault(Decimal(text), {}).setdefault(text, []).append(line)
        out.append(text)
    if inexact:
        raise SourceError(
            f"{path}: the label at line(s) {', '.join(map(str, inexact[:5]))} is a JSON number with a fraction or "
            f"exponent whose value is a whole number of 2**53 or more: JSON readers take such a number as a "
            f"double, which does not hold every integer that large, so its digits may already be lost. Write "
            f"the label as a JSON integer (no '.0', no exponent) or as a string"
        )
    if booleans and numbers:
        first_number = min(ln for texts in numbers.values() for lines in texts.values() for ln in lines)
        raise SourceError(
            f"{path}: the label at line(s) {', '.join(map(str, booleans[:5]))} is a JSON boolean (true/false), "
            f"and other labels are numbers (line {first_number}); a boolean is not silently the class 1 or 0. "
            "Write the label as a number or as a class name in quotes"
        )
    for number, texts in numbers.items():
        if len(texts) > 1:
            listed = "; ".join(
                f"{t!r} at line(s) {', '.join(map(str, lines[:5]))}" for t, lines in sorted(texts.items())
            )
            shown = str(int(number)) if number == number.to_integral_value() else str(number.normalize())
            raise SourceError(
                f"{path}: labels {listed} name one value, {shown}, written differently; "
                "write every label of one class the same way"
            )
    return out


_FLOAT_TEXT = re.compile(r"[+-]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _field(obj: dict, name: str, path: str, line: int, option: str, required: bool = True) -> str:
    value = obj.get(name)
    if value is None or str(value).strip() == "":
        if required:
            shown = f"{name!r}" if option == f"--{name}" else f"{name!r} ({option})"
            raise SourceError(f"{path}: line {line}: empty or missing {shown}")
        return ""
    return str(value).strip()


def _content_hash(obj: dict, path: str, line: int) -> str | None:
    """The row's "algo:hex" from a sha256 (preferred) or md5 column; None when it has neither."""
    for algo, digits in HASH_ALGORITHMS.items():
        value = obj.get(algo)
        if value is None or str(value).strip() == "":
            continue
        text = str(value).strip().lower()
        if len(text) != digits or not _HEX.fullmatch(text):
            raise SourceError(
                f"{path}: line {line}: {algo} {str(value)[:80]!r} is not {digits} hex digits; fix the "
                f"value, or remove the {algo} column (it only lets a new version skip reading unchanged files)"
            )
        return f"{algo}:{text}"
    return None


def _path_of(obj: dict, bound: Bound, path: str, line: int) -> tuple[list[str], str | None]:
    """(source paths to try, error): a column's value, or the template filled in (with choices, every
    candidate in the order tried); an empty cell the template needs makes the row fail (listed in
    errors.jsonl) rather than name another file."""
    t = bound.template
    if t.bare:
        return [_field(obj, bound.columns.path, path, line, "--path")], None
    cells, error = {}, None
    for name in t.fields:
        text = cell_text(obj.get(name))
        if text is None and error is None:
            error = f"column {name!r} is empty; --path {t.text!r} needs it"
        cells[name] = text or ""
    return t.candidates(cells), error


class _Folders:
    """The names in each local folder, listed once (a template's ``.*``, a missing file's other extensions)."""

    def __init__(self) -> None:
        self._names: dict[str, dict[str, list[str]]] = {}

    def same_stem(self, path: str) -> list[str]:
        """The image files beside ``path`` named like it but for the extension (any case), sorted; ``path``
        may end with ``.*``."""
        folder, name = os.path.split(path)
        stem = name[:-2] if name.endswith(".*") else os.path.splitext(name)[0]
        if folder not in self._names:
            by_stem: dict[str, list[str]] = {}
            try:
                with os.scandir(folder or ".") as entries:
                    for e in entries:
                        base, ext = os.path.splitext(e.name)
                        if ext.lower() in IMAGE_EXTENSIONS:
                            by_stem.setdefault(base, []).append(e.name)
            except OSError:
                pass
            self._names[folder] = {k: sorted(v) for k, v in by_stem.items()}
        return [os.path.join(folder, n) for n in self._names[folder].get(stem, ()) if n != name]


def _choose(candidates: list[str], base: str, folders: _Folders) -> tuple[str, str | None, list[str]]:
    """(the path taken, error, the other candidates that exist too) of a template with choices: the first
    candidate that is a file (local: any image extension for ``.*``), else the first with an error naming
    what was tried."""
    found: list[str] = []
    for rel in candidates:
        full = rel if is_remote(rel) else join(base, rel) if is_remote(base) else os.path.join(base, rel)
        if rel.endswith(ANY_EXTENSION):
            if is_remote(full):
                raise OptionError(
                    f"--path ending with '.*' looks the files up in their folder, which is local only; "
                    f"{full} is not: list the extensions in braces instead, e.g. .{{jpg,png,heic}}"
                )
            found += [os.path.join(os.path.dirname(rel), os.path.basename(p)) for p in folders.same_stem(full)]
        elif exists(full) if is_remote(full) else os.path.isfile(full):
            found.append(rel)
    if found:
        return found[0], None, found[1:]
    tried = ", ".join(candidates[:6]) + (f" and {len(candidates) - 6} more" if len(candidates) > 6 else "")
    return candidates[0], f"missing file: none of {tried} exists", []


def _read_manifest(path: str, opts: ConvertOptions, split_base: SplitBase | None, near: NearFinder | None) -> Source:
    table, columns = read_table(path), opts.columns
    if not table.records:
        raise SourceError(f"{path}: the manifest has no rows")
    bound = bind(table, columns)
    meta_columns, meta_values = metadata_values(table, bound.metadata) if bound.metadata else ([], None)
    base = path.rsplit("/", 1)[0] if is_remote(path) else str(Path(path).parent.resolve())
    originals, raw = [], []
    folders, several = _Folders(), []
    for line, obj in table.records:
        key = _field(obj, columns.key, path, line, "--key")
        candidates, error = _path_of(obj, bound, path, line)
        rel = candidates[0]
        if bound.template.choices and error is None:
            rel, error, others = _choose(candidates, base, folders)
            if others:
                several.append((line, rel, others))
        _field(obj, columns.label, path, line, "--label")  # refuses an empty label
        label = obj[columns.label]
        split = _field(obj, bound.split, path, line, "--split", required=False) if bound.split else ""
        if split and not _SPLIT_PATTERN.fullmatch(split):
            raise SourceError(f"{path}: line {line}: split {split!r} must match [A-Za-z0-9_-]{{1,32}}")
        originals.append(key)
        raw.append((line, rel, label, split, _content_hash(obj, path, line), error))
    keys = sanitize_keys(originals) if opts.sanitize_keys else originals
    check_keys([(r[0], k) for r, k in zip(raw, keys)], str(path))
    texts = _label_texts([(r[0], r[2]) for r in raw], str(path))
    raw = [(r[0], r[1], t, *r[3:]) for r, t in zip(raw, texts)]
    rows = []
    for j, ((line, rel, label, split, content_hash, error), key, orig) in enumerate(zip(raw, keys, originals)):
        if is_remote(rel):
            full = rel
        elif is_remote(base):
            full = join(base, rel)
        else:
            full = os.path.normpath(rel if os.path.isabs(rel) else os.path.join(base, rel))
        rows.append(
            SourceRow(
                key=key,
                path=full,
                source_path=rel,
                label=label,
                split=split,
                line=line,
                original_key=orig if orig != key else None,
                content_hash=content_hash,
                meta=meta_values[j] if meta_values is not None else None,
                error=error,
            )
        )
    src = Source(
        table.kind,
        str(path),
        rows,
        _classes({r.label for r in rows}, str(path), {r.label: r.line for r in reversed(rows)}),
        tuple(meta_columns),
        columns,
        split_base.version if split_base is not None else None,
        dedup=DEFAULT_THRESHOLD if opts.dedup else None,
        notes=tuple(table.notes() + _several_note(bound.template.text, several)),
        split_given=sum(1 for r in rows if r.split),
    )
    return _with_splits(src, opts, split_base, near)


def with_other_extensions(src: Source, errors: list[str | None]) -> list[str | None]:
    """The scan's errors, each local "missing file" naming the image files beside it with the same name
    and another extension (``images/x.png`` for a missing ``images/x.jpg``), and how --path takes them."""
    folders = _Folders()
    out = list(errors)
    for i, (r, err) in enumerate(zip(src.rows, errors)):
        if err != "missing file" or is_remote(r.path):
            continue
        others = folders.same_stem(r.path)
        if not others:
            continue
        shown = [os.path.join(os.path.dirname(r.source_path), os.path.basename(p)) for p in others]
        own = os.path.splitext(r.source_path)[1].lstrip(".")
        exts = [own, *sorted({os.path.splitext(p)[1].lstrip(".") for p in shown} - {own})]
        hint = ""
        t = src.columns.path
        if src.kind != "image-folder" and "{" in t:  # a template (a path column names its files itself)
            stem, ext = os.path.splitext(t)
            hint = (
                f" (--path {stem + '.{' + ','.join(exts) + '}'!r} takes each of them, the first that exists; "
                "'.*' any image extension)"
                if ext and "{" not in ext and "}" not in ext
                else " (a --path template can list extensions, e.g. 'images/{image_id}.{jpg,png}')"
            )
        out[i] = f"missing file; {', '.join(shown[:3])} {'exists' if len(shown) == 1 else 'exist'}{hint}"
    return out


def _several_note(template: str, several: list[tuple[int, str, list[str]]]) -> list[str]:
    """The rows whose --path choices found more than one file: the first was taken."""
    if not several:
        return []
    listed = "; ".join(f"line {line}: {rel} (also {', '.join(others)})" for line, rel, others in several[:_MAX_LISTED])
    more = f"; and {len(several) - _MAX_LISTED:,} more" if len(several) > _MAX_LISTED else ""
    return [
        f"--path {template!r}: {len(several):,} {'row names' if len(several) == 1 else 'rows name'} more than one "
        f"existing file; the first in the order listed was taken: {listed}{more}"
    ]


def _joined(units: list[Unit], clusters: list[list[int]]) -> dict[Unit, Unit]:
    """Each unit -> its representative (the least unit) once the rows of each cluster share a unit."""
    parent: dict[Unit, Unit] = {u: u for u in units}

    def root(u: Unit) -> Unit:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for a, b in ((c[0], x) for c in clusters for x in c[1:]):
        ra, rb = root(units[a]), root(units[b])
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {u: root(u) for u in parent}


def _with_splits(src: Source, opts: ConvertOptions, split_base: SplitBase | None, near: NearFinder | None) -> Source:
    """Every row's split: the manifest's when given; else the key's hash (v1's rule), or, with a group
    column, stratification or ``near`` (--dedup), its unit's split (plan.split_groups), a base's units
    keeping theirs; with ``near``, the units of near-duplicate rows are joined first."""
    rows, seed, val_fraction = src.rows, opts.seed, opts.val_fraction
    if not opts.draws_units:  # a unit per key: assign_split, no split empty
        keyed = split_groups(
            {("k", r.key): {} for r in rows},
            seed=seed,
            val_fraction=val_fraction,
            fixed={("k", r.key): r.split for r in rows if r.split},
        )
        return replace(src, rows=[r if r.split else replace(r, split=keyed[("k", r.key)]) for r in rows])
    gi = [c.name for c in src.metadata].index(src.columns.group) if src.columns.group is not None else None
    labels = src.label_index()
    units: list[Unit] = []
    explicit: dict[Unit, dict[str, list[int]]] = {}
    unit_labels: dict[Unit, Counter] = {}  # unit -> its samples per label
    for r in rows:
        value = r.meta[gi] if gi is not None and r.meta is not None else None  # a group is a metadata column
        units.append(("g", value_text(value)) if value is not None else ("k", r.key))
    found = near([r.path for r in rows]) if near is not None else NearRows()
    rep = _joined(units, found.clusters) if near is not None else {u: u for u in units}
    members = Counter(rep.values())  # joined unit -> how many of the rows' own units it holds
    joined = {u for u, n in members.items() if n > 1}
    own = units
    units = [rep[u] for u in units]
    src = replace(
        src,
        dedup_joined=(len(joined), sum(u in joined for u in units)),
        dedup_flat=tuple(rows[x].key for x in found.flat),
        dedup_uncoloured=tuple(rows[x].key for x in found.uncoloured),
    )
    for r, unit in zip(rows, units):
        unit_labels.setdefault(unit, Counter())[labels[r.label]] += 1
        if r.split:
            explicit.setdefault(unit, {}).setdefault(r.split, []).append(r.line)
    clashes = [(u, where) for u, where in explicit.items() if len(where) > 1]
    if clashes:
        (kind, text), where = clashes[0]
        listed = "; ".join(
            f"{split} at line(s) {', '.join(map(str, lines[:5]))}" for split, lines in sorted(where.items())
        )
        what = (
            f"group {text!r} of column {src.columns.group!r}"
            if kind == "g" and src.columns.group is not None
            else f"the near-duplicate cluster of {text!r} (--dedup)"
        )
        raise SourceError(
            f"{src.path}: {what} is in {len(where)} splits of the "
            f"manifest's split column ({listed}); all samples of a group must be in "
            f"one split (that is what --group and --dedup are for). Fix the split column, or leave it empty for "
            f"that group to have it drawn" + (f" ({len(clashes) - 1} more such groups)" if len(clashes) > 1 else "")
        )
    fixed = {u: next(iter(where)) for u, where in explicit.items()}
    if split_base is not None:
        held: dict[Unit, dict[str, list[Unit]]] = {}  # joined unit -> split -> the base's units in it there
        for u, s in split_base.splits.items():
            if u in rep:
                held.setdefault(rep[u], {}).setdefault(s, []).append(u)
        moved = {u: where for u, where in held.items() if len(where) > 1 and u not in fixed}
        if moved:  # joining them would move a unit the base holds; keeping them apart would split a cluster
            raise _moves_a_base_unit(src, split_base.version, moved, found.clusters, own, rep)
        fixed = {**{u: next(iter(where)) for u, where in held.items()}, **fixed}
    chosen = split_groups(unit_labels, seed=seed, val_fraction=val_fraction, stratify=opts.stratify, fixed=fixed)
    return replace(src, rows=[replace(r, split=chosen[u]) for r, u in zip(rows, units)])


def _moves_a_base_unit(
    src: Source,
    base: str,
    moved: dict[Unit, dict[str, list[Unit]]],
    clusters: list[list[int]],
    own: list[Unit],
    rep: dict[Unit, Unit],
) -> SourceError:
    """The refusal of a --dedup link between units the split base holds in different splits: it names
    the first such joined unit's near-duplicate clusters (their keys), the base's units in each split,
    and what to do."""

    def name(u: Unit) -> str:
        kind, text = u
        return f"group {text!r}" if kind == "g" and src.columns.group is not None else f"sample {text!r}"

    unit, where = next(iter(sorted(moved.items())))
    linking = [c for c in clusters if rep[own[c[0]]] == unit]
    keys = "; ".join(", ".join(src.rows[x].key for x in c[:6]) + (", ..." if len(c) > 6 else "") for c in linking[:3])
    held = "; ".join(
        f"{', '.join(name(u) for u in sorted(units)[:4])}{', ...' if len(units) > 4 else ''} in {split}"
        for split, units in sorted(where.items())
    )
    more = f" ({len(moved) - 1} more such {'cluster' if len(moved) == 2 else 'clusters'})" if len(moved) > 1 else ""
    return SourceError(
        f"{src.path}: --dedup would move {'a group' if src.columns.group is not None else 'a sample'} that "
        f"{base} holds: the near-duplicate "
        f"{'cluster' if len(linking) == 1 else 'clusters'} of {keys} (within {src.dedup} bits) "
        f"{'joins' if len(linking) == 1 else 'join'} units that {base} holds in different splits ({held}), and "
        f"{base}'s splits are kept (build.split_base){more}. Remove or refile the copy, give these rows one "
        f"split in a split column, or pass --resplit to draw every split again"
    )


def _some_keys(keys: tuple[str, ...]) -> str:
    """The first ten keys, and how many more."""
    return ", ".join(keys[:10]) + (f" and {len(keys) - 10:,} more" if len(keys) > 10 else "")


def dedup_notes(src: Source) -> list[str]:
    """What --dedup did, for the summary and --json: the clusters joined, and the rows too flat to hash."""
    n, rows = src.dedup_joined
    out = [
        f"--dedup: {n:,} {'cluster' if n == 1 else 'clusters'} of near-duplicates (within {src.dedup} bits) "
        f"joined {rows:,} {'sample' if rows == 1 else 'samples'}' groups or keys, each cluster drawn into one "
        "split (wds-tools dups lists them)"
    ]
    if src.dedup_flat:
        flat = src.dedup_flat
        keys = _some_keys(flat)
        out.append(
            f"--dedup: {len(flat):,} {'sample' if len(flat) == 1 else 'samples'} too flat to hash (flat or smooth "
            f"pictures, docs/FORMAT.md), searched by their hashes as they are, which a copy may not share: {keys} "
            "(wds-tools dups lists them all)"
        )
    if src.dedup_uncoloured:
        some = src.dedup_uncoloured
        keys = _some_keys(some)
        out.append(
            f"--dedup: {len(some):,} unchanged {'source' if len(some) == 1 else 'sources'} could not be read again "
            f"to be checked against {'its' if len(some) == 1 else 'their'} near-duplicate candidates and "
            f"{'was' if len(some) == 1 else 'were'} joined with none (docs/FORMAT.md, Near-duplicates): {keys}"
        )
    return out


def _folder_files(root: Path) -> tuple[list[tuple[str, str]], list[dict]]:
    """(relative path, label) of every image file under ``root``'s label folders, and every entry not
    taken, with its reason. Symlinked folders are followed, each real folder once (a link back to a
    folder already walked, a loop, is listed instead)."""
    files: list[tuple[str, str]] = []
    skipped: list[dict] = []

    def rel(path: str) -> str:
        return os.path.relpath(path, root).replace(os.sep, "/")

    def skip(path: str, reason: str) -> None:
        skipped.append({"path": rel(path), "reason": reason})

    seen: set[tuple[int, int]] = set()
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            skip(str(entry), "hidden (its name starts with '.')")
            continue
        if not entry.is_dir():
            skip(str(entry), "not inside a label folder (an image folder is ROOT/<label>/<file>)")
            continue
        for dirpath, dirnames, filenames in os.walk(
            entry, followlinks=True, onerror=lambda e: skip(e.filename, f"unreadable folder: {e.strerror}")
        ):
            st = os.stat(dirpath)
            if (st.st_dev, st.st_ino) in seen:  # reached again through a symlink: a loop or a second link
                skip(dirpath, "a symlinked folder already walked (a loop or a second link): skipped")
                dirnames[:] = []
                continue
            seen.add((st.st_dev, st.st_ino))
            for d in sorted(d for d in dirnames if d.startswith(".")):
                skip(os.path.join(dirpath, d), "hidden folder (its name starts with '.')")
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                ext = os.path.splitext(name)[1].lower()
                if name.startswith("."):
                    skip(path, "hidden file (its name starts with '.')")
                elif ext not in IMAGE_EXTENSIONS:
                    skip(
                        path,
                        f"extension {ext or '(none)'!r} is not an image extension "
                        f"({', '.join(sorted(IMAGE_EXTENSIONS))})",
                    )
                else:
                    files.append((rel(path), entry.name))
    return files, skipped


def _read_folder(root: Path, opts: ConvertOptions, split_base: SplitBase | None, near: NearFinder | None) -> Source:
    files, skipped = _folder_files(root)
    if not files:
        listed = "; ".join(f"{s['path']}: {s['reason']}" for s in skipped[:3])
        raise SourceError(
            f"{root}: no images found; an image folder is ROOT/<label>/<file> with extensions "
            f"{', '.join(sorted(IMAGE_EXTENSIONS))}" + (f". Not taken: {listed}" if listed else "")
        )
    rels = [rel for rel, _ in files]
    keys = sanitize_keys(rels, bases=[os.path.splitext(rel)[0] for rel in rels])
    check_keys([(i, k) for i, k in enumerate(keys, 1)], str(root))
    rows = [
        SourceRow(
            key=k, path=str(root.resolve() / rel), source_path=rel, label=label, split="", line=i, original_key=rel
        )
        for i, ((rel, label), k) in enumerate(zip(files, keys), 1)
    ]
    src = Source(
        "image-folder",
        str(root),
        rows,
        _classes({r.label for r in rows}, str(root)),
        split_base=split_base.version if split_base is not None else None,
        skipped=tuple(skipped),
        dedup=DEFAULT_THRESHOLD if opts.dedup else None,
    )
    return _with_splits(src, opts, split_base, near)


def read_source(
    path: str | os.PathLike,
    opts: ConvertOptions,
    *,
    split_base: SplitBase | None = None,
    near: NearFinder | None = None,
) -> Source:
    """Read a manifest (.csv/.tsv/.jsonl) or an image folder with a conversion's options.

    A manifest's columns are ``key,path,label[,split][,sha256|md5]`` unless ``opts.columns`` names others
    (--key image_id --label dx --path 'images/{image_id}.jpg' --group lesion_id); its other columns are
    kept as typed metadata. With a group column or --stratify, splits are drawn per group
    (plan.split_groups), the groups of ``split_base`` keeping their split. The manifest and the paths in
    it may be fsspec URLs (s3://...); an image folder is local. ``near`` (--dedup) gives the
    near-duplicate pairs among the rows, whose units are joined first.
    """
    if is_remote(path):
        return _read_manifest(os.fspath(path), opts, split_base, near)
    p = Path(path)
    if p.is_dir():
        if not opts.columns.default or opts.columns.group is not None:
            raise OptionError(
                f"--key, --label, --path, --split and --group name a manifest's columns; {p} is an "
                "image folder (ROOT/<label>/<file>), which has none"
            )
        return _read_folder(p, opts, split_base, near)
    if not p.exists():
        raise SourceNotFoundError(f"source {p} does not exist; pass a manifest (.csv/.jsonl) or an image folder")
    return _read_manifest(str(p), opts, split_base, near)
