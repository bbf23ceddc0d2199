"""Samples whose perceptual hashes (``format.phash``) are within a distance: their clusters, and the pairs.

The distance is ``phash.distance``: the whole-image hash of one sample, under the eight flips and
quarter turns, against any of the other's seven hashes. A sample too flat to hash (``phash.is_flat``)
is nobody's near-duplicate: it is set aside and listed. Samples with the same hashes (one image under
many keys) are collapsed first, so that the work and the memory follow the distinct hashes, not the
samples: N copies are one cluster found in O(N log N), never N^2 pairs.

The search over the distinct hashes is multi-index hashing, without an all-pairs scan. The 63 used
bits are cut into three 21-bit bands; two hashes within distance t differ in at most t // 3 bits on
at least one band (pigeonhole). Every hash of every sample is filed, per band, by its band value;
each whole-image hash, in its eight variants, probes the buckets within that radius of its band
values, and only the hashes found there are compared in full. The probes are sorted by band value
first, so the buckets are read in memory order. The probes per band grow as the number of band
values within the radius (1 for t <= 2, 22 up to 5, 232 up to 8, 1,562 up to 11, and so on):
``MAX_THRESHOLD`` is the largest threshold served. ``near_clusters`` joins the pairs into clusters
(union-find); used by ``similar.dups`` and by ``convert --dedup``.

The hashes see grey only. Given ``colours`` (a function giving the colour layouts, ``phash.colour_layout``,
of the samples it is asked for), a pair must also agree in colour (``phash.colour_alike``): the search runs
on the hashes alone, then again on the samples of its clusters with each one's colour layout beside its
hashes, so that only those samples' pixels are read, and equal hashes of unlike colours are not collapsed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from ..format.phash import colour_alike, distances, is_flat, variants_array
from ..progress import Progress

__all__ = [
    "DEFAULT_THRESHOLD",
    "MAX_THRESHOLD",
    "NearClusters",
    "near_clusters",
    "find_pairs",
    "clusters_of",
    "check_threshold",
    "Colours",
]

Colours = Callable[[int, np.ndarray], np.ndarray]
"""``colours(side, samples)``: the colour layouts (``phash.colour_layout``, [len(samples), 2, 2, 2]) of those
samples (positions) of ``a`` (side 0) or ``b`` (side 1)."""

# bits: the largest with precision >= 0.99 on scripts/bench_dups.py's set that keeps the search to
# radius-1 probes (6 and more need radius 2: ten times the probes); README, "Near-duplicates"
DEFAULT_THRESHOLD = 5
"""The distance (``phash.distance``, bits) at or below which two images are near-duplicates."""
MAX_THRESHOLD = 8
"""The largest threshold the search serves: radius-2 probes, 232 band values per band and hash variant
(the default's 22 times 10.5). Above it they grow to 1,562 (9 to 11; 20,000 samples: 47 s against
7.7 s at 8) and more, while unrelated photos come that near: precision on scripts/bench_dups.py's set,
colours agreeing, 0.9986 at 8, 0.9956 at 9 and 10, 0.9873 at 11 (by the hashes alone 0.9925, 0.959 and
0.920 at 9 to 11; docs/guide/figures.md). Refused above."""
PROGRESS_AFTER = 2.0
"""Seconds of searching after which ``near_clusters(progress=True)`` starts showing its progress."""

_BANDS = 3
_BAND_BITS = 21  # 3 x 21 = the 63 bits a hash uses (its top bit is the flat flag, never a search bit)
_CHUNK = 1 << 15  # query samples per step: bounds the probe arrays
_MOST = 1 << 24  # candidates compared at once: bounds memory when many samples share a bucket


def check_threshold(threshold: int) -> None:
    """Refuse a threshold the search does not serve (``OptionError`` naming ``MAX_THRESHOLD``)."""
    if threshold < 0 or threshold > MAX_THRESHOLD:
        raise OptionError(
            f"--threshold must be 0..{MAX_THRESHOLD} bits, not {threshold}: above {MAX_THRESHOLD} the search "
            f"probes seven times as many buckets per hash or more, and unrelated photos come that near "
            f"(default {DEFAULT_THRESHOLD})"
        )


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


class _Ticker:
    """Counts the search's steps; from ``PROGRESS_AFTER`` seconds on, shows them (``wds_tools.progress``)."""

    def __init__(self, total: int, enabled: bool, desc: str) -> None:
        self.total, self.enabled, self.desc = total, enabled, desc
        self.done = 0
        self.t0 = time.perf_counter()
        self.bar: Progress | None = None

    def __call__(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled and time.perf_counter() - self.t0 >= PROGRESS_AFTER:
            from ..progress import progress

            bar = progress(self.total, self.desc, "step").__enter__()
            bar.update(self.done)
            self.bar = bar

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def _steps(queries: int, threshold: int) -> int:
    return -(-queries // _CHUNK) * _BANDS * len(_flip_masks(threshold // _BANDS))


def _probe(
    queries: np.ndarray, stored: np.ndarray, threshold: int, tick: Callable[[], None] = lambda: None
) -> tuple[np.ndarray, np.ndarray]:
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
                tick()
                probe = qb ^ m if m else qb
                n = counts[probe]
                ends = np.cumsum(n)
                # cut the probes where their candidates pass _MOST (a crowded bucket: many alike images)
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


@dataclass
class _Distinct:
    """The distinct hash rows of the hashable samples of one set, and which samples hold each."""

    rows: np.ndarray  # uint64 [D, K]
    of: np.ndarray  # [N] the distinct row of each sample, -1 for a sample too flat to hash
    flat: np.ndarray  # [F] the samples too flat to hash


def _distinct(h: np.ndarray) -> _Distinct:
    flat = is_flat(h)
    keep = np.flatnonzero(~flat)
    of = np.full(len(h), -1, np.int64)
    if not len(keep):
        return _Distinct(np.zeros((0, h.shape[1]), np.uint64), of, np.flatnonzero(flat))
    # np.unique of the rows, as one structured key per row: sorted, with each sample's row
    rows, inverse = np.unique(np.ascontiguousarray(h[keep]), axis=0, return_inverse=True)
    of[keep] = inverse.reshape(-1)
    return _Distinct(rows, of, np.flatnonzero(flat))


def _distinct_pairs(
    a: _Distinct, threshold: int, b: _Distinct | None, tick: Callable[[], None], coloured: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, q, distance) of the distinct rows within ``threshold``: of ``a`` with p < q, or of ``a`` (p)
    against ``b`` (q); each pair once. ``coloured``: each row's last column is its colour layout
    (``_with_colour``), not a hash, and a pair must agree in colour too."""
    ka = a.rows[:, :-1] if coloured else a.rows
    kb = (b.rows[:, :-1] if coloured else b.rows) if b is not None else ka
    if b is None:
        qi, sj = _probe(ka, ka, threshold, tick)
        apart = qi != sj  # a row with itself is no pair
        p, q = np.minimum(qi, sj)[apart], np.maximum(qi, sj)[apart]
    else:
        qi, sj = _probe(ka, kb, threshold, tick)
        qj, si = _probe(kb, ka, threshold, tick)
        p, q = np.concatenate([qi, si]), np.concatenate([sj, qj])
    if not len(p):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.unique(np.stack([p, q], axis=1), axis=0)
    p, q = pairs[:, 0], pairs[:, 1]
    if coloured:
        other = a.rows if b is None else b.rows
        keep = colour_alike(_layouts(a.rows[p, -1]), _layouts(other[q, -1]))
        p, q = p[keep], q[keep]
    return p, q, distances(ka[p], kb[q])


def _with_colour(rows: np.ndarray, layouts: np.ndarray) -> np.ndarray:
    """[N, K] hashes and their samples' colour layouts [N, 2, 2, 2] -> uint64 [N, K + 1], the layout's eight
    values (-127..127) packed into the last column, a byte each."""
    packed = np.ascontiguousarray(np.asarray(layouts).reshape(-1, 8).astype(np.int8)).view(np.uint64)
    return np.concatenate([rows, packed.reshape(-1, 1)], axis=1)


def _layouts(packed: np.ndarray) -> np.ndarray:
    """The colour layouts [P, 2, 2, 2] packed by ``_with_colour``."""
    return np.ascontiguousarray(packed, np.uint64).view(np.int8).reshape(-1, 2, 2, 2).astype(np.int16)


@dataclass
class NearClusters:
    """``near_clusters``' answer: sample positions (into ``a``, then ``b`` after ``a``'s)."""

    clusters: list[np.ndarray]  # each cluster's samples, sorted; largest cluster first
    max_distance: list[int]  # per cluster, its largest distance between two of its linked distinct hashes
    flat: np.ndarray  # the samples too flat to hash (``phash.is_flat``): in no cluster
    distinct: int  # distinct hash rows searched


def _components(n: int, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The root (least member) of each of ``n`` nodes' connected component under the edges (p, q)."""
    parent = np.arange(n)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for x, y in zip(p.tolist(), q.tolist()):
        rx, ry = root(x), root(y)
        if rx != ry:
            parent[max(rx, ry)] = min(rx, ry)
    while True:  # every node to its root: pointer jumping, a few passes over the array
        up = parent[parent]
        if np.array_equal(up, parent):
            return parent
        parent = up


def near_clusters(
    a: np.ndarray,
    threshold: int,
    b: np.ndarray | None = None,
    *,
    colours: Colours | None = None,
    progress: bool = False,
) -> NearClusters:
    """The clusters of samples joined by distances within ``threshold`` (``phash.distance``): within
    ``a``, or (``b`` given) those holding samples of both, joined by pairs across ``a`` and ``b`` only.

    ``a`` (and ``b``) hold each sample's hashes, uint64 [N, K] as ``phash_batch`` gives them (or [N]:
    whole-image hashes only). Samples too flat to hash are listed in ``flat``, in no cluster. Time and
    memory follow the distinct hashes: copies with equal hashes are collapsed first. ``colours``
    (``Colours``): a pair must also agree in colour (``phash.colour_alike``), as docs/FORMAT.md defines a
    near-duplicate; it is asked only for the samples of the clusters the hashes alone give. ``progress``
    shows the search's progress on stderr once it has run ``PROGRESS_AFTER`` seconds.
    """
    check_threshold(threshold)
    ra = _as_rows(a)
    rb = _as_rows(b) if b is not None else None
    found = _clusters(ra, threshold, rb, progress)
    if colours is None or not found.clusters:
        return found
    # again, on the clustered samples only, each with its colour layout beside its hashes
    members = np.concatenate(found.clusters)
    n_a = len(ra)
    in_a, in_b = members[members < n_a], members[members >= n_a] - n_a
    sub_a = _with_colour(ra[in_a], colours(0, in_a))
    sub_b = _with_colour(rb[in_b], colours(1, in_b)) if rb is not None else None
    again = _clusters(sub_a, threshold, sub_b, False, coloured=True)
    back = np.concatenate([in_a, in_b + n_a])  # a position in the second search -> the sample's
    clusters = [np.sort(back[c]) for c in again.clusters]
    order = sorted(range(len(clusters)), key=lambda c: (-len(clusters[c]), int(clusters[c][0])))
    return NearClusters(
        [clusters[c] for c in order], [again.max_distance[c] for c in order], found.flat, found.distinct
    )


def _clusters(
    ra: np.ndarray, threshold: int, rb: np.ndarray | None, progress: bool, coloured: bool = False
) -> NearClusters:
    """``near_clusters`` of rows as they are (``coloured``: their last column is a colour layout)."""
    da = _distinct(ra)
    db = _distinct(rb) if rb is not None else None
    steps = _steps(len(da.rows), threshold) + (_steps(len(db.rows), threshold) if db is not None else 0)
    tick = _Ticker(steps, progress, "near-duplicate search")
    try:
        p, q, d = _distinct_pairs(da, threshold, db, tick, coloured)
    finally:
        tick.close()
    offset = len(da.rows)
    nodes = offset + (len(db.rows) if db is not None else 0)
    if db is not None:
        q = q + offset
    root = _components(nodes, p, q)
    worst = np.zeros(nodes, np.int64)
    np.maximum.at(worst, root[p], d)
    # each sample's node, then its component; samples of a component sorted together
    n_a = len(da.of)
    node_of = da.of if db is None else np.concatenate([da.of, np.where(db.of >= 0, db.of + offset, -1)])
    hashed = np.flatnonzero(node_of >= 0)
    comp = root[node_of[hashed]]
    order = np.lexsort((hashed, comp))
    hashed, comp = hashed[order], comp[order]
    starts = np.flatnonzero(np.r_[True, comp[1:] != comp[:-1]]) if len(comp) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(comp)].astype(np.int64)
    clusters, worst_of = [], []
    for s, e in zip(starts.tolist(), ends.tolist()):
        members = hashed[s:e]
        if len(members) < 2 or (db is not None and not (members[0] < n_a <= members[-1])):
            continue  # alone, or (across) all on one side: no pair across
        clusters.append(members)
        worst_of.append(int(worst[comp[s]]))
    order_c = sorted(range(len(clusters)), key=lambda c: (-len(clusters[c]), int(clusters[c][0])))
    flat = da.flat if db is None else np.concatenate([da.flat, db.flat + n_a])
    return NearClusters([clusters[c] for c in order_c], [worst_of[c] for c in order_c], flat, nodes)


def find_pairs(
    a: np.ndarray, threshold: int, b: np.ndarray | None = None, *, colours: Colours | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of samples within ``threshold`` (``phash.distance``): (i, j, distance) arrays, sorted.

    ``a`` (and ``b``) and ``colours`` as for ``near_clusters``. Within ``a`` (i < j) when ``b`` is None,
    else between ``a`` (i) and ``b`` (j); samples too flat to hash are in no pair. Exact: the same pairs
    as comparing every pair. N samples with equal hashes are N (N - 1) / 2 pairs: ``near_clusters`` is
    what grows with the distinct hashes only.
    """
    i, j, dist = _pairs(a, threshold, b)
    if colours is None or not len(i):
        return i, j, dist
    ui, uj = np.unique(i), np.unique(j)
    la, lb = colours(0, ui), colours(0 if b is None else 1, uj)
    keep = colour_alike(la[np.searchsorted(ui, i)], lb[np.searchsorted(uj, j)])
    return i[keep], j[keep], dist[keep]


def _pairs(a: np.ndarray, threshold: int, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``find_pairs`` by the hashes alone."""
    check_threshold(threshold)
    da = _distinct(_as_rows(a))
    db = _distinct(_as_rows(b)) if b is not None else None
    p, q, d = _distinct_pairs(da, threshold, db, lambda: None)
    members_a = _members(da)
    members_b = _members(db) if db is not None else members_a
    parts = []
    for x, y, dist in zip(p.tolist(), q.tolist(), d.tolist()):
        i, j = np.meshgrid(members_a[x], members_b[y], indexing="ij")
        parts.append((i.reshape(-1), j.reshape(-1), dist))
    if db is None:  # the copies of one hash: distance 0 to one another
        for m in members_a:
            if len(m) > 1:
                i, j = np.triu_indices(len(m), 1)
                parts.append((m[i], m[j], 0))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    i = np.concatenate([x for x, _, _ in parts])
    j = np.concatenate([y for _, y, _ in parts])
    dist = np.concatenate([np.full(len(x), z, np.int64) for x, _, z in parts])
    if db is None:
        i, j = np.minimum(i, j), np.maximum(i, j)
    order = np.lexsort((j, i))
    return i[order].astype(np.int64), j[order].astype(np.int64), dist[order]


def _members(d: _Distinct) -> list[np.ndarray]:
    """The samples holding each distinct row, in sample order."""
    hashed = np.flatnonzero(d.of >= 0)
    order = np.argsort(d.of[hashed], kind="stable")
    return np.split(hashed[order], np.cumsum(np.bincount(d.of[hashed], minlength=len(d.rows)))[:-1])


def clusters_of(n: int, i: np.ndarray, j: np.ndarray) -> list[list[int]]:
    """Connected components of the pairs (union-find) with more than one member, each sorted, largest first."""
    root = _components(n, np.asarray(i, np.int64), np.asarray(j, np.int64))
    groups: dict[int, list[int]] = {}
    for x in sorted(set(np.asarray(i).tolist()) | set(np.asarray(j).tolist())):
        groups.setdefault(int(root[x]), []).append(x)
    return sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))
