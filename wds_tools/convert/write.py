"""Worker side of a conversion: check sources, and write one shard by decoding or copying."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
import xxhash

from .decode import DecodeError, DecodeSettings, decode_image, probe_image
from ..format.fsutil import dumps_canonical
from ..format.index import SAMPLE_COLUMNS, pack_strings, write_npz
from .runner import orphaned, report_progress
from .storage import Store, is_remote, join, open_input
from ..format.tarwrite import ShardWriter, npy_header

__all__ = ["Reuse", "SampleTask", "ShardTask", "scan_files", "fingerprint_files", "write_shard",
           "sample_json"]

_HASH_CHUNK = 4 << 20


@dataclass(frozen=True)
class Reuse:
    """Where a sample's pixels already sit in a base version's shard, and how to check them."""

    shard_path: str
    shard_bytes: int
    npy_offset: int
    npy_length: int
    npy_xxh3: int
    width: int
    height: int
    fingerprint: bytes
    relabeled: bool


@dataclass(frozen=True)
class SampleTask:
    key: str
    path: str
    source_path: str
    label: int
    label_name: str
    line: int
    original_key: str | None
    reuse: Reuse | None = None
    src_size: int = 0  # from the scan; used when the pixels are copied, not read
    src_mtime_ns: int = 0


@dataclass(frozen=True)
class ShardTask:
    dest: str
    work: str
    name: str
    split: str
    digest: str
    size: int
    resize: str
    settings: DecodeSettings
    samples: tuple[SampleTask, ...]


def _os_reason(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "missing file"
    if isinstance(e, PermissionError):
        return "unreadable file: permission denied"
    if isinstance(e, IsADirectoryError):
        return "is a directory, not a file"
    return f"unreadable file: {e.strerror or e}"


def _open_source(path: str):
    """(binary file, size, mtime_ns) of a local file or an fsspec URL (mtime 0 for URLs)."""
    if is_remote(path):
        f = open_input(path)
        return f, int(f.size), 0
    f = open(path, "rb", buffering=0)
    st = os.fstat(f.fileno())
    return f, st.st_size, st.st_mtime_ns


def scan_files(paths: list[str], settings: DecodeSettings) -> list[str | None]:
    """For each file: None when it has a readable image header, else the reason it is unusable."""
    out: list[str | None] = []
    for path in paths:
        try:
            f, size, _ = _open_source(path)
            with io.BufferedReader(f, 1 << 16) if not is_remote(path) else f:
                if size == 0:
                    raise DecodeError("empty file")
                probe_image(f, settings)  # reads only as far as the header
            out.append(None)
        except OSError as e:
            out.append(_os_reason(e))
        except DecodeError as e:
            out.append(str(e))
    return out


def fingerprint_files(items: list[tuple[str, int | None, int | None]], settings: DecodeSettings
                      ) -> list[tuple[str | None, bytes | None, int, int]]:
    """For each (path, trusted size, trusted mtime_ns): (error, xxh3-128 digest, size, mtime_ns).

    The file is read in large chunks and hashed; its header is checked from the same bytes.
    When size and mtime equal the trusted ones (--trust-mtime), the file is not read and the
    digest is None: the caller takes the base's.
    """
    out = []
    buf = bytearray(_HASH_CHUNK)  # reused: a fresh multi-MB bytes per file costs page faults
    view = memoryview(buf)
    for path, size, mtime in items:
        try:
            raw, st_size, st_mtime = _open_source(path)
            with raw:
                if size is not None and st_size == size and st_mtime == mtime:
                    out.append((None, None, st_size, st_mtime))
                    continue
                if st_size == 0:
                    raise DecodeError("empty file")
                h = xxhash.xxh3_128()
                while n := raw.readinto(buf):
                    h.update(view[:n])
                raw.seek(0)
                probe_image(io.BufferedReader(raw, 1 << 16) if not is_remote(path) else raw, settings)
            out.append((None, h.digest(), st_size, st_mtime))
        except OSError as e:
            out.append((_os_reason(e), None, 0, 0))
        except DecodeError as e:
            out.append((str(e), None, 0, 0))
    return out


def sample_json(s: SampleTask, width: int, height: int, fingerprint: str) -> bytes:
    meta = {"key": s.key, "label": s.label_name, "source_path": s.source_path,
            "width": width, "height": height, "fingerprint": f"xxh3_128:{fingerprint}"}
    if s.original_key is not None:
        meta["original_key"] = s.original_key
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class _BaseShards:
    """Open base shards on demand; a shard whose size differs from its index entry is refused."""

    def __init__(self) -> None:
        self.fds: dict[str, int | str] = {}

    def read(self, r: Reuse, header: bytes) -> bytes | str:
        fd = self.fds.get(r.shard_path)
        if fd is None:
            try:
                fd = os.open(r.shard_path, os.O_RDONLY)
                size = os.fstat(fd).st_size
                if size != r.shard_bytes:
                    os.close(fd)
                    fd = f"base shard is {size} bytes, its index says {r.shard_bytes}"
            except OSError as e:
                fd = f"base shard unreadable: {e.strerror or e}"
            self.fds[r.shard_path] = fd
        if isinstance(fd, str):
            return fd
        data = os.pread(fd, r.npy_length, r.npy_offset)
        if len(data) != r.npy_length or data[:len(header)] != header:
            return "stored .npy does not match the index (size or header)"
        if xxhash.xxh3_64_intdigest(data) != r.npy_xxh3:
            return "stored .npy fails its checksum"
        return data

    def close(self) -> None:
        for fd in self.fds.values():
            if isinstance(fd, int):
                os.close(fd)


def write_shard(task: ShardTask) -> dict:
    """Write one shard: copy checked pixels from a base shard, or decode the source.

    Writes the tar, then its sample columns, then its meta (the resume marker), and returns the meta.
    """
    header = npy_header((task.size, task.size, 3))
    npy_len = len(header) + task.size * task.size * 3
    rows: list[tuple] = []
    failed: list[dict] = []
    problems: list[dict] = []
    counts = {"decoded": 0, "reused": 0, "relabeled": 0}
    hist = np.zeros(768, dtype=np.int64)
    channel = np.tile(np.array([0, 256, 512], dtype=np.uint16), task.size * task.size)
    base = _BaseShards()
    store = Store(task.dest)
    final = store.join(task.name)
    staging = tempfile.mkdtemp(prefix="wds-tools-") if store.remote else None
    pending = 0
    try:
        with ShardWriter(os.path.join(staging, task.name) if staging else final) as w:
            for s in task.samples:
                if orphaned():
                    raise SystemExit(1)
                got = None
                if s.reuse is not None and s.reuse.npy_length == npy_len:
                    got = base.read(s.reuse, header)
                    if isinstance(got, str):
                        problems.append({"key": s.key, "base_shard": os.path.basename(s.reuse.shard_path),
                                         "error": got})
                        got = None
                if got is not None:
                    r = s.reuse
                    npy, fp, width, height = got, r.fingerprint, r.width, r.height
                    flat = np.frombuffer(npy, dtype=np.uint8, offset=len(header))
                    src_size, mtime, npy_x = s.src_size, s.src_mtime_ns, r.npy_xxh3
                    counts["relabeled" if r.relabeled else "reused"] += 1
                else:
                    try:
                        f, src_size, mtime = _open_source(s.path)
                        with f:
                            data = f.read()
                        dec = decode_image(data, task.size, task.resize, task.settings)
                    except (OSError, DecodeError) as e:
                        reason = str(e) if isinstance(e, DecodeError) else _os_reason(e)
                        failed.append({"key": s.key, "path": s.source_path, "line": s.line,
                                       "stage": "decode", "error": reason})
                        npy = None
                    else:
                        fp, width, height = xxhash.xxh3_128_digest(data), dec.width, dec.height
                        flat = dec.pixels.reshape(-1)
                        npy = (header, flat.data)
                        h = xxhash.xxh3_64(header)
                        h.update(flat)
                        npy_x = h.intdigest()
                        counts["decoded"] += 1
                if npy is not None:
                    hist += np.bincount(flat + channel, minlength=768)
                    cls_off, cls_len = w.add(f"{s.key}.cls", str(s.label).encode())
                    json_off, json_len = w.add(f"{s.key}.json", sample_json(s, width, height, fp.hex()))
                    parts = npy if isinstance(npy, tuple) else (npy,)
                    npy_off, npy_n = w.add(f"{s.key}.npy", *parts)
                    rows.append((s.key, s.label, fp, width, height, src_size, mtime, cls_off, cls_len,
                                 json_off, json_len, npy_off, npy_n, npy_x, s.source_path))
                pending += 1
                if pending >= 8:
                    report_progress(pending)
                    pending = 0
            nbytes, sha = w.close()
        if staging:  # object storage: the shard appears whole, or not at all
            store.upload(os.path.join(staging, task.name), final)
    finally:
        base.close()
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
    if pending:
        report_progress(pending)
    store.write_bytes(join(task.work, task.name + ".npz"), write_npz(_rows_to_columns(rows)))
    meta = {"name": task.name, "split": task.split, "digest": task.digest, "bytes": nbytes,
            "sha256": sha, "samples": len(rows), "failed": failed, "histogram": hist.tolist(),
            "counts": counts, "reuse_problems": problems}
    store.write_bytes(join(task.work, task.name + ".json"), (dumps_canonical(meta) + "\n").encode())
    return meta


def _rows_to_columns(rows: list[tuple]) -> dict[str, np.ndarray]:
    names = ["key", "label", "fingerprint", "width", "height", "src_size", "src_mtime_ns",
             "cls_offset", "cls_length", "json_offset", "json_length", "npy_offset", "npy_length",
             "npy_xxh3"]
    cols: dict[str, np.ndarray] = {}
    for j, name in enumerate(names):
        values = [r[j] for r in rows]
        if name == "key":
            cols[name] = np.array([v.encode() for v in values], dtype="S") if values else np.zeros(0, "S1")
        elif name == "fingerprint":
            cols[name] = np.frombuffer(b"".join(values), dtype="u1").reshape(len(values), 16)
        else:
            cols[name] = np.array(values, dtype=SAMPLE_COLUMNS[name])
    cols["shard"] = np.zeros(len(rows), dtype="<u4")
    cols["path_offsets"], cols["path_data"] = pack_strings([r[14] for r in rows])
    return cols
