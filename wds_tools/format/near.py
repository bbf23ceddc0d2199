"""Pairs of samples whose perceptual hashes (``format.phash``) are within a distance, and their clusters.

``find_pairs`` finds every pair within the distance (``phash.distance``: the whole-image hash of one
sample, under the eight flips and quarter turns, against any of the other's seven hashes) without an
all-pairs scan: multi-index hashing. The 63 used bits are cut into three 21-bit bands; two hashes
within distance t differ in at most t // 3 bits on at least one band (pigeonhole). Every hash of
every sample is filed, per band, by its band value; each sample's whole-image hash, in its eight
variants, probes the buckets within that radius of its band values, and only the hashes found there
are compared in full. The probes are sorted by band value first, so the buckets are read in memory
order. ``clusters_of`` joins pairs into clusters (union-find). Used by ``inspect.dups`` and by
``convert --dedup``.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..errors import OptionError
from .phash import distances, variants_array

__all__ = ["DEFAULT_THRESHOLD", "find_pairs", "clusters_of"]

# bits: the largest with precision >= 0.99 on scripts/bench_dups.py's set that keeps the search to
# radius-1 probes (6 and more need radius 2: ten times the probes); README, "Near-duplicates"
DEFAULT_THRESHOLD = 5
"""The distance (``phash.distance``, bits) at or below which two images are near-duplicates."""

_BANDS = 3
_BAND_BITS = 21  # 3 x 21 = the 63 bits a hash uses (its top bit is 0)
_CHUNK = 1 << 15  # query samples per step: bounds the probe arrays
_MOST = 1 << 24  # candidates compared at once: bounds memory when many samples share a bucket


def _band(h: np.ndarray, b: int) -> np.ndarray:
    return ((h >> np.uint64(b * _BAND_BITS)) & np.uint64((1 << _BAND_BITS) - 1)).astype(np.int64)


def _flip_masks(radius: int) -> list[int]:
    """Every band value XOR mask with at most ``radius`` bits set."""
    masks = [0]
    for r in range(1, radius + 1):
        masks += [sum(1 << b for b in bits) for bits in itertools.combinations(range(_BAND_BITS), r)]
    return masks


def _as_rows(h: np.ndarray) -> np.ndarray:
    """[N] whole-image hashes or [N, K] hashes per sample -> uint64 [N, K]."""
    h = np.asarray(h, dtype=np.uint64)
    return h.reshape(-1, 1) if h.ndim == 1 else h


def _probe(queries: np.ndarray, stored: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray]:
    """(query row, stored row) of every whole-image hash of ``queries`` that, in one of its eight
    variants, is within ``threshold`` bits of one of the hashes of a ``stored`` row; may repeat."""
    k = stored.shape[1]
    flat = stored.reshape(-1)
    tables = []  # per band: stored hashes sorted by band value, their rows, each value's first position and count
    row_type = np.int32 if len(flat) < 2**31 else np.int64  # positions in the filed hashes
    for band in range(_BANDS):
        values = _band(flat, band).astype(np.int32)
        sizes = np.bincount(values, minlength=1 << _BAND_BITS)
        order = np.argsort(values, kind="stable")
        del values
        before = np.cumsum(sizes) - sizes
        tables.append((flat[order], (order // k).astype(row_type), sizes.astype(row_type), before.astype(row_type)))
        del order
    masks = _flip_masks(threshold // _BANDS)
    out_q, out_s = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for lo in range(0, len(queries), _CHUNK):
        variants = variants_array(queries[lo : lo + _CHUNK, 0]).reshape(-1)  # each query's 8 variants
        for band, (sorted_hashes, row_of, counts, firsts) in enumerate(tables):
            qb = _band(variants, band)
            by_value = np.argsort(qb, kind="stable")  # probes in bucket order: the reads run through memory
            qb, q = qb[by_value], variants[by_value]
            for m in masks:  # every band value within the radius
                probe = qb ^ m if m else qb
                n = counts[probe]
                ends = np.cumsum(n)
                # cut the probes where their candidates pass _MOST (a crowded bucket: many equal images)
                cuts = np.unique(np.searchsorted(ends, np.arange(_MOST, int(ends[-1]) if len(ends) else 0, _MOST)))
                for a, b in itertools.pairwise([0, *cuts.tolist(), len(probe)]):
                    na = n[a:b]
                    total = int(na.sum())
                    if not total:
                        continue
                    ea = np.cumsum(na)
                    pos = np.repeat(firsts[probe[a:b]] - (ea - na), na) + np.arange(total)
                    keep = np.flatnonzero(np.bitwise_count(np.repeat(q[a:b], na) ^ sorted_hashes[pos]) <= threshold)
                    if keep.size:
                        owner = a + np.searchsorted(ea, keep, side="right")
                        out_q.append(lo + by_value[owner] // 8)
                        out_s.append(row_of[pos[keep]])
    return np.concatenate(out_q), np.concatenate(out_s)


def find_pairs(a: np.ndarray, threshold: int, b: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of samples within ``threshold`` (``phash.distance``): (i, j, distance) arrays.

    ``a`` (and ``b``) hold each sample's hashes, uint64 [N, K] as ``phash_batch`` gives them (or [N]:
    whole-image hashes only). Within ``a`` (i < j) when ``b`` is None, else between ``a`` (i) and
    ``b`` (j). Exact: the same pairs as comparing every pair.
    """
    if threshold < 0 or threshold > 63:
        raise OptionError(f"--threshold must be 0..63 bits, not {threshold}")
    a = _as_rows(a)
    if b is None:
        qi, sj = _probe(a, a, threshold)
        apart = qi != sj  # a sample with itself is no pair
        i, j = np.minimum(qi, sj)[apart], np.maximum(qi, sj)[apart]
        other = a
    else:
        other = _as_rows(b)
        qi, sj = _probe(a, other, threshold)
        qj, si = _probe(other, a, threshold)
        i, j = np.concatenate([qi, si]), np.concatenate([sj, qj])
    if not len(i):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.unique(np.stack([i, j], axis=1), axis=0)
    i, j = pairs[:, 0], pairs[:, 1]
    return i, j, distances(a[i], other[j])


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
