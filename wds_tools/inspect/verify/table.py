"""samples.npz, streamed: its columns read by row ranges (``SampleColumns``: positioned or ranged reads) and
checked in one pass (``scan_table``) against their format (``format.index.table_problems``) and index.json,
so verify's memory does not grow with the table (docs/guide/inspect.md, "How verify works").
"""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...format.index import RowCheck, table_problems
from ...format.meta import MetaColumn, npz_names, string_values
from ...format.model import Partial
from ...format.npy import NPY_HEADER_BYTES
from ...format.sample import column_prefix
from ...format.tar import iter_chunks
from ...storage.transport import RangedFile, file_size, is_local, open_ranged, read_ranges, scheme
from .problems import INDEX, MAX_PER_KIND, Problem, duplicate_keys

__all__ = [
    "row_columns",
    "BLOCK_ROWS",
    "SampleColumns",
    "TableFacts",
    "open_columns",
    "file_digest",
    "check_samples_file",
    "metadata_values",
    "block_names",
    "scan_table",
]

BLOCK_ROWS = 1 << 16
"""Rows per block when samples.npz is streamed."""


def row_columns(members: tuple[str, ...]) -> tuple[str, ...]:
    """The columns without which no row can be compared with a shard: key, label, shard and each member's
    offset and length (``members``: a format version's)."""
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
                what = f"{where} is compressed; the format stores entries uncompressed (re-convert, or re-index)"
                self.problems.append(Problem(self.name, "column", what))
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
                what = f"{dtype.str} {list(shape)}{' in Fortran order' if fortran else ''}"
                self.problems.append(
                    Problem(self.name, "column", f"{where}: {what} does not fit its {info.file_size:,} bytes")
                )
                continue
            row_items = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
            self.columns[column] = _Column(dtype, tuple(shape), data + head.tell(), row_items * dtype.itemsize)

    def check_format(self, version: int = 3, metadata: tuple[MetaColumn, ...] = ()) -> tuple[int, set[str]]:
        """(rows, usable columns): each column's dtype and shape against a format version's and its
        metadata columns' (``format.index.table_problems``)."""
        found = {name: (c.dtype, c.shape) for name, c in self.columns.items()}
        rows, usable, problems = table_problems(found, version, metadata)
        self.problems += [Problem(self.name, p.kind, p.message) for p in problems]
        return rows, usable

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


def check_samples_file(url: str, index: Partial, quick: bool) -> list[Problem]:
    """samples.npz's size, and its sha256 unless quick (read in chunks, never whole), against index.json's
    (where its ``samples_file`` is usable)."""
    name, want = index.samples_name or url, index.samples_file
    try:
        size = file_size(url)
        if want is not None and size != want.bytes:
            return [Problem(name, "index", f"{size:,} bytes, index.json says {want.bytes}")]
        digest = None if quick else file_digest(url)
    except FileNotFoundError:
        return []  # open_columns names it
    except OSError as e:
        return [Problem(name, "index", f"cannot read {url}: {e.strerror or e}")]
    if digest is not None and want is not None and digest != want.sha256:
        return [Problem(name, "index", f"sha256 {digest[:16]}..., index.json says {want.sha256[:16]}...")]
    return []


def metadata_values(
    table: SampleColumns, usable: set[str], metadata: tuple[MetaColumn, ...]
) -> tuple[dict[int, list[str]] | None, list[Problem]]:
    """(the values of each string column by position, problems): the values ``format.meta.string_values``
    reads; None where a metadata column is unusable (its dtype or shape is a problem already)."""
    if any(not set(npz_names(i, c.type)) <= usable for i, c in enumerate(metadata)):
        return None, []
    values: dict[int, list[str]] = {}
    problems = []
    for i, c in enumerate(metadata):
        names = npz_names(i, c.type)
        if c.type != "string":
            continue
        offsets, data = (table.read([n], 0, table.columns[n].shape[0])[n] for n in names[1:])
        found, problem = string_values(offsets, data, names[1:], c.name)
        if problem is not None:
            problems.append(Problem(table.name, "column", problem))
        if found is None:
            return None, problems
        values[i] = found
    return values, problems


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
    table: SampleColumns, rows: int, usable: set[str], index: Partial, categories: dict[int, list[str]] | None = None
) -> tuple[TableFacts, list[Problem]]:
    """One pass over samples.npz in blocks: order, ranges, counts, sizes and unique keys; with
    ``categories`` (the metadata's string values; None: its columns are unusable) the metadata
    columns' values, and no group of ``build.group`` in two splits."""
    out = TableFacts(rows, usable)
    problems: list[Problem] = []
    name = table.name

    def bad(message: str, kind: str = "column", key: str | None = None) -> None:
        problems.append(Problem(name, kind, message, key=key))

    n_shards = len(index.shard_names)
    n_classes = len(index.classes) if index.classes is not None else None
    split_names = sorted(index.splits)
    split_of = np.array(
        [split_names.index(s.split) if s is not None and s.split in index.splits else -1 for s in index.shards] + [-1],
        np.int64,
    )
    want_len = NPY_HEADER_BYTES + 3 * index.size**2 if index.size else None
    check = RowCheck(n_classes, n_shards)  # labels and shard positions, as readers check them
    label_counts = np.zeros(max(n_classes or 0, 1), np.int64)
    by_split = np.zeros((len(split_names) + 1, max(n_classes or 0, 1)), np.int64)
    hashes = np.empty(rows, np.uint64) if "key" in usable else None
    lengths: dict[int, int] = {}  # npy_length -> first row
    shard_ok = "shard" in usable and n_shards > 0
    unordered = 0
    first_order = None
    last_shard = -1
    paths_ok = {"path_offsets", "path_data"} <= usable
    path_total = table.columns["path_data"].shape[0] if paths_ok else 0
    last_path = 0
    wanted: list[str] = [c for c in ("shard", "label", "key", "npy_length") if c in usable]
    meta_cols = index.metadata if categories is not None and index.metadata else ()
    wanted += block_names(meta_cols)
    groups = None
    if categories is not None and meta_cols and index.group is not None and shard_ok:
        i = [c.name for c in meta_cols].index(index.group)
        groups = GroupSplits(meta_cols[i], i, split_names, categories.get(i))
    meta_problems: list[Problem] = []
    for start in range(0, rows, BLOCK_ROWS):
        stop = min(rows, start + BLOCK_ROWS)
        block = table.read(wanted, start, stop)
        if categories is not None and meta_cols and len(meta_problems) < MAX_PER_KIND:
            meta_problems += block_problems(name, start, block, meta_cols, categories)
        sh = block["shard"].astype(np.int64) if shard_ok else None
        lab = block["label"].astype(np.int64) if "label" in usable else None
        check.add(start, lab, sh)
        if sh is not None:
            down = np.flatnonzero(np.diff(np.concatenate([[last_shard], sh])) < 0)
            if len(down) and first_order is None:
                first_order = start + int(down[0])
            unordered += len(down)
            last_shard = int(sh[-1])
            if groups is not None:
                groups.add(block, split_of[np.minimum(sh, n_shards)])
        if lab is not None:
            top = n_classes if n_classes is not None else int(lab.max(initial=-1)) + 1
            good = (lab >= 0) & (lab < top)
            if top > len(label_counts):
                label_counts = np.pad(label_counts, (0, top - len(label_counts)))
                by_split = np.pad(by_split, ((0, 0), (0, top - by_split.shape[1])))
            label_counts += np.bincount(lab[good], minlength=len(label_counts))
            if sh is not None:
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
    for p in check.problems():
        bad(p.message, p.kind)
    if unordered:
        bad(
            f"rows are not in shard order ({unordered:,} step(s) back, first at row {first_order:,}); the "
            "format orders rows by shard, then file position"
        )
    if shard_ok:
        out.per_shard = check.per_shard
    if "label" in usable:
        out.labels = label_counts
        if shard_ok:
            out.labels_by_split = {s: by_split[i + 1] for i, s in enumerate(split_names)}
    out.ranges = _ranges(out, index, shard_ok and not check.bad_shards and not unordered)
    problems += meta_problems
    if groups is not None:
        problems += groups.problems()
    problems += _size_problems(name, lengths, index, want_len, out)
    if hashes is not None:
        problems += _duplicates(table, hashes, index)
    return out, problems


def _ranges(out: TableFacts, index: Partial, ordered: bool) -> list[tuple[int, int]] | None:
    """Each shard position's rows: from the shard column when it is in order, else from index.json's
    counts when they add up to the rows."""
    listed = [s.samples for s in index.shards if s is not None]
    if ordered and out.per_shard is not None:
        counts = out.per_shard.tolist()
    elif len(listed) == len(index.shards) and sum(listed) == out.rows:
        counts = listed
    else:
        return None
    ends = np.cumsum([0] + counts).tolist()
    return list(zip(ends[:-1], ends[1:]))


def _size_problems(
    name: str, lengths: dict[int, int], index: Partial, want_len: int | None, out: TableFacts
) -> list[Problem]:
    problems = []
    if len(lengths) == 1:
        (length,) = lengths
        side = round(((length - NPY_HEADER_BYTES) / 3) ** 0.5) if length > NPY_HEADER_BYTES else 0
        if side and NPY_HEADER_BYTES + 3 * side * side == length:
            out.npy_size = side
    for length, row in sorted(lengths.items(), key=lambda t: t[1])[:3]:
        if want_len is not None and length != want_len:
            needs = f"size {index.size} needs {NPY_HEADER_BYTES} + 3·{index.size}² = {want_len:,}"
            problems.append(Problem(name, "image_size", f"npy_length is {length:,} (first: row {row:,}); {needs}"))
    return problems


def _duplicates(table: SampleColumns, hashes: np.ndarray, index: Partial) -> list[Problem]:
    """Keys that occur more than once: equal hashes, confirmed by reading those rows' keys."""
    ordered = np.sort(hashes)
    same = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(same):
        return []
    rows = np.flatnonzero(np.isin(hashes, np.unique(same)))[: 50 * MAX_PER_KIND]
    by_key: dict[bytes, list[int]] = {}
    for r in rows.tolist():
        by_key.setdefault(bytes(table.read(["key"], r, r + 1)["key"][0]), []).append(r)
    shard_col, listed = "shard" in table.columns, index.shard_names

    def where(r: int) -> str:
        pos = int(table.read(["shard"], r, r + 1)["shard"][0]) if shard_col else -1
        return listed[pos] or f"shards[{pos}]" if 0 <= pos < len(listed) else f"row {r}"

    dups = [(k, v) for k, v in by_key.items() if len(v) > 1]
    found = [(k.decode("ascii", "replace"), [where(r) for r in rows]) for k, rows in dups[:MAX_PER_KIND]]
    return duplicate_keys(found, len(dups), "is in the index {n} times", table.name)


# ------------------------------------------------------------------ the metadata columns, block by block


def block_problems(
    name: str, start: int, block: dict[str, np.ndarray], columns: Sequence[MetaColumn], categories: dict[int, list[str]]
) -> list[Problem]:
    """Rows ``start...`` of the metadata columns: string codes in -1..V-1, int values 0 where missing."""
    problems = []
    for i, c in enumerate(columns):
        names = npz_names(i, c.type)
        if c.type == "string":
            codes = block[names[0]].astype(np.int64)
            bad = np.flatnonzero((codes < -1) | (codes >= len(categories[i])))
            if len(bad):
                what = f"is {int(codes[bad[0]])}, not -1 (missing) or a value 0..{len(categories[i]) - 1}"
                problems.append(
                    Problem(name, "column", f"row {start + int(bad[0]):,}: {names[0]} (metadata {c.name!r}) {what}")
                )
        elif c.type == "int":
            bad = np.flatnonzero(block[names[1]] & (block[names[0]] != 0))
            if len(bad):
                what = f"is missing but {names[0]} holds {int(block[names[0]][bad[0]])}, not 0"
                problems.append(Problem(name, "column", f"row {start + int(bad[0]):,}: metadata {c.name!r} {what}"))
    return problems


def block_names(columns: Sequence[MetaColumn]) -> list[str]:
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
            what = f"group {value} of column {self.column.name!r} (build.group) is in {per_group[g]} splits: {where}"
            problems.append(Problem(INDEX, "group_split", what))
        if len(several) > MAX_PER_KIND:
            problems.append(
                Problem(INDEX, "group_split", f"... and {len(several) - MAX_PER_KIND} more groups in several splits")
            )
        return problems

    def _show(self, value: Any) -> str:
        if self.categories is not None:
            return repr(self.categories[int(value)])
        return repr(int(value) if self.column.type == "int" else float(value))


def _pairs(groups: np.ndarray, splits: np.ndarray) -> np.ndarray:
    out = np.empty(len(groups), dtype=[("g", groups.dtype), ("s", np.int64)])
    out["g"], out["s"] = groups, splits
    return out
