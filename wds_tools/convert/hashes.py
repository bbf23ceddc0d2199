"""Manifest content hashes (a ``sha256`` or ``md5`` column) and the fingerprints they stand for.

The index keeps the format's fingerprint of every source, XXH3-128 of its bytes. A manifest may
also give each file a sha256 or md5, as published datasets often do. Every (manifest hash,
fingerprint) pair a conversion wrote a sample for is a fact about one byte string: the file was
read and matched its manifest hash, or the pair came from a base where that was so. These pairs
are kept outside the format, in ``OUT/.wds-tools-cache/<version>/source-hashes.npz``; a later
version looks a row's manifest hash up in its base's pairs and, when found, takes the source as
unchanged without reading it. Losing the file costs speed (sources are read again), never
correctness.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..format.fsutil import atomic_write_bytes
from ..format.index import read_npz, write_npz

__all__ = ["CACHE_DIR", "cache_file", "load_pairs", "save_pairs"]

CACHE_DIR = ".wds-tools-cache"


def cache_file(out: str | os.PathLike, version: str) -> Path:
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
    except Exception:  # a damaged cache is no cache
        return {}


def save_pairs(out: str | os.PathLike, version: str, pairs: dict[str, bytes]) -> None:
    """Add ``pairs`` to ``version``'s file (the sizes of a version share it)."""
    if not pairs:
        return
    merged = {**load_pairs(out, version), **pairs}
    names = sorted(merged)
    cols = {"hash": np.array([n.encode() for n in names], dtype="S"),
            "fingerprint": np.frombuffer(b"".join(merged[n] for n in names), dtype="u1").reshape(-1, 16)}
    path = cache_file(out, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, write_npz(cols))
