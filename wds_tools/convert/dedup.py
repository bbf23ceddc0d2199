"""``convert --dedup``: near-duplicate clusters among a source's rows, found before splits are drawn.

Every row's source is decoded at the conversion's (largest) size as the writer will decode it, hashed
(``format.phash``) and its colour layout and look (``similar.match.looks``, 1 KiB) kept; ``similar.near.near_clusters``
gives the clusters (candidates within the threshold, each hash row's nearest; equal hashes collapsed first: N
copies of one image cost O(N log N); each candidate pair checked on its looks, as ``dups`` checks them) and the
rows too flat to hash, which are listed. Rows naming one path share one read and decode. The source's split drawing (``source._with_splits``) then joins
the units (group or key) of each cluster's rows, so a cluster of near-duplicates, with every group it
touches, lands in one split. A row whose source cannot be read or decoded has no hash here; the
conversion reports it as it would without --dedup.
A local source that an earlier version recorded with the same path, size and mtime (its stat cache,
as the quick check of an incremental conversion takes it) takes the hash that version stored for
its fingerprint, when that version's pixels were made the same way: it is not decoded to be searched,
only when the search makes it a candidate (for its colour and look).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DecodeError, IndexFormatError
from ..format.index import load_index
from ..format.phash import colour_layout, flagged_alike, phash
from ..similar.match import GRID, looks
from ..similar.near import near_clusters
from ..storage.transport import is_remote
from .decode import DecodeSettings, decode_image
from .reuse import base_incompatibilities
from .scan import open_source
from .sourcecache import load_stats

__all__ = ["NearRows", "NearFinder", "near_rows", "known_hashes"]


@dataclass(frozen=True)
class NearRows:
    """The near-duplicate clusters among a source's rows (row positions, each cluster sorted), and the
    rows too flat to hash (``format.phash.is_flat``), which are in none."""

    clusters: list[list[int]] = field(default_factory=list)
    flat: list[int] = field(default_factory=list)
    uncoloured: list[int] = field(default_factory=list)  # rows hashed from a base whose source no longer read
    checked: int = 0  # candidate pairs of distinct looks checked (similar.match)


NearFinder = Callable[[Sequence[str]], NearRows]
"""A function of the rows' source paths giving their near-duplicate clusters (``NearRows``)."""


def known_hashes(out: str | os.PathLike, version: str, wanted: dict) -> dict[str, np.ndarray]:
    """{absolute source path: stored phash (uint64 [7])} of an earlier version whose pixels ``wanted`` (size, resize,
    decode, decoder_versions) would equal; keyed by path with the stat cache's size and mtime checked
    by ``near_pairs``. {} when the version has no such folder, no hash column, hashes flagged by other rules
    (``format.phash.flagged_alike``) or no stat cache."""
    folder = Path(out) / version / str(wanted["size"])
    try:
        index = load_index(folder)
    except (IndexFormatError, OSError):
        return {}
    if base_incompatibilities(index.info, wanted) or not flagged_alike(index.info, index.samples.columns):
        return {}
    by_fp = {fp.tobytes(): h for fp, h in zip(index.samples["fingerprint"], index.samples["phash"])}
    out_: dict[str, np.ndarray] = {}
    for path, (size, mtime, fp) in load_stats(out, version).items():
        if fp in by_fp and mtime:
            out_[f"{path}\0{size}\0{mtime}"] = by_fp[fp]
    return out_


def near_rows(
    side: int, resize: str, settings: DecodeSettings, threshold: int, known: dict[str, np.ndarray] | None = None
) -> NearFinder:
    """A function from the rows' source paths to their near-duplicate clusters and the rows too flat to
    hash (``NearRows``); ``known`` (``known_hashes``) spares the decode of sources unchanged since an
    earlier version."""

    def clusters(paths: Sequence[str]) -> NearRows:
        hashes: list[np.ndarray] = []
        where: list[int] = []
        # colour layout and look of each decoded row; None: hash known, not decoded
        layouts: list[tuple[np.ndarray, np.ndarray] | None] = []
        seen: dict[str, int | None] = {}  # a path several rows name is read and decoded once: its entry
        for pos, path in enumerate(paths):
            if path in seen:
                earlier = seen[path]
                if earlier is not None:
                    hashes.append(hashes[earlier])
                    layouts.append(layouts[earlier])
                    where.append(pos)
                continue
            seen[path] = None
            if known and not is_remote(path):
                try:
                    st = os.stat(path)
                    h = known.get(f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}")
                except OSError:
                    h = None
                if h is not None:
                    seen[path] = len(hashes)
                    hashes.append(h)
                    layouts.append(None)
                    where.append(pos)
                    continue
            pixels = _stored(path)
            if pixels is None:
                continue
            seen[path] = len(hashes)
            hashes.append(phash(pixels))
            layouts.append((colour_layout([pixels])[0], looks([pixels])[0]))
            where.append(pos)
        if not hashes:
            return NearRows()

        uncoloured: list[int] = []
        by_path: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # a path several rows name is decoded once again

        def looks_of(_side: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            for r in rows.tolist():
                if layouts[r] is None:  # hash known from the base: decoded now, for its colour and look
                    path = paths[where[r]]
                    if path not in by_path:
                        pixels = _stored(path)
                        # unreadable now (its size and mtime matched): no pixels to check it on, so it passes
                        # against none (its look blank: too plain to check), and said in the summary
                        by_path[path] = (
                            (colour_layout([pixels])[0], looks([pixels])[0])
                            if pixels is not None
                            else (np.zeros((2, 2, 2), np.int16), np.zeros((GRID, GRID), np.uint8))
                        )
                        if pixels is None:
                            uncoloured.append(where[r])
                    layouts[r] = by_path[path]
            got = [layouts[r] for r in rows.tolist()]
            return np.stack([g[0] for g in got if g is not None]), np.stack([g[1] for g in got if g is not None])

        found = near_clusters(np.stack(hashes).astype(np.uint64), threshold, looks=looks_of)
        return NearRows(
            [[where[x] for x in c.tolist()] for c in found.clusters],
            [where[x] for x in found.flat.tolist()],
            sorted(uncoloured),
            found.candidates,
        )

    def _stored(path: str) -> np.ndarray | None:
        """The pixels ``path`` would be stored as; None where it cannot be read or decoded."""
        try:
            f, _, _ = open_source(path)
            with f:
                data = f.read()
            return decode_image(data, side, resize, settings).pixels
        except (OSError, DecodeError):
            return None

    return clusters
