"""What a later version needs to skip reading unchanged sources, kept outside the format.

``OUT/.wds-tools-cache/<version>/``: ``source-stats.npz`` (path, size, mtime and fingerprint of each local
source written: the quick check) and ``source-hashes.npz`` (manifest sha256/md5 -> fingerprint pairs).
Losing either costs speed, never correctness (docs/guide/converter-internals.md, "Unchanged sources").
"""

from __future__ import annotations

import os
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


def load_pairs(out: str | os.PathLike, version: str) -> dict[str, bytes]:
    """{"algo:hex": fingerprint} recorded for ``version``; {} when there is no readable file."""
    path = cache_file(out, version)
    if not path.is_file():
        return {}
    try:
        cols = read_npz(path)
        hashes, fps = cols["hash"], cols["fingerprint"]
        if fps.ndim != 2 or fps.shape != (len(hashes), 16):
            return {}
        return {h.decode(): fps[i].tobytes() for i, h in enumerate(hashes)}
    except Exception as e:  # a damaged cache is no cache
        reraise_interruption(e)
        return {}


def save_pairs(out: str | os.PathLike, version: str, pairs: dict[str, bytes]) -> None:
    """Add ``pairs`` to ``version``'s file (the sizes of a version share it)."""
    if not pairs:
        return
    merged = {**load_pairs(out, version), **pairs}
    names = sorted(merged)
    cols = {
        "hash": np.array([n.encode() for n in names], dtype="S"),
        "fingerprint": np.frombuffer(b"".join(merged[n] for n in names), dtype="u1").reshape(-1, 16),
    }
    path = cache_file(out, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, write_npz(cols))


def stats_file(out: str | os.PathLike, version: str) -> Path:
    """The file of a version's quick-check stats (path, size, mtime, fingerprint), beside the versions."""
    return Path(out) / CACHE_DIR / version / "source-stats.npz"


def load_stats(out: str | os.PathLike, version: str) -> dict[str, tuple[int, int, bytes]]:
    """{absolute path: (size, mtime_ns, fingerprint)} recorded for ``version``; {} when there is no
    readable file."""
    path = stats_file(out, version)
    if not path.is_file():
        return {}
    try:
        cols = read_npz(path)
        offsets = cols["path_offsets"]
        size, mtime, fps = cols["size"], cols["mtime_ns"], cols["fingerprint"]
        n = len(size)
        if len(offsets) != n + 1 or len(mtime) != n or fps.shape != (n, 16):
            return {}
        paths = unpack_strings(offsets, cols["path_data"])
        return {paths[i]: (int(size[i]), int(mtime[i]), fps[i].tobytes()) for i in range(n)}
    except Exception as e:  # a damaged cache is no cache
        reraise_interruption(e)
        return {}


def save_stats(out: str | os.PathLike, version: str, stats: dict[str, tuple[int, int, bytes]]) -> None:
    """Add ``stats`` ({absolute path: (size, mtime_ns, fingerprint)}) to ``version``'s file."""
    if not stats:
        return
    merged = {**load_stats(out, version), **stats}
    names = sorted(merged)
    cols = {}
    cols["path_offsets"], cols["path_data"] = pack_strings(names)
    cols["size"] = np.array([merged[n][0] for n in names], dtype="<u8")
    cols["mtime_ns"] = np.array([merged[n][1] for n in names], dtype="<i8")
    cols["fingerprint"] = np.frombuffer(b"".join(merged[n][2] for n in names), dtype="u1").reshape(-1, 16)
    path = stats_file(out, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, write_npz(cols))
