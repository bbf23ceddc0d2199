"""``convert --dedup``: near-duplicate pairs among a source's rows, found before splits are drawn.

Every row's source is decoded at the conversion's (largest) size as the writer will decode it, and
hashed (``format.phash``); ``format.near.find_pairs`` gives the pairs within the threshold. The
source's split drawing (``source._with_splits``) then joins each pair's units (group or key), so a
cluster of near-duplicates, with every group it touches, lands in one split. A row whose source
cannot be read or decoded has no hash here; the conversion reports it as it would without --dedup.
A local source that an earlier version recorded with the same path, size and mtime (its stat cache,
as the quick check of an incremental conversion takes it) takes the hash that version stored for
its fingerprint, when that version's pixels were made the same way: it is not decoded again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..errors import DecodeError, IndexFormatError
from ..format.index import load_index
from ..format.near import find_pairs
from ..format.phash import phash
from ..format.transport import is_remote
from .decode import DecodeSettings, decode_image
from .hashes import load_stats
from .reuse import base_incompatibilities
from .scan import open_source

__all__ = ["NearPairs", "near_pairs", "known_hashes"]

NearPairs = Callable[[Sequence[str]], list[tuple[int, int]]]
"""A function of source paths giving the pairs of positions that are near-duplicates."""


def known_hashes(out: str | os.PathLike, version: str, wanted: dict) -> dict[str, np.ndarray]:
    """{absolute source path: stored phash (uint64 [7])} of an earlier version whose pixels ``wanted`` (size, resize,
    decode, decoder_versions) would equal; keyed by path with the stat cache's size and mtime checked
    by ``near_pairs``. {} when the version has no such folder, no hash column or no stat cache."""
    folder = Path(out) / version / str(wanted["size"])
    try:
        index = load_index(folder)
    except (IndexFormatError, OSError):
        return {}
    if base_incompatibilities(index.meta, wanted) or "phash" not in index.samples.columns:
        return {}
    by_fp = {fp.tobytes(): h for fp, h in zip(index.samples["fingerprint"], index.samples["phash"])}
    out_: dict[str, np.ndarray] = {}
    for path, (size, mtime, fp) in load_stats(out, version).items():
        if fp in by_fp and mtime:
            out_[f"{path}\0{size}\0{mtime}"] = by_fp[fp]
    return out_


def near_pairs(
    side: int, resize: str, settings: DecodeSettings, threshold: int, known: dict[str, np.ndarray] | None = None
) -> NearPairs:
    """A function from the rows' source paths to the (i, j) positions of near-duplicate pairs; ``known``
    (``known_hashes``) spares the decode of sources unchanged since an earlier version."""

    def pairs(paths: Sequence[str]) -> list[tuple[int, int]]:
        hashes, where = [], []
        for pos, path in enumerate(paths):
            if known and not is_remote(path):
                try:
                    st = os.stat(path)
                    h = known.get(f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}")
                except OSError:
                    h = None
                if h is not None:
                    hashes.append(h)
                    where.append(pos)
                    continue
            try:
                f, _, _ = open_source(path)
                with f:
                    data = f.read()
                hashes.append(phash(decode_image(data, side, resize, settings).pixels))
                where.append(pos)
            except (OSError, DecodeError):
                continue
        if not hashes:
            return []
        i, j, _ = find_pairs(np.stack(hashes).astype(np.uint64), threshold)
        return [(where[a], where[b]) for a, b in zip(i.tolist(), j.tolist())]

    return pairs
