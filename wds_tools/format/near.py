"""Pairs of perceptual hashes (``format.phash``) within a Hamming distance, and their clusters.

``find_pairs`` finds every pair within the distance (least over the eight flips and quarter turns)
without an all-pairs scan: multi-index hashing. The 63 used bits are cut into three 21-bit bands;
two hashes within distance t differ in at most t // 3 bits on at least one band (pigeonhole), so
each hash's eight variants probe, per band, the buckets within that radius of their band value, and
only those candidates are compared in full. ``clusters_of`` joins pairs into clusters (union-find).
Used by ``inspect.dups`` and by ``convert --dedup``.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..errors import OptionError
from .phash import popcount, variants_array

__all__ = ["DEFAULT_THRESHOLD", "find_pairs", "clusters_of"]

DEFAULT_THRESHOLD = 3  # bits: the largest with precision >= 0.99 on scripts/bench_dups.py's set (README)
"""The Hamming distance in bits at or below which two images are near-duplicates."""

_BANDS = 3
_BAND_BITS = 21  # 3 x 21 = the 63 bits a hash uses (its top bit is 0)
_CHUNK = 1 << 16  # query hashes per step: bounds the candidate arrays


def _band(h: np.ndarray, b: int) -> np.ndarray:
    return ((h >> np.uint64(b * _BAND_BITS)) & np.uint64((1 << _BAND_BITS) - 1)).astype(np.int32)


def _flip_masks(radius: int) -> np.ndarray:
    """Every band value XOR mask with at most ``radius`` bits set."""
    masks = [0]
    for r in range(1, radius + 1):
        masks += [sum(1 << b for b in bits) for bits in itertools.combinations(range(_BAND_BITS), r)]
    return np.array(masks, dtype=np.int64)


def find_pairs(a: np.ndarray, threshold: int, b: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair within ``threshold`` bits (least over the flips/turns): (i, j, distance) arrays.

    Within ``a`` (i < j) when ``b`` is None, else between ``a`` (i) and ``b`` (j). Exact: the same
    pairs as comparing every pair.
    """
    if threshold < 0 or threshold > 63:
        raise OptionError(f"--threshold must be 0..63 bits, not {threshold}")
    a = np.asarray(a, dtype=np.uint64)
    stored = a if b is None else np.asarray(b, dtype=np.uint64)
    masks = _flip_masks(threshold // _BANDS).astype(np.int32).tolist()
    tables = []  # per band: stored rows sorted by band value, and each value's first position and count
    for band in range(_BANDS):
        values = _band(stored, band)
        counts = np.bincount(values, minlength=1 << _BAND_BITS)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        tables.append((np.argsort(values, kind="stable"), counts.astype(np.int32), starts))
    out_i, out_j = [], []
    for lo in range(0, len(a), _CHUNK):
        q = variants_array(a[lo : lo + _CHUNK]).reshape(-1)  # each query hash's 8 variants
        for band, (order, sizes, firsts) in enumerate(tables):
            qb = _band(q, band)
            for m in masks:  # every band value within the radius
                probe: np.ndarray = qb ^ m if m else qb
                n = sizes[probe]
                hit = np.flatnonzero(n)
                if not hit.size:
                    continue
                nh = n[hit].astype(np.int64)
                owner = np.repeat(hit, nh)
                # the k-th candidate of a hit is order[first + k]: one repeat of (first - candidates before it)
                cand = order[np.repeat(firsts[probe[hit]] - (np.cumsum(nh) - nh), nh) + np.arange(len(owner))]
                if b is None:  # within one set: the pair (i, j) with i < j only (j finds i the other way)
                    later = cand > lo + owner // 8
                    owner, cand = owner[later], cand[later]
                keep = np.bitwise_count(q[owner] ^ stored[cand]) <= threshold
                out_i.append(lo + owner[keep] // 8)
                out_j.append(cand[keep])
    if not out_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    i, j = np.concatenate(out_i), np.concatenate(out_j)
    pairs = np.unique(np.stack([i, j], axis=1), axis=0) if len(i) else np.zeros((0, 2), np.int64)
    i, j = pairs[:, 0], pairs[:, 1]
    dist = np.min(popcount(a[i][:, None] ^ variants_array(stored[j])), axis=1)
    return i, j, dist


def clusters_of(n: int, i: np.ndarray, j: np.ndarray) -> list[list[int]]:
    """Connected components of the pairs (union-find) with more than one member, each sorted, largest first."""
    parent = np.arange(n)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for a, b in zip(i.tolist(), j.tolist()):
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for x in sorted(set(i.tolist()) | set(j.tolist())):
        groups.setdefault(root(x), []).append(x)
    return sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))
