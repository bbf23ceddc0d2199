"""What a later version needs to skip reading unchanged sources, kept outside the format.

``OUT/.wds-tools-cache/<version>/``: ``source-stats.npz`` (path, size, mtime and fingerprint of each local
source written: the quick check) and ``source-hashes.npz`` (manifest sha256/md5 -> fingerprint pairs).
Losing either costs speed, never correctness (docs/guide/converter-internals.md, "Unchanged sources").
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..format.index import read_npz, write_npz
from ..format.packed import pack_strings, unpack_strings
from ..signals import reraise_interruption
from ..storage.fsutil import atomic_write_bytes

__all__ = ["CACHE_DIR", "cache_file", "load_pairs", "save_pairs", "stats_file", "load_stats", "save_stats"]

CACHE_DIR = ".wds-tools-cache"
"""The folder under ``out`` that caches each version's source fingerprints."""


def cache_file(out: str | os.PathLike, version: str) -> Path:
    """The file of a version's (manifest hash, fingerprint) pairs, beside the versions under ``out``."""
    return Path(out) / CACHE_DIR / version / "source-hashes.npz"


def stats_file(out: str | os.PathLike, version: str) -> Path:
    """The file of a version's quick-check stats (path, size, mtime, fingerprint), beside the versions."""
    return Path(out) / CACHE_DIR / version / "source-stats.npz"


def _load(path: Path, entries: Callable[[dict[str, np.ndarray]], dict]) -> dict:
    """``entries`` of the file's columns; {} when there is no readable file (a damaged cache is no cache)."""
    if not path.is_file():
        return {}
    try:
        return entries(read_npz(path))
    except Exception as e:
        reraise_interruption(e)
        return {}


def _add(path: Path, entries: dict, load: Callable[[], dict], columns: Callable[[dict], dict]) -> None:
    """Add ``entries`` to the file: a read-merge-write under a lock of its folder, since the sizes of a
    version share the file and two of them may finish at once (neither may drop the other's entries)."""
    if not entries:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        atomic_write_bytes(path, write_npz(columns({**load(), **entries})))
    finally:
        os.close(fd)


def _fingerprints(values: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(values), dtype="u1").reshape(-1, 16)


def _pairs(cols: dict[str, np.ndarray]) -> dict[str, bytes]:
    hashes, fps = cols["hash"], cols["fingerprint"]
    if fps.ndim != 2 or fps.shape != (len(hashes), 16):
        return {}
    return {h.decode(): fps[i].tobytes() for i, h in enumerate(hashes)}


def load_pairs(out: str | os.PathLike, version: str) -> dict[str, bytes]:
    """{"algo:hex": fingerprint} recorded for ``version``."""
    return _load(cache_file(out, version), _pairs)


def save_pairs(out: str | os.PathLike, version: str, pairs: dict[str, bytes]) -> None:
    """Add ``pairs`` to ``version``'s file."""

    def columns(merged: dict[str, bytes]) -> dict:
        names = sorted(merged)
        return {
            "hash": np.array([n.encode() for n in names], dtype="S"),
            "fingerprint": _fingerprints([merged[n] for n in names]),
        }

    _add(cache_file(out, version), pairs, lambda: load_pairs(out, version), columns)


def _stats(cols: dict[str, np.ndarray]) -> dict[str, tuple[int, int, bytes]]:
    offsets, size, mtime, fps = cols["path_offsets"], cols["size"], cols["mtime_ns"], cols["fingerprint"]
    n = len(size)
    if len(offsets) != n + 1 or len(mtime) != n or fps.shape != (n, 16):
        return {}
    paths = unpack_strings(offsets, cols["path_data"])
    return {paths[i]: (int(size[i]), int(mtime[i]), fps[i].tobytes()) for i in range(n)}


def load_stats(out: str | os.PathLike, version: str) -> dict[str, tuple[int, int, bytes]]:
    """{absolute path: (size, mtime_ns, fingerprint)} recorded for ``version``."""
    return _load(stats_file(out, version), _stats)


def save_stats(out: str | os.PathLike, version: str, stats: dict[str, tuple[int, int, bytes]]) -> None:
    """Add ``stats`` ({absolute path: (size, mtime_ns, fingerprint)}) to ``version``'s file."""

    def columns(merged: dict[str, tuple[int, int, bytes]]) -> dict:
        names = sorted(merged)
        cols = dict(zip(("path_offsets", "path_data"), pack_strings(names)))
        cols["size"] = np.array([merged[n][0] for n in names], dtype="<u8")
        cols["mtime_ns"] = np.array([merged[n][1] for n in names], dtype="<i8")
        cols["fingerprint"] = _fingerprints([merged[n][2] for n in names])
        return cols

    _add(stats_file(out, version), stats, lambda: load_stats(out, version), columns)
