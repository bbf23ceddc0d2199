"""``convert --dedup``: near-duplicate pairs among a source's rows, found before splits are drawn.

Every row's source is decoded at the conversion's (largest) size as the writer will decode it, and
hashed (``format.phash``); ``format.near.find_pairs`` gives the pairs within the threshold. The
source's split drawing (``source._with_splits``) then joins each pair's units (group or key), so a
cluster of near-duplicates, with every group it touches, lands in one split. A row whose source
cannot be read or decoded has no hash here; the conversion reports it as it would without --dedup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import DecodeError
from ..format.near import find_pairs
from ..format.phash import phash
from .decode import DecodeSettings, decode_image
from .scan import open_source

__all__ = ["NearPairs", "near_pairs"]

NearPairs = Callable[[Sequence[str]], list[tuple[int, int]]]  # source paths -> pairs of positions


def near_pairs(side: int, resize: str, settings: DecodeSettings, threshold: int) -> NearPairs:
    """A function from the rows' source paths to the (i, j) positions of near-duplicate pairs."""

    def pairs(paths: Sequence[str]) -> list[tuple[int, int]]:
        hashes, where = [], []
        for pos, path in enumerate(paths):
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
        i, j, _ = find_pairs(np.array(hashes, dtype=np.uint64), threshold)
        return [(where[a], where[b]) for a, b in zip(i.tolist(), j.tolist())]

    return pairs
