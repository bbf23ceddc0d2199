"""Full verify's recheck of samples.npz ``phash``: each .npy member read is hashed again from its pixels
(``format.phash``), a few at a time, and a stored hash that differs from its pixels' is a problem."""

from __future__ import annotations

import math

import numpy as np

from ...format.npy import NPY_HEADER_BYTES
from ...format.phash import phash_batch
from .problems import Problem

__all__ = ["phashes_of", "phash_problems"]


def phashes_of(members: list[tuple[int, bytearray]]) -> dict[int, list[int]]:
    """{data offset: phash} of .npy members given as (offset, bytes, header included); a member whose
    length is no [S, S, 3] image's is left out (its header is reported elsewhere)."""
    by_side: dict[int, list[tuple[int, bytearray]]] = {}
    for offset, data in members:
        side = math.isqrt(max(0, len(data) - NPY_HEADER_BYTES) // 3)
        if side and NPY_HEADER_BYTES + 3 * side * side == len(data):
            by_side.setdefault(side, []).append((offset, data))
    out: dict[int, list[int]] = {}
    for side, same in by_side.items():
        px = [np.frombuffer(d, np.uint8, offset=NPY_HEADER_BYTES).reshape(side, side, 3) for _, d in same]
        out.update(zip([o for o, _ in same], phash_batch(px).tolist()))
    return out


def phash_problems(shard: str, key: str, offset: int, got: list[int], want: list[int]) -> list[Problem]:
    """A sample whose stored hashes (``want``) are not those of its pixels (``got``, the pixels as converted)."""
    if got == want:
        return []
    differ = [k for k, (a, b) in enumerate(zip(got, want)) if a != b] or [len(want)]
    return [
        Problem(
            shard,
            "phash",
            f"{key}.npy: its perceptual hashes, recomputed from its pixels (as converted), differ from samples.npz "
            f"phash in {len(differ)} of {len(got)} (first: hash {differ[0]}, {_hex(got, differ[0])} against "
            f"{_hex(want, differ[0])}): the column was changed or made by another recipe (docs/FORMAT.md)",
            key=key,
            offset=offset,
        )
    ]


def _hex(hashes: list[int], k: int) -> str:
    return f"{hashes[k]:016x}" if k < len(hashes) else "none"
