"""The sidecar index: ``index.json`` (dataset level) and ``samples.npz`` (one row per sample).

The bytes are specified in docs/FORMAT.md; change the two together.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from ..storage.fsutil import atomic_write_bytes, dumps_canonical
from ..storage.transport import join, local_path, parent, read_bytes
from .meta import MetaColumn, MetaValues, column_names, npz_dtypes, read_metadata
from .model import FORMAT_NAME, READABLE_VERSIONS, IndexMeta, Problem, load_json, parse
from .names import ERRORS_FILE, INDEX_FILE, SAMPLES_FILE
from .packed import unpack_strings
from .phash import WINDOWS
from .sidecars import sidecar_files

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "INDEX_FILE",
    "SAMPLES_FILE",
    "ERRORS_FILE",
    "WORK_DIR",
    "LOCK_FILE",
    "SAMPLE_COLUMNS",
    "SAMPLE_COLUMNS_V1",
    "SAMPLE_COLUMNS_V2",
    "sample_columns",
    "table_problems",
    "DatasetIndex",
    "SampleTable",
    "read_sample_table",
    "RowCheck",
    "load_index",
    "read_index",
    "open_index",
    "read_samples_checked",
    "indexes_newest_first",
    "histogram_mean_std",
    "write_index",
    "write_npz",
    "read_npz",
]

FORMAT_VERSION = 3
"""The index format version the converter writes; 3 added the phash column (docs/FORMAT.md)."""
WORK_DIR = ".wds-tools-work"
"""The work folder of a conversion in progress or interrupted (readers refuse a folder holding it without an index)."""
LOCK_FILE = ".wds-tools-lock"
"""The lock file of a conversion in progress (readers refuse a folder holding it without an index)."""

# "key" is |S<n> (n = longest key); the paths are packed (format.packed). No source mtime: the quick check's
# mtimes are kept outside the format (convert/sourcecache.py), so a corpus moved elsewhere gives the same bytes.
SAMPLE_COLUMNS: dict[str, str] = {
    "key": "S",
    "label": "<i4",
    "shard": "<u4",
    "fingerprint": "u1",  # [N, 16]: xxh3-128 of the source file's bytes, big-endian digest
    "width": "<u4",
    "height": "<u4",
    "src_size": "<u8",
    "cls_offset": "<u8",
    "cls_length": "<u8",
    "i32_offset": "<u8",
    "i32_length": "<u8",
    "json_offset": "<u8",
    "json_length": "<u8",
    "npy_offset": "<u8",
    "npy_length": "<u8",
    "npy_xxh3": "<u8",  # xxh3-64 of the .npy member's bytes (header + array)
    "phash": "<u8",  # [N, 7]: the perceptual hashes of the stored pixels (format.phash; format version 3)
    "path_offsets": "<u8",
    "path_data": "u1",
}
"""samples.npz's columns (format version 3): name -> dtype, in stored order."""
SAMPLE_COLUMNS_V2: dict[str, str] = {k: v for k, v in SAMPLE_COLUMNS.items() if k != "phash"}
"""samples.npz's columns in format version 2: no phash (still read everywhere)."""
SAMPLE_COLUMNS_V1: dict[str, str] = {
    **{
        k: v
        for k, v in SAMPLE_COLUMNS.items()
        if k in ("key", "label", "shard", "fingerprint", "width", "height", "src_size")
    },
    "src_mtime_ns": "<i8",
    **{k: v for k, v in SAMPLE_COLUMNS.items() if k.startswith(("cls_o", "cls_l", "json_", "npy_", "path_"))},
}
"""samples.npz's columns in format version 1: src_mtime_ns after src_size, no i32 columns (still read everywhere)."""


def sample_columns(version: int = FORMAT_VERSION) -> dict[str, str]:
    """The samples.npz columns (name -> dtype, stored order) of a format version."""
    return SAMPLE_COLUMNS_V1 if version == 1 else SAMPLE_COLUMNS_V2 if version == 2 else SAMPLE_COLUMNS


def table_problems(
    found: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
    version: int,
    metadata: Sequence[MetaColumn] = (),
    *,
    rows: int | None = None,
) -> tuple[int, set[str], list[Problem]]:
    """(rows, the columns as the format has them, a problem for each other column): samples.npz's columns,
    found with these (dtype, shape), against a format version's and its metadata columns'. ``rows`` given (a
    reader's selection): only the columns found are checked, each column of rows having that many."""
    wanted: list[tuple[str, str, MetaColumn | None]] = [(k, d, None) for k, d in sample_columns(version).items()]
    wanted += [(a, d, c) for i, c in enumerate(metadata) for a, d in npz_dtypes(i, c.type).items()]
    if rows is None:
        key = found.get("key")
        rows = key[1][0] if key is not None and len(key[1]) == 1 else None
    else:
        wanted = [w for w in wanted if w[0] in found]
    n = rows or 0
    usable: set[str] = set()
    problems = []
    for name, want, column in wanted:
        of = f" (metadata {column.name!r})" if column is not None else ""
        if name not in found:
            of = f" (metadata column {column.name!r}, {column.type})" if column is not None else ""
            problems.append(Problem(name, "column", f"samples.npz has no column {name!r}{of}"))
            continue
        dtype, shape = found[name]
        # a table without a key column has no row count: a column of rows is then not usable
        expected = _table_shape(name, shape, n if rows is not None or column is not None else None)
        if (dtype.kind == "S" if want == "S" else dtype == np.dtype(want)) and shape == expected:
            usable.add(name)
            continue
        told = f"{'|S<n>' if want == 'S' else np.dtype(want).str} {list(expected) if expected else '[N]'}"
        problems.append(Problem(name, "column", f"column {name!r}{of} is {dtype.str} {list(shape)}; expected {told}"))
    return n, usable, problems


def _table_shape(name: str, shape: tuple[int, ...], rows: int | None) -> tuple[int, ...] | None:
    """The shape samples.npz's column ``name`` must have (None: none fits) when it is ``shape``."""
    if name.endswith("_data"):  # path_data, and a string metadata column's values: their own length
        return shape if len(shape) == 1 else None
    if name.startswith("meta") and name.endswith("_offsets"):  # its K values' K + 1 offsets
        return shape if len(shape) == 1 and shape[0] >= 1 else None
    if rows is None:
        return None
    return {"fingerprint": (rows, 16), "phash": (rows, WINDOWS), "path_offsets": (rows + 1,)}.get(name, (rows,))


_FIXED_DATE = (1980, 1, 1, 0, 0, 0)


def write_npz(columns: dict[str, np.ndarray]) -> bytes:
    """An uncompressed .npz with fixed timestamps, so equal arrays give equal bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in columns.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_FIXED_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            info.create_system = 3  # "made by" Unix on every OS (zipfile writes 0 on Windows)
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def read_npz(
    path: str | os.PathLike, names: Iterable[str] | None = None, *, data: bytes | None = None
) -> dict[str, np.ndarray]:
    """Every column of a .npz, or only ``names`` (the others are not read); from ``data`` when the
    caller already holds the file's bytes (``path`` then only names it in errors)."""
    try:
        with np.load(io.BytesIO(data) if data is not None else path, allow_pickle=False) as z:
            if names is None:
                return {name: z[name] for name in z.files}
            names = tuple(names)
            missing = [n for n in names if n not in z.files]
            if missing:
                raise IndexFormatError(f"sample table {path} has no column {missing[0]!r}")
            return {name: z[name] for name in names}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise IndexFormatError(f"cannot read sample table {path}: {e}") from None


@dataclass
class SampleTable:
    """samples.npz's columns (all, or those read), as numpy arrays (``SAMPLE_COLUMNS``); ``read_sample_table`` reads
    them checked. The columns every reader indexes by are typed here once."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    @cached_property
    def label(self) -> np.ndarray:
        """Each row's label (an index into ``classes``), int64."""
        return self.columns["label"].astype(np.int64)

    @cached_property
    def shard(self) -> np.ndarray:
        """Each row's shard: its position in index.json's ``shards``, int64."""
        return self.columns["shard"].astype(np.int64)

    @cached_property
    def npy_offset(self) -> np.ndarray:
        """Each row's ``.npy`` member: the file offset of its NPY header in its shard, int64."""
        return self.columns["npy_offset"].astype(np.int64)

    def key(self, i: int) -> str:
        """Row i's key."""
        return self.columns["key"][i].decode("ascii")

    @cached_property
    def keys(self) -> list[str]:
        """Every sample's key, in row order."""
        return self.columns["key"].astype("U").tolist()

    @cached_property
    def key_positions(self) -> dict[str, int]:
        """Key -> its row."""
        return {k: i for i, k in enumerate(self.keys)}

    def source_path(self, i: int) -> str:
        """Row i's source file, as the converter read it."""
        return unpack_strings(self.columns["path_offsets"][i : i + 2], self.columns["path_data"])[0]

    def fingerprint_hex(self, i: int) -> str:
        """Row i's source fingerprint (xxh3-128) as hex."""
        return self.columns["fingerprint"][i].tobytes().hex()


@dataclass
class DatasetIndex:
    """A loaded index: ``info`` is index.json; ``samples`` loads samples.npz on first use."""

    root: Path
    info: IndexMeta
    _samples: SampleTable | None = field(default=None, repr=False)

    @property
    def meta(self) -> dict:
        """index.json as written (``info.raw``), for the callers that read it as a dict."""
        return self.info.raw

    @property
    def samples(self) -> SampleTable:
        """samples.npz, read checked (``read_sample_table``) on first use."""
        if self._samples is None:
            self._samples = read_sample_table(str(self.root), self.info)
        return self._samples

    @property
    def metadata(self) -> dict[str, MetaValues]:
        """The per-sample metadata columns by name (format version 2; {} when there are none)."""
        return read_metadata(self.samples.columns, self.info.metadata)

    @property
    def shards(self) -> list[dict]:
        """index.json's ``shards`` entries."""
        return self.meta["shards"]

    @property
    def splits(self) -> dict[str, dict]:
        """index.json's ``splits``, by name."""
        return self.meta["splits"]

    @property
    def classes(self) -> list[str]:
        """The class names; a label is an index into them."""
        return list(self.info.classes)

    def url_pattern(self, split: str) -> str:
        """Absolute WebDataset URL pattern of a split, e.g. /data/shards/v1/224/train-{000000..000041}.tar."""
        splits = self.info.splits
        if split not in splits:
            raise IndexFormatError(f"{self.root}: no split {split!r}; the index has {', '.join(splits) or 'none'}")
        return str(self.root / splits[split].urls)


def load_index(path: str | os.PathLike) -> DatasetIndex:
    """Load an index from a local shards folder or its index.json.

    Args:
        path: A converted folder (``shards/v1/224``) or the path of its ``index.json``.

    Returns:
        A ``DatasetIndex``: ``info`` is index.json (classes, splits, shards, mean/std, build); its
        ``samples`` (samples.npz, checked against it) are read on first use.

    Raises:
        IndexFormatError: No index.json there, or one that cannot be read, is of a format version
            this code does not read, or has a problem (``format.model.validate``: the first is named).
    """
    p = Path(path)
    index_path = str(p / INDEX_FILE if p.is_dir() else p)
    return DatasetIndex(Path(index_path).parent, parse(read_index(index_path, required=True), index_path))


def read_index(url: str, *, required: bool = False) -> dict:
    """index.json at ``url`` as written, checked only to be a wds-tools index of a version this code reads
    (``format.model.load_json``; ``parse`` checks the rest).

    A missing file raises ``FileNotFoundError``, or ``IndexFormatError`` when ``required``.
    """
    try:
        data = read_bytes(url)
    except FileNotFoundError:
        if required:
            raise IndexFormatError(
                f"no index at {url}; convert first, or point at a folder holding {INDEX_FILE}"
            ) from None
        raise
    except OSError as e:
        raise IndexFormatError(f"cannot read index {url}: {e}") from None
    return load_json(data, url)


def open_index(spec: str | os.PathLike) -> tuple[str, IndexMeta]:
    """(folder, index.json) of a shards folder or its index.json, local or a URL."""
    text = os.fspath(spec)
    url = text if text.endswith(".json") and not os.path.isdir(text) else join(text, INDEX_FILE)
    return parent(url), parse(read_index(url, required=True), url)


def read_samples_checked(base: str, info: IndexMeta, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Columns (``names``, or all) of the samples.npz beside index.json at ``base`` (``info``), after checking the file's
    size and sha256 against its ``samples_file``: another version's table of the same size is refused
    (``IndexFormatError``), not read as this index's."""
    where = join(base, INDEX_FILE)
    url = join(base, info.samples_file.name)
    want_bytes, want_sha = info.samples_file.bytes, info.samples_file.sha256
    local = local_path(url)
    data = None
    try:
        if local is not None:
            with open(local, "rb") as f:
                got_bytes, digest = os.fstat(f.fileno()).st_size, hashlib.file_digest(f, "sha256").hexdigest()
        else:
            data = read_bytes(url)
            got_bytes, digest = len(data), hashlib.sha256(data).hexdigest()
    except FileNotFoundError:
        raise IndexFormatError(
            f"{url} is missing; {where} names it (copy the whole folder, or convert again)"
        ) from None
    except OSError as e:
        raise IndexFormatError(f"cannot read sample table {url}: {e}") from None
    fix = "it is not the table this index was written with (copy the folder again, or convert again)"
    if got_bytes != want_bytes:
        raise IndexFormatError(f"{url} is {got_bytes:,} bytes; {where} says {want_bytes:,}: {fix}")
    if digest != want_sha:
        raise IndexFormatError(f"{url}: sha256 {digest[:16]}..., {where} says {want_sha[:16]}...: {fix}")
    return read_npz(local or url, names, data=data)


def read_sample_table(base: str, info: IndexMeta, names: Sequence[str] | None = None) -> SampleTable:
    """The columns ``names`` (None: all) of the samples.npz beside index.json at ``base``, checked: its size
    and sha256 against ``samples_file`` (``read_samples_checked``), the columns against the format
    (``table_problems``) and index.json (``RowCheck``, and each shard as many rows as its ``samples``); the
    first problem raises ``IndexFormatError``."""
    cols = read_samples_checked(base, info, names)
    found = {n: (a.dtype, a.shape) for n, a in cols.items()}
    _, _, problems = table_problems(found, info.format_version, info.metadata, rows=info.samples)
    if not problems:  # the columns as the format has them: their rows against index.json
        check = RowCheck(len(info.classes), len(info.shards))
        check.add(0, cols.get("label"), cols.get("shard"))
        problems = check.problems()
        rows = check.per_shard.tolist()
        if "shard" in cols and not problems:  # every count a reader prints is one the table holds
            problems = [
                Problem(
                    s.name,
                    "count",
                    f"shards[{s.pos}] ({s.name}) says {s.samples!r} samples, samples.npz has "
                    f"{rows[s.pos]:,} rows of it",
                )
                for s in info.shards
                if s.samples != rows[s.pos]
            ]
    for p in problems[:1]:
        raise IndexFormatError(
            f"{join(base, info.samples_file.name)}: {p.message}; the index is damaged or was edited "
            "(run wds-tools verify, or convert again)"
        )
    return SampleTable(cols)


@dataclass
class RowCheck:
    """samples.npz's ``label`` and ``shard`` columns against index.json, fed in row blocks (a reader feeds
    the columns it read at once, verify streams the table): every label a class index (``n_classes`` None:
    classes unknown, only negative labels are out), every shard position one of index.json's ``n_shards``;
    ``per_shard`` counts the rows of each listed shard."""

    n_classes: int | None
    n_shards: int
    bad_labels: int = 0
    first_label: tuple[int, int] | None = None  # (row, label)
    bad_shards: int = 0
    first_shard: int | None = None

    def __post_init__(self) -> None:
        self.per_shard = np.zeros(self.n_shards, np.int64)

    def add(self, start: int, label: np.ndarray | None, shard: np.ndarray | None) -> None:
        """Rows ``start...`` of the columns (None: not read)."""
        if label is not None:
            lab = label.astype(np.int64)
            top = self.n_classes if self.n_classes is not None else np.iinfo(np.int64).max
            bad = np.flatnonzero((lab < 0) | (lab >= top))
            if len(bad) and self.first_label is None:
                self.first_label = (start + int(bad[0]), int(lab[bad[0]]))
            self.bad_labels += len(bad)
        if shard is not None:
            sh = shard.astype(np.int64)
            inside = (sh >= 0) & (sh < self.n_shards)
            if not inside.all() and self.first_shard is None:
                self.first_shard = start + int(np.argmin(inside))
            self.bad_shards += int(len(sh) - inside.sum())
            self.per_shard += np.bincount(sh[inside], minlength=self.n_shards)

    def problems(self) -> list[Problem]:
        """What was found wrong so far (each named by its column)."""
        out = []
        if self.first_shard is not None:
            message = (
                f"{self.bad_shards:,} row(s) name a shard position past the {self.n_shards} in index.json "
                f"(first: row {self.first_shard:,})"
            )
            out.append(Problem("shard", "column", message))
        if self.first_label is not None:
            row, value = self.first_label
            top = f" 0..{self.n_classes - 1}" if self.n_classes is not None else ""
            message = f"{self.bad_labels:,} label(s) are not a class index{top} (first: row {row:,}, {value})"
            out.append(Problem("label", "label", message))
        return out


def indexes_newest_first(out: str | os.PathLike, size: int | str = "*") -> list[Path]:
    """The folders ``OUT/<version>/<size>/`` that hold an index.json, the most recently written first."""
    found = [(p.stat().st_mtime_ns, str(p.parent), p.parent) for p in Path(out).glob(f"*/{size}/{INDEX_FILE}")]
    return [folder for _, _, folder in sorted(found, reverse=True)]


def histogram_mean_std(hist: np.ndarray, empty: tuple[Any, Any] = (None, None)) -> tuple[Any, Any]:
    """Per-channel mean and std in [0, 1] units (index.json's ``mean``/``std``) from a [3, 256] pixel
    value histogram; ``empty`` when a channel has no pixels."""
    hist = hist.reshape(3, 256).astype(np.float64)
    n = hist.sum(axis=1)
    if not n.all():
        return empty
    v = np.arange(256, dtype=np.float64)
    mean = (hist @ v) / n
    var = (hist @ (v * v)) / n - mean * mean
    std = np.sqrt(np.maximum(var, 0.0))
    return [round(float(x) / 255, 6) for x in mean], [round(float(x) / 255, 6) for x in std]


def write_index(
    dest: str | os.PathLike,
    meta: dict,
    columns: dict[str, np.ndarray],
    *,
    write_bytes: Callable[[str, bytes], None] = atomic_write_bytes,
    sidecars: bool = True,
) -> dict:
    """Write samples.npz and the readers' sidecar files (``format.sidecars``), then index.json
    (last, so an index always names complete files). An index with a problem (``format.model.validate``)
    is a bug here: ``IndexFormatError``, and nothing is written.

    ``dest`` may be an fsspec URL when ``write_bytes`` can write there (``storage.Store``).
    """
    names = [*sample_columns(meta["format_version"]), *column_names(meta)]  # then the metadata's, in their order
    missing = set(names) - set(columns)
    if missing:
        raise ValueError(f"sample columns missing: {sorted(missing)}")
    data = write_npz({name: columns[name] for name in names})
    meta = {
        **meta,
        "samples_file": {"name": SAMPLES_FILE, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
    }
    info = parse(meta, join(dest, INDEX_FILE))
    write_bytes(join(dest, SAMPLES_FILE), data)
    for name, side in sidecar_files(info, columns).items() if sidecars else ():
        write_bytes(join(dest, name), side)
    write_bytes(join(dest, INDEX_FILE), (dumps_canonical(meta) + "\n").encode())
    return meta
