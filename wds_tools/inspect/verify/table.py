"""samples.npz, streamed: its columns read by row ranges (never a whole column at once, but the shard
column's per-row hash of keys), checked against their format and against index.json.

``SampleColumns`` finds each ``<column>.npy`` entry in the (uncompressed) ZIP and reads rows
``[start, stop)`` of any column with positioned reads (ranged requests on object storage and http),
so verify's memory does not grow with the table: at 1M samples the whole-table state is the
8-byte key hash per row. ``scan_table`` makes one pass in blocks of ``BLOCK_ROWS`` rows: the shard
column (in range, in shard order: each shard's rows are one range), labels (in range; counts per
class and split), npy_length (the image size), path offsets, and keys (each once).
"""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...format.index import SAMPLE_COLUMNS
from ...format.npy import NPY_HEADER_BYTES
from ...format.phash import WINDOWS
from ...format.sample import column_prefix
from ...format.tar import iter_chunks
from ...format.transport import RangedFile, file_size, is_local, open_ranged, read_ranges, scheme
from .index_file import IndexFacts
from .metadata import GroupSplits, block_names, block_problems
from .report import MAX_PER_KIND, Problem

__all__ = [
    "row_columns",
    "BLOCK_ROWS",
    "SampleColumns",
    "TableFacts",
    "open_columns",
    "file_digest",
    "check_samples_file",
    "scan_table",
]

BLOCK_ROWS = 1 << 16
"""Rows per block when samples.npz is streamed."""
ROW_COLUMNS = (
    "key",
    "label",
    "shard",
    "cls_offset",
    "cls_length",
    "json_offset",
    "json_length",
    "npy_offset",
    "npy_length",
)  # without these no row can be compared with a shard (version 1)


def row_columns(members: tuple[str, ...]) -> tuple[str, ...]:
    """``ROW_COLUMNS`` of a format version: key, label, shard and each member's offset and length."""
    return ("key", "label", "shard") + tuple(f"{column_prefix(m)}_{f}" for m in members for f in ("offset", "length"))


@dataclass
class _Column:
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # file offset of the first element
    row_bytes: int


class _RangedIO(io.RawIOBase):
    """A read-only seekable file over ``transport.RangedFile`` (for ``zipfile`` on object storage and http)."""

    def __init__(self, ranged: RangedFile) -> None:
        self.ranged, self.pos = ranged, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.ranged.size + offset
        return self.pos

    def readinto(self, b: Any) -> int:
        data = self.ranged.read(self.pos, len(b))
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


class SampleColumns:
    """Rows of samples.npz columns by positioned reads; ``problems`` lists entries not in the format."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.file = open_ranged(url)  # FileNotFoundError / OSError: the caller names them
        self.columns: dict[str, _Column] = {}
        self.problems: list[Problem] = []
        self._remote = not is_local(url) and scheme(url) not in ("http", "https")
        try:
            self._directory()
        except (zipfile.BadZipFile, OSError, ValueError, struct.error) as e:
            self.problems.append(Problem(name, "index", f"{url} is not a readable .npz (ZIP) file: {e}"))
            self.columns = {}

    def close(self) -> None:
        """Close samples.npz."""
        self.file.close()

    def _directory(self) -> None:
        with zipfile.ZipFile(io.BufferedReader(_RangedIO(self.file), 1 << 16)) as zf:
            infos = zf.infolist()
        for info in infos:
            column = info.filename.removesuffix(".npy")
            where = f"samples.npz entry {info.filename}"
            if info.compress_type != zipfile.ZIP_STORED:
                self.problems.append(
                    Problem(
                        self.name,
                        "column",
                        f"{where} is compressed; the format stores entries uncompressed (re-convert, or re-index)",
                    )
                )
                continue
            local = self.file.read(info.header_offset, 30)
            if len(local) < 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"no local header for {info.filename} at {info.header_offset}")
            n, extra = struct.unpack("<HH", local[26:30])
            data = info.header_offset + 30 + n + extra
            head = io.BytesIO(self.file.read(data, min(info.file_size, 1 << 16)))
            try:
                version = np.lib.format.read_magic(head)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(head)
            except (ValueError, EOFError) as e:
                self.problems.append(Problem(self.name, "column", f"{where} is not an NPY array: {e}"))
                continue
            items = int(np.prod(shape, dtype=np.int64))
            if fortran or dtype.hasobject or head.tell() + items * dtype.itemsize != info.file_size:
                self.problems.append(
                    Problem(
                        self.name,
                        "column",
                        f"{where}: {dtype.str} {list(shape)}"
                        f"{' in Fortran order' if fortran else ''} does not fit its "
                        f"{info.file_size:,} bytes",
                    )
                )
                continue
            row_items = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
            self.columns[column] = _Column(dtype, tuple(shape), data + head.tell(), row_items * dtype.itemsize)

    def check_format(self, columns: dict[str, str] = SAMPLE_COLUMNS) -> tuple[int, set[str]]:
        """(rows, usable columns): each column's dtype and shape against ``columns`` (the format
        version's, ``format.index.sample_columns``)."""
        key = self.columns.get("key")
        rows = key.shape[0] if key is not None and len(key.shape) == 1 else None
        usable = set()
        for name, want in columns.items():
            col = self.columns.get(name)
            if col is None:
                self.problems.append(Problem(self.name, "column", f"samples.npz has no column {name!r}"))
                continue
            dtype_ok = col.dtype.kind == "S" if want == "S" else col.dtype == np.dtype(want)
            shape = {
                "fingerprint": (rows, 16),
                "phash": (rows, WINDOWS),
                "path_offsets": (rows + 1,) if rows is not None else None,
                "path_data": (col.shape[0],) if len(col.shape) == 1 else None,
            }.get(name, (rows,))
            if not dtype_ok or rows is None or col.shape != shape:
                expected = "|S<n>" if want == "S" else np.dtype(want).str
                self.problems.append(
                    Problem(
                        self.name,
                        "column",
                        f"column {name!r} is {col.dtype.str} "
                        f"{list(col.shape)}; expected {expected} "
                        f"{list(shape) if shape and rows is not None else '[N]'}",
                    )
                )
                continue
            usable.add(name)
        return rows or 0, usable

    def read(self, names: list[str], start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows ``[start, stop)`` of each column in ``names`` (path_data: elements)."""
        cols = [self.columns[n] for n in names]
        starts = [c.start + start * c.row_bytes for c in cols]
        ends = [c.start + stop * c.row_bytes for c in cols]
        if self._remote:
            blobs = read_ranges([self.url] * len(cols), starts, ends)
        else:
            blobs = [self.file.read(s, e - s) for s, e in zip(starts, ends)]
        out = {}
        for n, c, blob, s, e in zip(names, cols, blobs, starts, ends):
            if isinstance(blob, BaseException):
                raise OSError(f"cannot read {self.url} at {s:,}: {blob}")
            if len(blob) != e - s:
                raise OSError(f"{self.url} ends at {self.file.size:,}, inside column {n!r}")
            out[n] = np.frombuffer(blob, c.dtype).reshape((stop - start,) + c.shape[1:])
        return out


def open_columns(url: str, name: str) -> tuple[SampleColumns | None, list[Problem]]:
    """samples.npz opened for row reads, or None and the problem that kept it closed."""
    try:
        table = SampleColumns(url, name)
    except FileNotFoundError:
        return None, [Problem(name, "index", f"{url} does not exist")]
    except OSError as e:
        return None, [Problem(name, "index", f"cannot read {url}: {e.strerror or e}")]
    return table, []


def file_digest(url: str) -> str:
    """SHA-256 of a file, read in 1 MiB chunks (never whole)."""
    sha = hashlib.sha256()
    for part in iter_chunks(url):
        sha.update(part)
    return sha.hexdigest()


def check_samples_file(url: str, facts: IndexFacts, quick: bool) -> list[Problem]:
    """samples.npz's size, and its sha256 unless quick (read in chunks, never whole)."""
    name = facts.samples_name
    try:
        size = file_size(url)
        if facts.samples_bytes is not None and size != facts.samples_bytes:
            return [Problem(name, "index", f"{size:,} bytes, index.json says {facts.samples_bytes}")]
        digest = None if quick else file_digest(url)
    except FileNotFoundError:
        return []  # open_columns names it
    except OSError as e:
        return [Problem(name, "index", f"cannot read {url}: {e.strerror or e}")]
    if digest is not None and facts.samples_sha256 is not None and digest != facts.samples_sha256:
        return [Problem(name, "index", f"sha256 {digest[:16]}..., index.json says {str(facts.samples_sha256)[:16]}...")]
    return []


@dataclass
class TableFacts:
    """What one pass over samples.npz found (for count checks and the shard jobs)."""

    rows: int = 0
    usable: set[str] = field(default_factory=set)
    per_shard: np.ndarray | None = None  # rows by shard position, from the shard column
    ranges: list[tuple[int, int]] | None = None  # each shard position's rows, when rows are in shard order
    labels: np.ndarray | None = None  # samples per label
    labels_by_split: dict[str, np.ndarray] | None = None
    npy_size: int | None = None  # S when every npy_length is 128 + 3·S²
    paths_ok: bool = False


def _key_hash(keys: np.ndarray) -> np.ndarray:
    """FNV-1a (64-bit) of each NUL-padded key, vectorized over rows; equal keys give equal hashes."""
    b = keys.view(np.uint8).reshape(len(keys), keys.dtype.itemsize)
    h = np.full(len(keys), 0xCBF29CE484222325, np.uint64)
    prime = np.uint64(0x100000001B3)
    for j in range(b.shape[1]):
        h ^= b[:, j]
        h *= prime
    return h


def scan_table(
    table: SampleColumns, rows: int, usable: set[str], facts: IndexFacts, categories: dict[int, list[str]] | None = None
) -> tuple[TableFacts, list[Problem]]:
    """One pass over samples.npz in blocks: order, ranges, counts, sizes and unique keys; with
    ``categories`` (the metadata's string values; None: its columns are unusable) the metadata
    columns' values, and no group of ``build.group`` in two splits."""
    out = TableFacts(rows, usable)
    problems: list[Problem] = []
    name = table.name

    def bad(message: str, kind: str = "column", key: str | None = None) -> None:
        problems.append(Problem(name, kind, message, key=key))

    n_shards = len(facts.shards)
    n_classes = len(facts.classes) if facts.classes is not None else None
    split_names = sorted(facts.splits)
    split_of = np.array(
        [split_names.index(s.split) if s.split in facts.splits else -1 for s in facts.shards] + [-1], np.int64
    )
    want_len = NPY_HEADER_BYTES + 3 * facts.size**2 if facts.size else None
    per_shard = np.zeros(n_shards, np.int64)
    label_counts = np.zeros(max(n_classes or 0, 1), np.int64)
    by_split = np.zeros((len(split_names) + 1, max(n_classes or 0, 1)), np.int64)
    hashes = np.empty(rows, np.uint64) if "key" in usable else None
    lengths: dict[int, int] = {}  # npy_length -> first row
    shard_ok = "shard" in usable and n_shards > 0
    out_of_range = unordered = bad_labels = 0
    first_range = first_order = first_label = None
    last_shard = -1
    paths_ok = {"path_offsets", "path_data"} <= usable
    path_total = table.columns["path_data"].shape[0] if paths_ok else 0
    last_path = 0
    wanted = [c for c in ("shard", "label", "key", "npy_length") if c in usable]
    meta_cols = facts.metadata if categories is not None and facts.metadata else []
    wanted += block_names(meta_cols)
    groups = None
    if meta_cols and facts.group is not None and shard_ok:
        i = [c.name for c in meta_cols].index(facts.group)
        groups = GroupSplits(meta_cols[i], i, split_names, categories.get(i))
    meta_problems: list[Problem] = []
    for start in range(0, rows, BLOCK_ROWS):
        stop = min(rows, start + BLOCK_ROWS)
        block = table.read(wanted, start, stop)
        if meta_cols and len(meta_problems) < MAX_PER_KIND:
            meta_problems += block_problems(name, start, block, meta_cols, categories)
        if shard_ok:
            sh = block["shard"].astype(np.int64)
            outside = np.flatnonzero(sh >= n_shards)
            if len(outside) and first_range is None:
                first_range = start + int(outside[0])
            out_of_range += len(outside)
            down = np.flatnonzero(np.diff(np.concatenate([[last_shard], sh])) < 0)
            if len(down) and first_order is None:
                first_order = start + int(down[0])
            unordered += len(down)
            last_shard = int(sh[-1])
            inside = sh[sh < n_shards]
            per_shard += np.bincount(inside, minlength=n_shards)[:n_shards]
            if groups is not None:
                groups.add(block, split_of[np.minimum(sh, n_shards)])
        if "label" in usable:
            lab = block["label"].astype(np.int64)
            top = n_classes if n_classes is not None else int(lab.max(initial=-1)) + 1
            bad_rows = np.flatnonzero((lab < 0) | (lab >= top))
            if len(bad_rows) and first_label is None:
                first_label = (start + int(bad_rows[0]), int(lab[bad_rows[0]]))
            bad_labels += len(bad_rows)
            good = (lab >= 0) & (lab < top)
            if top > len(label_counts):
                label_counts = np.pad(label_counts, (0, top - len(label_counts)))
                by_split = np.pad(by_split, ((0, 0), (0, top - by_split.shape[1])))
            label_counts += np.bincount(lab[good], minlength=len(label_counts))
            if shard_ok:
                sp = split_of[np.minimum(sh, n_shards)][good]
                flat = np.bincount((sp + 1) * by_split.shape[1] + lab[good], minlength=by_split.size)
                by_split += flat.reshape(by_split.shape)
        if "npy_length" in usable:
            for v in np.unique(block["npy_length"]).tolist():
                lengths.setdefault(int(v), start + int(np.argmax(block["npy_length"] == v)))
        if hashes is not None:
            hashes[start:stop] = _key_hash(block["key"])
            empty = np.flatnonzero(block["key"] == b"")
            if len(empty):
                bad(f"row {start + int(empty[0]):,}: the key is empty ({len(empty)} row(s) in this block)")
        if paths_ok:
            po = table.read(["path_offsets"], start, stop + 1)["path_offsets"]
            if po[0] != last_path or np.any(np.diff(po.astype(np.int64)) < 0) or po[-1] > path_total:
                paths_ok = False
                bad(
                    f"path_offsets is not non-decreasing from 0 to len(path_data) = {path_total:,} in rows "
                    f"{start:,}..{stop:,}; source paths are not compared"
                )
            last_path = int(po[-1])
    if paths_ok and rows and last_path != path_total:
        paths_ok = False
        bad(f"path_offsets ends at {last_path:,}; path_data holds {path_total:,} bytes")
    out.paths_ok = paths_ok
    if out_of_range:
        bad(
            f"{out_of_range:,} row(s) name a shard position past the {n_shards} in index.json "
            f"(first: row {first_range:,})"
        )
    if unordered:
        bad(
            f"rows are not in shard order ({unordered:,} step(s) back, first at row {first_order:,}); the "
            "format orders rows by shard, then file position"
        )
    if bad_labels:
        row, value = first_label
        bad(
            f"{bad_labels:,} label(s) are not a class index 0..{(n_classes or 1) - 1} (first: row {row:,}, {value})",
            kind="label",
        )
    if shard_ok:
        out.per_shard = per_shard
    if "label" in usable:
        out.labels = label_counts
        if shard_ok:
            out.labels_by_split = {s: by_split[i + 1] for i, s in enumerate(split_names)}
    out.ranges = _ranges(out, facts, shard_ok and not out_of_range and not unordered)
    problems += meta_problems
    if groups is not None:
        problems += groups.problems()
    problems += _size_problems(name, lengths, facts, want_len, out)
    if hashes is not None:
        problems += _duplicates(table, hashes, facts)
    return out, problems


def _ranges(out: TableFacts, facts: IndexFacts, ordered: bool) -> list[tuple[int, int]] | None:
    """Each shard position's rows: from the shard column when it is in order, else from index.json's
    counts when they add up to the rows."""
    if ordered:
        counts = out.per_shard.tolist()
    elif all(s.samples is not None for s in facts.shards) and sum(s.samples for s in facts.shards) == out.rows:
        counts = [s.samples for s in facts.shards]
    else:
        return None
    ends = np.cumsum([0] + counts).tolist()
    return list(zip(ends[:-1], ends[1:]))


def _size_problems(
    name: str, lengths: dict[int, int], facts: IndexFacts, want_len: int | None, out: TableFacts
) -> list[Problem]:
    problems = []
    if len(lengths) == 1:
        (length,) = lengths
        side = round(((length - NPY_HEADER_BYTES) / 3) ** 0.5) if length > NPY_HEADER_BYTES else 0
        if side and NPY_HEADER_BYTES + 3 * side * side == length:
            out.npy_size = side
    for length, row in sorted(lengths.items(), key=lambda t: t[1])[:3]:
        if want_len is not None and length != want_len:
            problems.append(
                Problem(
                    name,
                    "image_size",
                    f"npy_length is {length:,} (first: row {row:,}); size "
                    f"{facts.size} needs {NPY_HEADER_BYTES} + 3·{facts.size}² = {want_len:,}",
                )
            )
    return problems


def _duplicates(table: SampleColumns, hashes: np.ndarray, facts: IndexFacts) -> list[Problem]:
    """Keys that occur more than once: equal hashes, confirmed by reading those rows' keys."""
    ordered = np.sort(hashes)
    same = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(same):
        return []
    rows = np.flatnonzero(np.isin(hashes, np.unique(same)))[: 50 * MAX_PER_KIND]
    by_key: dict[bytes, list[int]] = {}
    for r in rows.tolist():
        by_key.setdefault(bytes(table.read(["key"], r, r + 1)["key"][0]), []).append(r)
    shard_col = "shard" in table.columns
    problems = []
    dups = [(k, v) for k, v in by_key.items() if len(v) > 1]
    for k, where in dups[:MAX_PER_KIND]:
        key = k.decode("ascii", "replace")
        names = []
        for r in where:
            pos = int(table.read(["shard"], r, r + 1)["shard"][0]) if shard_col else -1
            names.append(facts.shards[pos].name or f"shards[{pos}]" if 0 <= pos < len(facts.shards) else f"row {r}")
        for shard in sorted(set(names)):
            problems.append(
                Problem(
                    shard,
                    "duplicate_key",
                    f"key {key} is in the index {len(where)} times ({', '.join(sorted(set(names)))})",
                    key=key,
                )
            )
    if len(dups) > MAX_PER_KIND:
        problems.append(
            Problem(table.name, "duplicate_key", f"... and {len(dups) - MAX_PER_KIND} more duplicated keys")
        )
    return problems
