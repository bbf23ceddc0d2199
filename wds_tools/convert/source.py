"""Read a corpus into rows: a CSV/JSONL manifest or an image-folder tree ``ROOT/<label>/<file>``."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidKeyError, SourceError
from .check import HASH_ALGORITHMS
from .plan import assign_split
from .storage import is_remote, join, open_input

__all__ = [
    "IMAGE_EXTENSIONS",
    "KEY_PATTERN",
    "MAX_KEY_LENGTH",
    "SourceRow",
    "Source",
    "read_source",
    "sanitize_keys",
    "check_keys",
]

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".tif", ".tiff", ".bmp"}
# Keys become tar member names "<key>.npy": no dots (webdataset splits there), no slashes.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
MAX_KEY_LENGTH = 95  # the longest member name, <key>.json, must fit ustar's 100-byte name field
_SPLIT_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,32}")
_HEX = re.compile(r"[0-9a-f]+")
_MAX_LISTED = 10


@dataclass(frozen=True, slots=True)
class SourceRow:
    key: str  # the sample key written to the tars
    path: str  # absolute path used to read the file
    source_path: str  # the path as the manifest wrote it (or relative to the image folder)
    label: str  # class name
    split: str
    line: int  # manifest line (or 1-based file position in an image folder), for messages
    original_key: str | None = None  # set when the key was mapped by sanitizing
    content_hash: str | None = None  # "sha256:<hex>" or "md5:<hex>" from a manifest hash column


@dataclass(frozen=True)
class Source:
    kind: str  # "csv", "jsonl" or "image-folder"
    path: str
    rows: list[SourceRow]
    classes: list[str]  # class names; the label index of a row is its position here

    def label_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    def digest(self) -> str:
        """sha256 over (key, source_path, label, split) of every row: the source's identity."""
        h = hashlib.sha256()
        for r in self.rows:
            h.update(f"{r.key}\t{r.source_path}\t{r.label}\t{r.split}\n".encode())
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


def _classes(labels: set[str]) -> list[str]:
    """Class names in label-index order: plain integers by value (gaps filled) when every label is one
    (``0`` or ``[1-9][0-9]*``, so ``07`` and ``7`` never meet as one class), else sorted names."""
    if labels and all(_INTEGER_LABEL.fullmatch(s) for s in labels):
        top = max(int(s) for s in labels)
        if top > 100_000:
            raise SourceError(f"integer label {top} is too large for a class index (at most 100000)")
        return [str(i) for i in range(top + 1)]
    return sorted(labels)


def _open_text(path: str):
    if is_remote(path):
        return io.TextIOWrapper(open_input(path), encoding="utf-8-sig", newline="")
    return open(path, newline="", encoding="utf-8-sig")


def _manifest_records(path: str) -> tuple[str, list[tuple[int, dict]]]:
    suffix = os.path.splitext(path)[1].lower()
    records: list[tuple[int, dict]] = []
    try:
        with _open_text(path) as f:
            if suffix in (".jsonl", ".ndjson"):
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise SourceError(f"{path}: line {line_no} is not valid JSON: {e.msg}") from None
                    if not isinstance(obj, dict):
                        raise SourceError(f"{path}: line {line_no} is not a JSON object")
                    records.append((line_no, obj))
                return "jsonl", records
            if suffix not in (".csv", ".tsv"):
                raise SourceError(
                    f"{path}: unknown manifest type {suffix!r}; expected .csv, .tsv or .jsonl "
                    "(or pass an image folder ROOT/<label>/<file>)"
                )
            reader = csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ",")
            missing = {"key", "path", "label"} - set(reader.fieldnames or [])
            if missing:
                raise SourceError(
                    f"{path}: missing column(s) {', '.join(sorted(missing))}; found "
                    f"{', '.join(reader.fieldnames or []) or 'no header'}; expected key,path,label[,split]"
                )
            for obj in reader:
                records.append((reader.line_num, obj))
            return "csv", records
    except OSError as e:
        raise SourceError(f"cannot read manifest {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _field(obj: dict, name: str, path: Path, line: int, required: bool = True) -> str:
    value = obj.get(name)
    if value is None or str(value).strip() == "":
        if required:
            raise SourceError(f"{path}: line {line}: empty or missing {name!r}")
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


def _read_manifest(path: str, *, val_fraction: float, seed: int, sanitize: bool) -> Source:
    kind, records = _manifest_records(path)
    if not records:
        raise SourceError(f"{path}: the manifest has no rows")
    base = path.rsplit("/", 1)[0] if is_remote(path) else str(Path(path).parent.resolve())
    originals, raw = [], []
    for line, obj in records:
        key = _field(obj, "key", path, line)
        rel = _field(obj, "path", path, line)
        label = _field(obj, "label", path, line)
        split = _field(obj, "split", path, line, required=False)
        if split and not _SPLIT_PATTERN.fullmatch(split):
            raise SourceError(f"{path}: line {line}: split {split!r} must match [A-Za-z0-9_-]{{1,32}}")
        originals.append(key)
        raw.append((line, rel, label, split, _content_hash(obj, path, line)))
    keys = sanitize_keys(originals) if sanitize else originals
    check_keys([(r[0], k) for r, k in zip(raw, keys)], str(path))
    rows = []
    for (line, rel, label, split, content_hash), key, orig in zip(raw, keys, originals):
        if is_remote(rel):
            full = rel
        elif is_remote(base):
            full = join(base, rel)
        else:
            full = os.path.normpath(rel if os.path.isabs(rel) else os.path.join(base, rel))
        rows.append(SourceRow(
            key=key, path=full, source_path=rel, label=label,
            split=split or assign_split(key, seed=seed, val_fraction=val_fraction),
            line=line, original_key=orig if orig != key else None, content_hash=content_hash,
        ))
    return Source(kind, str(path), rows, _classes({r.label for r in rows}))


def _read_folder(root: Path, *, val_fraction: float, seed: int) -> Source:
    files: list[tuple[str, str]] = []  # (relative path, label)
    for label_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for dirpath, dirnames, filenames in os.walk(label_dir):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith(".") or os.path.splitext(name)[1].lower() not in IMAGE_EXTENSIONS:
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                files.append((rel, label_dir.name))
    if not files:
        raise SourceError(
            f"{root}: no images found; an image folder is ROOT/<label>/<file> with extensions "
            f"{', '.join(sorted(IMAGE_EXTENSIONS))}"
        )
    rels = [rel for rel, _ in files]
    keys = sanitize_keys(rels, bases=[os.path.splitext(rel)[0] for rel in rels])
    check_keys([(i, k) for i, k in enumerate(keys, 1)], str(root))
    rows = [
        SourceRow(key=k, path=str(root.resolve() / rel), source_path=rel, label=label,
                  split=assign_split(k, seed=seed, val_fraction=val_fraction), line=i,
                  original_key=rel)
        for i, ((rel, label), k) in enumerate(zip(files, keys), 1)
    ]
    return Source("image-folder", str(root), rows, _classes({r.label for r in rows}))


def read_source(path: str | os.PathLike, *, val_fraction: float = 0.1, seed: int = 0,
                sanitize_keys: bool = False) -> Source:
    """Read a manifest (.csv/.tsv/.jsonl with key,path,label[,split][,sha256|md5]) or an image folder.

    The manifest and the paths in it may be fsspec URLs (s3://...); an image folder is local.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise SourceError(f"val_fraction must be in [0, 1), not {val_fraction}")
    if is_remote(path):
        return _read_manifest(os.fspath(path), val_fraction=val_fraction, seed=seed, sanitize=sanitize_keys)
    p = Path(path)
    if p.is_dir():
        return _read_folder(p, val_fraction=val_fraction, seed=seed)
    if not p.exists():
        raise SourceError(f"source {p} does not exist; pass a manifest (.csv/.jsonl) or an image folder")
    return _read_manifest(str(p), val_fraction=val_fraction, seed=seed, sanitize=sanitize_keys)
