"""Near-duplicates: candidates by the perceptual hashes (``format.phash``), each checked on its looks
(``similar.match``), and clusters of checked pairs (the rule: docs/FORMAT.md, "Near-duplicates").

Candidates: samples of equal hashes are one group (N copies cost one); each group keeps its ``HASH_NEAREST``
nearest within the threshold, found by multi-index hashing over three 21-bit bands (``_probe``), a crowded
bucket read only around the asked hash's place in it (``BUCKET_READ``), so that work and memory follow the
groups, not their pairs, on smooth photos too. The check: ``near_clusters`` asks ``looks`` for the candidates'
samples only, keeps each node's ``NEAREST`` by coarse look and its look neighbour (``LOOK_TREES``), checks those
pairs, and makes each cluster a representative and what passed against it, never a chain. Used by
``similar.dups`` (``dups``, ``stats``, ``verify --no-leakage``) and ``convert --dedup``. ``find_pairs`` is the
exact search by the hashes alone, for the benches and the tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError
from ..format.phash import FLAT_BIT, colour_alike, distances, is_flat, popcount, variants_array
from ..progress import Delayed
from .match import GRID, compare, inverse_turn

__all__ = [
    "DEFAULT_THRESHOLD",
    "MAX_THRESHOLD",
    "NEAREST",
    "HASH_NEAREST",
    "COARSE_LOOK",
    "LOOK_TREES",
    "LOOK_LEAF",
    "BUCKET_READ",
    "PAIR_DTYPE",
    "NearClusters",
    "near_clusters",
    "find_pairs",
    "clusters_of",
    "check_threshold",
    "Colours",
    "Looks",
    "near_distances",
    "SHIFT_WINDOWS",
]

Colours = Callable[[int, np.ndarray], np.ndarray]
"""``colours(side, samples)``: the colour layouts (``phash.colour_layout``, [len(samples), 2, 2, 2]) of those
samples (positions) of ``a`` (side 0) or ``b`` (side 1)."""

# bits: the largest with precision >= 0.99 on scripts/bench_dups.py's set that keeps the search to
# radius-1 probes (6 and more need radius 2: ten times the probes); README, "Near-duplicates"
DEFAULT_THRESHOLD = 5
"""The distance (bits) at or below which two images are near-duplicate candidates (``near_clusters``)."""
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
_MOST = 1 << 22  # candidates compared at once: bounds memory when many samples share a bucket (smooth photos)
_BUFFER = 1 << 21  # candidate entries gathered before each query's nearest are kept (``_Nearest``)
_ASKED = 4096  # samples whose looks are asked for at once
_PAIRS = 1 << 15  # node pairs whose looks (or coarse looks) are gathered at once: memory follows the nodes
_LEAVES = 1024  # leaves whose dot products are taken at once (``_look_neighbours``): about 20 MiB
_NO_FLAG = ~FLAT_BIT  # the hashes searched: a too-flat sample's whole-image hash with its flag cleared
SHIFT_WINDOWS = (2, 3, 4, 5)
"""The windows (top, bottom, left, right: ``phash.window_boxes``) whose hashes are compared, as they are, with the
other sample's centre window (1): a copy shifted by a few percent along a side is near there (shifted down, its
bottom window is near its original's centre, and its original's top window near its centre; both are asked: on
dermoscopic photos one of the two alone missed 5 of 200 such copies)."""
HASH_NEAREST = 32
"""Candidates kept per distinct hash row by the search: its nearest rows read within the threshold (then by row).
Smooth photos (skin with one darker lesion) are within 5 bits of hundreds of others; the cap keeps the pairs linear."""
NEAREST = 8
"""Of those, the candidates checked per look: the nearest by their coarse looks (``COARSE_LOOK``), a finer
signature than the hashes' bits (on smooth photos, a copy's rank among the 5-bit candidates: at most 2 against 296)."""
COARSE_LOOK = 8
"""The coarse look: a look's means over 4x4 cells (8x8 values), less their mean, over their norm."""
LOOK_TREES = 8
"""Each node is also checked against its look neighbour: the nearest by coarse look among the nodes that share a
leaf of one of these random-projection trees (``_look_neighbours``; docs/FORMAT.md). The hashes miss such a copy
on smooth photos: a recompression at JPEG quality 30 moves a smooth grey photo's hash by 8 bits, and a shifted
copy can be outranked among its group's 32 candidates by other smooth photos; by its look it is the nearest."""
BUCKET_READ = 32
"""The hashes read per probed bucket of a band value: a bucket of more holds alike photos (smooth skin); of it, the
query reads the ``BUCKET_READ`` nearest its own place in the bucket's order (``_key``), so that the search's time is
linear in the photos, not N^2 (docs/FORMAT.md, "Near-duplicates"). Below it the search is exact."""
LOOK_LEAF = 32
"""A tree halves its parts until none holds more than this many nodes (its leaves): linear in the nodes."""


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


def _key(h: np.ndarray, b: int) -> np.ndarray:
    """The hashes' bits with band ``b`` on top, then the next band, then the last: the order of a crowded bucket."""
    top = np.uint64(2 * _BAND_BITS)
    one = np.uint64((1 << _BAND_BITS) - 1)
    bands = [(h >> np.uint64(((b + i) % _BANDS) * _BAND_BITS)) & one for i in range(_BANDS)]
    return (bands[0] << top) | (bands[1] << np.uint64(_BAND_BITS)) | bands[2]


def _by_value(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` of band values (0 .. 2^21 - 1), in two stable sorts of 11 and 10 bits as
    uint16, which numpy sorts by radix: 1.8x (7,000,000 values) to 5x (262,144) faster."""
    low = np.argsort((values & 0x7FF).astype(np.uint16), kind="stable")
    return low[np.argsort((values[low] >> 11).astype(np.uint16), kind="stable")]


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


def _steps(queries: int, threshold: int, shifts: bool = False) -> int:
    """The search's steps for ``queries`` rows (with ``shifts``: and their edge windows' probes too)."""
    one = -(-queries // _CHUNK) * _BANDS * len(_flip_masks(threshold // _BANDS))
    edges = len(SHIFT_WINDOWS) * queries
    return one + (-(-edges // _CHUNK) * _BANDS * len(_flip_masks(threshold // _BANDS)) if shifts else 0)


def _probe(
    queries: np.ndarray,
    stored: np.ndarray,
    threshold: int,
    tick: Callable[[], None] = lambda: None,
    reduce: _Nearest | None = None,
    turned: bool = True,
    read: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(query row, stored row) of every whole-image hash of ``queries`` that, in one of its eight
    variants (``turned``; else as it is), is within ``threshold`` bits of one of the hashes of a ``stored``
    row; may repeat. With ``reduce``, each step's (query row, stored row, bits apart) are handed to it instead
    (the answer empty). With ``read``, a bucket of more than ``read`` hashes is read only where the query would
    stand in it, ordered by the key of that band (``_key``): the ``read`` hashes around that place."""
    per = 8 if turned else 1
    k = stored.shape[1]
    flat = stored.reshape(-1)
    tables = []  # per band: stored hashes sorted by band value, their rows, each value's first position and count
    row_type = np.int32 if len(flat) < 2**31 else np.int64  # positions in the filed hashes
    for band in range(_BANDS):
        values = _band(flat, band).astype(np.int32)
        sizes = np.bincount(values, minlength=1 << _BAND_BITS)
        order = _by_value(values)
        del values
        before = np.cumsum(sizes) - sizes
        deep = np.zeros(0, np.uint64)  # the keys of the crowded buckets' hashes, sorted (``read``)
        if read is not None and int(sizes.max(initial=0)) > read:
            at = np.flatnonzero(np.repeat(sizes > read, sizes))  # their places in the table: whole buckets
            deep = _key(flat[order[at]], band)
            by_key = np.argsort(deep, kind="stable")  # within each bucket (the key's top bits), by the rest
            order[at], deep = order[at][by_key], deep[by_key]
        tables.append(
            (flat[order], (order // k).astype(row_type), sizes.astype(row_type), before.astype(row_type), deep)
        )
        del order
    masks = _flip_masks(threshold // _BANDS)
    out_q, out_s = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for lo in range(0, len(queries), _CHUNK):
        part = queries[lo : lo + _CHUNK, 0]
        variants = variants_array(part).reshape(-1) if turned else part  # each query's 8 variants
        for band, (sorted_hashes, row_of, counts, firsts, deep) in enumerate(tables):
            qb = _band(variants, band)
            by_value = _by_value(qb)  # probes in bucket order: the reads run through memory
            qb, q = qb[by_value], variants[by_value]
            rest = _key(q, band) & np.uint64((1 << (2 * _BAND_BITS)) - 1) if len(deep) else None
            for m in masks:  # every band value within the radius
                tick()
                probe = qb ^ m if m else qb
                n = counts[probe]
                skip = None
                if rest is not None and read is not None:
                    crowded = np.flatnonzero(n > read)
                    if len(crowded):  # read only the ``read`` hashes around where the query's key would stand
                        bucket = probe[crowded].astype(np.uint64) << np.uint64(2 * _BAND_BITS)  # its first key
                        place = np.searchsorted(deep, bucket | rest[crowded]) - np.searchsorted(deep, bucket)
                        skip = np.zeros(len(probe), np.int64)
                        skip[crowded] = np.clip(place - read // 2, 0, n[crowded] - read)
                        n = n.copy()
                        n[crowded] = read
                ends = np.cumsum(n)
                # cut the probes where their candidates pass _MOST (a crowded bucket: many alike images)
                cuts = np.unique(np.searchsorted(ends, np.arange(_MOST, int(ends[-1]) if len(ends) else 0, _MOST)))
                for a, b in itertools.pairwise([0, *cuts.tolist(), len(probe)]):
                    na = n[a:b]
                    total = int(na.sum())
                    if not total:
                        continue
                    ea = np.cumsum(na)
                    start = firsts[probe[a:b]] if skip is None else firsts[probe[a:b]] + skip[a:b]
                    pos = np.repeat(start - (ea - na), na) + np.arange(total)
                    bits = np.bitwise_count(np.repeat(q[a:b], na) ^ sorted_hashes[pos])
                    keep = np.flatnonzero(bits <= threshold)
                    if keep.size:
                        owner = a + np.searchsorted(ea, keep, side="right")
                        if reduce is not None:
                            reduce(lo + by_value[owner] // per, row_of[pos[keep]].astype(np.int64), bits[keep])
                        else:
                            out_q.append(lo + by_value[owner] // per)
                            out_s.append(row_of[pos[keep]])
        if reduce is not None:
            reduce.flush()  # the chunk's queries are searched
    return np.concatenate(out_q), np.concatenate(out_s)


@dataclass
class _Distinct:
    """The distinct hash rows of the hashable samples of one set, and which samples hold each."""

    rows: np.ndarray  # uint64 [D, K]
    of: np.ndarray  # [N] the distinct row of each sample, -1 for a sample too flat to hash
    flat: np.ndarray  # [F] the samples too flat to hash


def _distinct(h: np.ndarray, keep_flat: bool = False) -> _Distinct:
    flat = is_flat(h)
    keep = np.arange(len(h)) if keep_flat else np.flatnonzero(~flat)
    of = np.full(len(h), -1, np.int64)
    if not len(keep):
        return _Distinct(np.zeros((0, h.shape[1]), np.uint64), of, np.flatnonzero(flat))
    # np.unique of the rows, as one structured key per row: sorted, with each sample's row
    rows, inverse = np.unique(np.ascontiguousarray(h[keep]), axis=0, return_inverse=True)
    of[keep] = inverse.reshape(-1)
    return _Distinct(rows, of, np.flatnonzero(flat))


def _distinct_pairs(
    a: _Distinct, threshold: int, b: _Distinct | None, tick: Callable[[], None]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, q, distance) of the distinct rows within ``threshold``: of ``a`` with p < q, or of ``a`` (p)
    against ``b`` (q); each pair once."""
    ka = a.rows
    kb = b.rows if b is not None else ka
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
    return p, q, distances(ka[p], kb[q])


def near_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The candidate distance of each row pair of two [P, K] hash arrays (flags cleared): the least of
    ``phash.distances`` and, with seven hashes, the bits between an edge window of either (``SHIFT_WINDOWS``) and
    the other's centre window, as they are: [P]."""
    d = distances(a, b)
    if a.shape[1] > SHIFT_WINDOWS[-1]:
        w = list(SHIFT_WINDOWS)
        shift = np.minimum(popcount(a[:, w] ^ b[:, 1:2]).min(axis=1), popcount(b[:, w] ^ a[:, 1:2]).min(axis=1))
        d = np.minimum(d, shift)
    return d


class _Nearest:
    """The ``nearest`` candidates of each query row found so far, by (bits apart, stored row): the probe's steps
    are gathered and, past ``_BUFFER`` entries, cut down; at the end of each chunk of queries (``flush``) its
    rows' candidates are cut down and set aside, so that memory and the sorting follow the rows, not the pairs."""

    def __init__(self, nearest: int, same: bool, per: int = 1) -> None:
        self.nearest, self.same, self.per = nearest, same, per  # per: queries per row (a row's edge windows)
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.done: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.size = 0

    def __call__(self, q: np.ndarray, s: np.ndarray, bits: np.ndarray) -> None:
        q = q // self.per if self.per > 1 else q
        if self.same:  # a row with itself is no pair
            keep = q != s
            q, s, bits = q[keep], s[keep], bits[keep]
        self.parts.append((q.astype(np.int64), s.astype(np.int64), bits.astype(np.int64)))
        self.size += len(q)
        if self.size > _BUFFER:
            self.parts = [self._cut(self.parts)]
            self.size = len(self.parts[0][0])

    def flush(self) -> None:
        """The chunk of queries is searched: its rows' nearest are final for this probe."""
        if self.parts:
            self.done.append(self._cut(self.parts))
        self.parts, self.size = [], 0

    def _cut(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each query's ``nearest`` stored rows among ``parts``, each once, sorted."""
        q, s, bits = (np.concatenate(x) for x in zip(*parts))
        if not len(q):
            return q, s, bits
        if int(q.max()) < 1 << 26 and int(s.max()) < 1 << 31 and int(bits.max()) < 64:
            # packed in one int64 (all >= 0), one sort of it each: first (query, row, bits), each (query, row) kept
            # at its fewest bits, then (query, bits, row); the search 1.5x faster than with lexsorts
            key = np.sort((q << 37) | (s << 6) | bits)
            key = key[np.r_[True, (key[1:] >> 6) != (key[:-1] >> 6)]]
            q, s, bits = key >> 37, (key >> 6) & ((1 << 31) - 1), key & 63
            key = np.sort((q << 37) | (bits << 31) | s)
            q, bits, s = key >> 37, (key >> 31) & 63, key & ((1 << 31) - 1)
        else:
            order = np.lexsort((bits, s, q))
            q, s, bits = q[order], s[order], bits[order]
            first = np.r_[True, (q[1:] != q[:-1]) | (s[1:] != s[:-1])]  # each (q, s) at its fewest bits
            q, s, bits = q[first], s[first], bits[first]
            order = np.lexsort((s, bits, q))
            q, s, bits = q[order], s[order], bits[order]
        starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
        rank = np.arange(len(q)) - np.repeat(starts, np.diff(np.r_[starts, len(q)]))
        keep = rank < self.nearest
        return q[keep], s[keep], bits[keep]

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query row, stored row, bits apart): each query's ``nearest`` stored rows, each once, sorted."""
        self.flush()
        if not self.done:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return self._cut(self.done)


def _candidates(
    a: _Distinct,
    threshold: int,
    b: _Distinct | None,
    nearest: int,
    tick: Callable[[], None],
    read: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, q, distance) of the candidate pairs of distinct rows (``near_clusters``): each row's ``nearest`` rows
    within ``threshold`` (of ``a`` with p < q, or of ``a`` (p) against ``b`` (q)), by the bits between its
    whole-image hash, turned, and their hashes (then by row), both ways; each pair once, with its distance."""
    ka = a.rows & _NO_FLAG
    kb = ka if b is None else b.rows & _NO_FLAG

    def search(queries: np.ndarray, stored: np.ndarray, same: bool) -> tuple[np.ndarray, np.ndarray]:
        found = _Nearest(nearest, same)
        _probe(queries, stored, threshold, tick, found, read=read)
        if queries.shape[1] >= SHIFT_WINDOWS[-1] + 1 and stored.shape[1] > 1:  # edge windows against centres
            edges = np.ascontiguousarray(queries[:, list(SHIFT_WINDOWS)]).reshape(-1, 1)
            centres = np.ascontiguousarray(stored[:, 1:2])
            by_edge = _Nearest(nearest, same, per=len(SHIFT_WINDOWS))
            _probe(edges, centres, threshold, tick, by_edge, False, read=read)
            found.done.append(by_edge.result())
        qi, sj, _ = found.result()
        return qi, sj

    if b is None:
        qi, sj = search(ka, ka, True)
        p, q = np.minimum(qi, sj), np.maximum(qi, sj)
    else:
        qi, sj = search(ka, kb, False)
        qj, si = search(kb, ka, False)
        p, q = np.concatenate([qi, si]), np.concatenate([sj, qj])
    if not len(p):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.unique(np.stack([p, q], axis=1), axis=0)
    p, q = pairs[:, 0], pairs[:, 1]
    # in parts: ``near_distances`` compares every variant with every hash ([pairs, 8, 7] at once)
    d = [near_distances(ka[p[lo : lo + _PAIRS]], kb[q[lo : lo + _PAIRS]]) for lo in range(0, len(p), _PAIRS)]
    return p, q, np.concatenate(d)


Looks = Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``looks(side, samples)``: the colour layouts (``phash.colour_layout``, [n, 2, 2, 2]) and the looks
(``match.looks``, uint8 [n, GRID, GRID]) of those samples (positions) of ``a`` (side 0) or ``b`` (side 1)."""


@dataclass
class NearClusters:
    """``near_clusters``' answer: sample positions (into ``a``, then ``b`` after ``a``'s)."""

    clusters: list[np.ndarray]  # each cluster's samples, sorted; largest cluster first
    max_distance: list[int]  # per cluster, the largest distance of its evidence pairs
    flat: np.ndarray  # the samples too flat to hash (``phash.is_flat``): searched by their bits as they are
    distinct: int  # distinct hash rows searched
    representative: list[int] = field(default_factory=list)  # per cluster, the sample all its others passed against
    pairs: list[np.ndarray] = field(default_factory=list)  # per cluster, PAIR_DTYPE rows: each other sample against it
    candidates: int = 0  # pairs of distinct looks checked (``match.compare``)
    passed: int = 0  # of which passed


PAIR_DTYPE = np.dtype([("a", np.int64), ("b", np.int64), ("distance", np.int64), ("score", np.float64)])
"""An evidence pair: a cluster's sample (a), its representative (b), their distance (bits) and the check's score."""


def _turns(ha: np.ndarray, hb: np.ndarray) -> np.ndarray:
    """For each pair of hash rows, the flip or turn of b's image (``match.turned``) that its hashes say makes it
    a's, when that is not the identity (else -1): the variant of the least distance, b's own first, ties to the
    first variant."""
    ha, hb = ha & _NO_FLAG, hb & _NO_FLAG
    # a's whole hash turned by g is near b's: b ~ g(a), so b turned back by g^-1 is a; b's turned by g near a's
    from_a = popcount(variants_array(ha[:, 0])[:, :, None] ^ hb[:, None, :]).min(axis=2)  # [P, 8]
    from_b = popcount(variants_array(hb[:, 0])[:, :, None] ^ ha[:, None, :]).min(axis=2)
    both = np.concatenate([from_b, from_a], axis=1)  # b's first
    k = both.argmin(axis=1)
    g = k % 8
    inverse = np.array([inverse_turn(x) for x in range(8)])
    g = np.where(k >= 8, inverse[g], g)
    return np.where(g == 0, -1, g)


def near_clusters(
    a: np.ndarray,
    threshold: int,
    b: np.ndarray | None = None,
    *,
    looks: Looks,
    nearest: int = NEAREST,
    hash_nearest: int = HASH_NEAREST,
    rank: np.ndarray | None = None,
    progress: bool = False,
) -> NearClusters:
    """The near-duplicate clusters (docs/FORMAT.md, Near-duplicates) within ``a``, or (``b`` given) those holding
    samples of both, from candidates across ``a`` and ``b`` only.

    ``a`` (and ``b``) hold each sample's hashes, uint64 [N, K] as ``phash_batch`` gives them (or [N]: whole-image
    hashes only). Candidates: each distinct hash row's ``hash_nearest`` rows within ``threshold`` (``_candidates``;
    samples too flat to hash are searched by their bits as they are, and listed in ``flat``). Of the pairs of looks
    of candidate rows, each look's ``nearest`` by the cosine of their coarse looks are checked (colour agreement,
    then ``match.compare``); a cluster is a representative
    and the samples that passed the check against it, never a chain. ``looks`` is asked only for the samples of
    candidate rows. ``rank`` (one integer per sample, ``a``'s then ``b``'s; default: their positions) orders the
    samples with equal hashes, looks and layouts, the first of which is named as a representative, so that the
    answer does not hang on the samples' order. ``progress`` shows the search's progress on stderr once it has
    run ``PROGRESS_AFTER`` s.
    """
    check_threshold(threshold)
    ra = _as_rows(a)
    rb = _as_rows(b) if b is not None else None
    da = _distinct(ra, keep_flat=True)
    db = _distinct(rb, keep_flat=True) if rb is not None else None
    shifts = ra.shape[1] > SHIFT_WINDOWS[-1]
    steps = _steps(len(da.rows), threshold, shifts) + (_steps(len(db.rows), threshold, shifts) if db is not None else 0)
    tick = Delayed(steps, "near-duplicate search", "step", enabled=progress, after=PROGRESS_AFTER)
    try:
        p, q, d = _candidates(da, threshold, db, hash_nearest, tick, BUCKET_READ)
    finally:
        tick.close()
    flat = np.flatnonzero(is_flat(ra))
    if rb is not None:
        flat = np.concatenate([flat, len(ra) + np.flatnonzero(is_flat(rb))])
    return _verified(ra, rb, da, db, p, q, d, looks, nearest, hash_nearest, flat, rank)


def _verified(
    ra: np.ndarray,
    rb: np.ndarray | None,
    da: _Distinct,
    db: _Distinct | None,
    p: np.ndarray,
    q: np.ndarray,
    d: np.ndarray,
    looks: Looks,
    nearest: int,
    hash_nearest: int,
    flat: np.ndarray,
    rank: np.ndarray | None = None,
) -> NearClusters:
    """``near_clusters`` from its candidate pairs of distinct rows (p of ``da``, q of ``db`` or ``da``)."""
    n_a = len(ra)
    offset = len(da.rows)
    rows = np.concatenate([da.rows, db.rows]) if db is not None else da.rows  # node rows: a's, then b's
    q = q + offset if db is not None else q
    # the samples of each row, as one array (by row, then sample) and each row's first place in it: not a list of
    # an array per row (a million rows: 2.5 s of making small arrays)
    held, first = _member_table(da)
    if db is not None:
        held_b, first_b = _member_table(db)
        held, first = np.concatenate([held, held_b + n_a]), np.concatenate([first[:-1], first_b + len(held)])
    count = np.diff(first)
    # every sample of a candidate row, and of a row several samples share
    wanted = np.unique(np.concatenate([p, q, np.flatnonzero(count > 1)]).astype(np.int64))
    found = NearClusters([], [], flat, len(rows))
    if not len(wanted):
        return found
    # nodes: the samples of one row with equal looks and layouts (by their XXH3-64), in the order of (row, that
    # digest); the looks are asked for in parts, and only each node's first kept, so N copies cost one look
    import xxhash

    size = count[wanted]
    samples = held[np.repeat(first[wanted] - (np.cumsum(size) - size), size) + np.arange(int(size.sum()))]
    row_of = np.repeat(wanted, size)
    key_of: dict[tuple[int, int], int] = {}
    first_look: list[np.ndarray] = []
    first_lay: list[np.ndarray] = []
    node_list: list[list[int]] = []
    for lo in range(0, len(samples), _ASKED):
        part, part_rows = samples[lo : lo + _ASKED], row_of[lo : lo + _ASKED]
        for side in (0, 1):
            sel = np.flatnonzero((part < n_a) if side == 0 else (part >= n_a))
            if not len(sel):
                continue
            got_lay, got_look = looks(side, part[sel] - (0 if side == 0 else n_a))
            got_lay = np.ascontiguousarray(got_lay, np.int16)
            got_look = np.ascontiguousarray(got_look, np.uint8)
            for k, x in enumerate(sel.tolist()):
                key = (int(part_rows[x]), xxhash.xxh3_64_intdigest(got_look[k].tobytes() + got_lay[k].tobytes()))
                node = key_of.get(key)
                if node is None:
                    node = key_of[key] = len(node_list)
                    node_list.append([])
                    first_look.append(got_look[k])
                    first_lay.append(got_lay[k])
                node_list[node].append(int(part[x]))
    keys = list(key_of)
    order = sorted(range(len(node_list)), key=lambda k: keys[k])
    n_nodes = len(order)
    node_row = np.array([keys[k][0] for k in order], np.int64)
    node_look = np.stack([first_look[k] for k in order])
    node_lay = np.stack([first_lay[k] for k in order])
    node_samples = [np.array(sorted(node_list[k]), np.int64) for k in order]
    # each node's samples in the order of ``rank``: its first is the one a representative node is named by
    first_of = [int(m[np.argmin(rank[m])]) if rank is not None else int(m[0]) for m in node_samples]
    # the node pairs: across each candidate row pair (at most ``hash_nearest`` nodes of each row), and within each
    # row (its first ``hash_nearest`` nodes against the others); each node's ``nearest`` by their coarse looks checked
    nodes_of_row: dict[int, list[int]] = {}
    for k, r in enumerate(node_row.tolist()):
        nodes_of_row.setdefault(r, []).append(k)
    # a row of one node (nearly all): its pairs by arrays; the few rows of several nodes by their lists
    one = np.full(len(rows), -1, np.int64)
    several: dict[int, list[int]] = {}
    for r, ks in nodes_of_row.items():
        if len(ks) == 1:
            one[r] = ks[0]
        else:
            several[r] = ks[:hash_nearest]
    simple = (one[p] >= 0) & (one[q] >= 0)
    parts = [np.stack([one[p[simple]], one[q[simple]]], axis=1)]
    uv: list[tuple[int, int]] = []
    for x, y in zip(p[~simple].tolist(), q[~simple].tolist()):
        xs = several.get(x, [int(one[x])] if one[x] >= 0 else [])
        ys = several.get(y, [int(one[y])] if one[y] >= 0 else [])
        uv.extend((i, j) for i in xs for j in ys)
    for r, ks in several.items():
        for i in ks:
            uv.extend((i, j) for j in nodes_of_row[r] if j > i)
    parts.append(np.array(uv, np.int64).reshape(-1, 2))
    pairs_uv = np.concatenate(parts)
    keep = _nearest_looks(node_look, pairs_uv[:, 0], pairs_uv[:, 1], nearest)
    # and each node's look neighbour: a copy whose hash moved beyond the threshold (a smooth photo recompressed),
    # or one outranked among its group's candidates by other smooth photos, is nearest by its look
    near_u, near_v = _look_neighbours(node_look, node_row >= offset if db is not None else None)
    checks = _Checks(rows, node_row, node_look, node_lay)
    passed_u, passed_v = checks.run(
        np.concatenate([pairs_uv[keep, 0], near_u]), np.concatenate([pairs_uv[keep, 1], near_v])
    )
    found.candidates = checks.count
    found.passed = len(passed_u)
    alone = [k for k in range(n_nodes) if len(node_samples[k]) > 1]
    self_ok = checks.plain_ok(np.array(alone, np.int64))  # a node of several samples: equal looks, unless too plain
    links: dict[int, set[int]] = {}
    for x, y in zip(passed_u.tolist(), passed_v.tolist()):
        links.setdefault(x, set()).add(y)
        links.setdefault(y, set()).add(x)
    clusters, reps, stars = [], [], []
    for comp in _node_components(n_nodes, passed_u, passed_v, [k for k, ok in zip(alone, self_ok) if ok]):
        for rep, nodes, scores in checks.stars(comp, links):
            cl = np.sort(np.concatenate([node_samples[k] for k in nodes]))
            if len(cl) < 2:
                continue
            if db is not None and not (cl[0] < n_a <= cl[-1]):
                continue  # all on one side: no pair across
            clusters.append(cl)
            reps.append(first_of[rep])
            stars.append((rep, nodes, scores))
    # the evidence: each sample against its cluster's representative, the distances of all in one call
    near_of = [(int(node_row[k]), int(node_row[rep])) for rep, nodes, _ in stars for k in nodes]
    dist_of = dict(zip(near_of, _row_distances(rows, near_of).tolist()))
    pairs = []
    for rep_sample, (rep, nodes, scores) in zip(reps, stars):
        ev = [
            (smp, rep_sample, dist_of[(int(node_row[k]), int(node_row[rep]))], sc)
            for k, sc in zip(nodes, scores)
            for smp in node_samples[k].tolist()
            if smp != rep_sample
        ]
        pairs.append(np.array(sorted(ev), dtype=PAIR_DTYPE))
    order = sorted(range(len(clusters)), key=lambda c: (-len(clusters[c]), int(clusters[c][0])))
    found.clusters = [clusters[c] for c in order]
    found.representative = [reps[c] for c in order]
    found.pairs = [pairs[c] for c in order]
    found.max_distance = [int(pairs[c]["distance"].max()) if len(pairs[c]) else 0 for c in order]
    return found


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


def _coarse_looks(look: np.ndarray) -> np.ndarray:
    """Each look's 4x4-cell means (8x8), less their mean, over their norm: [N, 64] (``COARSE_LOOK``)."""
    n = GRID // COARSE_LOOK
    # the cells' sums in int32 (exact), then their means: no float copy of the whole looks (8 bytes a cell)
    sums = np.asarray(look).reshape(len(look), COARSE_LOOK, n, COARSE_LOOK, n).sum(axis=(2, 4), dtype=np.int32)
    c = sums.reshape(len(look), -1) / float(n * n)
    c -= c.mean(axis=1, keepdims=True)
    return c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-9)


def _nearest_looks(look: np.ndarray, u: np.ndarray, v: np.ndarray, nearest: int) -> np.ndarray:
    """Which of the node pairs (u, v) are among the ``nearest`` of u's or of v's by the cosine of their coarse looks
    (greatest first, then by the other node): bool [len(u)]."""
    if not len(u):
        return np.zeros(0, bool)
    c = _coarse_looks(look)
    cos = np.concatenate(
        [np.einsum("ij,ij->i", c[u[lo : lo + _PAIRS]], c[v[lo : lo + _PAIRS]]) for lo in range(0, len(u), _PAIRS)]
    )
    keep = np.zeros(len(u), bool)
    x, y = np.concatenate([u, v]), np.concatenate([v, u])  # each node's pairs, whichever side it is on
    order = np.lexsort((y, -np.concatenate([cos, cos]), x))
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    rank = np.arange(len(xs)) - np.repeat(starts, np.diff(np.r_[starts, len(xs)]))
    keep[order[rank < nearest] % len(u)] = True
    return keep


def _look_neighbours(look: np.ndarray, side: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(u, v), u < v, each pair once: each node with its *look neighbour* (``LOOK_TREES``), the node of the greatest
    dot product of coarse looks (then the least node) among those sharing a leaf with it in one of the trees; with
    ``side`` (bool per node: of ``b``), among the nodes of the other side only."""
    n = len(look)
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    c = _coarse_looks(look)
    padded = np.concatenate([c, np.zeros((1, c.shape[1]))])  # row n: a leaf's empty places
    best_cos = np.full(n, -np.inf)
    best = np.full(n, n, np.int64)  # n: none yet
    for tree in range(LOOK_TREES):
        gen = np.random.RandomState(tree)  # the legacy generator: its stream is fixed (docs/FORMAT.md states it)
        order = np.arange(n)
        parts = 1
        part = np.zeros(n, np.int64)  # the part of each position of ``order``, ascending
        while -(-n // parts) > LOOK_LEAF:
            d = gen.standard_normal((parts, c.shape[1]))
            proj = np.einsum("ij,ij->i", c[order], d[part])
            o = np.lexsort((order, proj, part))
            order = order[o]
            starts = np.searchsorted(part, np.arange(parts))
            sizes = np.diff(np.r_[starts, n])
            at = np.arange(n) - np.repeat(starts, sizes)
            part = 2 * part + (at >= np.repeat(sizes // 2, sizes))
            parts *= 2
        # each leaf as a row of LOOK_LEAF places (n where it has fewer nodes), its dot products at once
        starts = np.searchsorted(part, np.arange(parts))
        sizes = np.diff(np.r_[starts, n])
        at = np.arange(n) - np.repeat(starts, sizes)
        for lo in range(0, parts, _LEAVES):
            sel = (part >= lo) & (part < lo + _LEAVES)
            leaf = np.full((min(_LEAVES, parts - lo), LOOK_LEAF), n, np.int64)
            leaf[part[sel] - lo, at[sel]] = order[sel]
            cl = padded[leaf]
            dots = np.einsum("lik,ljk->lij", cl, cl)
            bad = (leaf[:, :, None] == n) | (leaf[:, None, :] == n) | (leaf[:, :, None] == leaf[:, None, :])
            if side is not None:
                sd = np.r_[side, False][leaf]
                bad |= sd[:, :, None] == sd[:, None, :]
            dots[bad] = -np.inf
            top = dots.max(axis=2, keepdims=True)
            other = np.where((dots == top) & ~bad, leaf[:, None, :], n).min(axis=2)  # the least node of the best
            top = top[:, :, 0]
            x, o_, t_ = leaf.reshape(-1), other.reshape(-1), top.reshape(-1)
            ok = (x < n) & (o_ < n)
            x, o_, t_ = x[ok], o_[ok], t_[ok]
            better = (t_ > best_cos[x]) | ((t_ == best_cos[x]) & (o_ < best[x]))
            best_cos[x[better]], best[x[better]] = t_[better], o_[better]
    x = np.flatnonzero(best < n)
    y = best[x]
    pairs = np.unique(np.stack([np.minimum(x, y), np.maximum(x, y)], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def _row_distances(rows: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    """The candidate distance (``near_distances``) of each pair of distinct rows, 0 for a row with itself."""
    if not pairs:
        return np.zeros(0, np.int64)
    r, s = (np.array(x, np.int64) for x in zip(*pairs))
    out = np.zeros(len(r), np.int64)
    apart = r != s
    if apart.any():
        out[apart] = near_distances(rows[r[apart]] & _NO_FLAG, rows[s[apart]] & _NO_FLAG)
    return out


def _node_components(n: int, u: np.ndarray, v: np.ndarray, alone: list[int]) -> list[list[int]]:
    """The nodes joined by passed checks, in components (each sorted), and each node of several samples that
    passed against itself on its own; components in the order of their least node."""
    root = _components(n, u, v)
    groups: dict[int, list[int]] = {}
    for x in sorted(set(u.tolist()) | set(v.tolist()) | set(alone)):
        groups.setdefault(int(root[x]), []).append(x)
    return sorted(groups.values(), key=lambda g: g[0])


class _Checks:
    """The checks of pairs of nodes (``match.compare`` and colour agreement), each pair once."""

    def __init__(self, rows: np.ndarray, node_row: np.ndarray, look: np.ndarray, lay: np.ndarray) -> None:
        self.rows, self.node_row, self.look, self.lay = rows, node_row, look, lay
        self.scores: dict[tuple[int, int], float] = {}  # (u, v), u < v: the score, or -1 where it failed
        self.count = 0

    def run(self, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Check the pairs (u, v) not checked yet; the pairs of the given ones that passed."""
        if not len(u):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        lo, hi = np.minimum(u, v), np.maximum(u, v)
        pairs = np.unique(np.stack([lo, hi], axis=1), axis=0)
        todo = np.array([pq for pq in pairs.tolist() if tuple(pq) not in self.scores], np.int64).reshape(-1, 2)
        if len(todo):
            x, y = todo[:, 0], todo[:, 1]
            self.count += len(todo)
            alike = colour_alike(self.lay[x], self.lay[y])
            score = np.full(len(todo), -1.0)
            alike_at = np.flatnonzero(alike)
            for lo in range(0, len(alike_at), _PAIRS):  # the looks of a part of the pairs at a time
                idx = alike_at[lo : lo + _PAIRS]
                turns = _turns(self.rows[self.node_row[x[idx]]], self.rows[self.node_row[y[idx]]])
                got = compare(self.look[x[idx]], self.look[y[idx]], turns)
                score[idx] = np.where(got.passed, got.score, -1.0)
            for (xx, yy), sc in zip(todo.tolist(), score.tolist()):
                self.scores[(xx, yy)] = sc
        ok = np.array([self.scores[(int(x), int(y))] >= 0 for x, y in pairs.tolist()], bool)
        return pairs[ok, 0], pairs[ok, 1]

    def score(self, u: int, v: int) -> float:
        return self.scores[(min(u, v), max(u, v))]

    def plain_ok(self, nodes: np.ndarray) -> list[bool]:
        """Whether each node's look passes against itself (not too plain to check)."""
        if not len(nodes):
            return []
        return compare(self.look[nodes], self.look[nodes]).passed.tolist()

    def stars(self, comp: list[int], links: dict[int, set[int]]) -> list[tuple[int, list[int], list[float]]]:
        """A component's clusters: (representative, its nodes, each node's score against it); the representative
        is the node with the most passed checks (``links``) among those left (then the first), every node left in
        the component is checked against it, those that pass are its cluster, and the rest are taken the same way."""
        left = list(comp)
        out = []
        while left:
            here = set(left)
            rep = max(left, key=lambda k: (len(links.get(k, set()) & here), -k))
            others = [k for k in left if k != rep]
            missing = [k for k in others if (min(rep, k), max(rep, k)) not in self.scores]
            if missing:
                self.run(np.full(len(missing), rep, np.int64), np.array(missing, np.int64))
            nodes, scores = [rep], [1.0]
            for k in others:
                sc = self.score(rep, k)
                if sc >= 0:
                    nodes.append(k)
                    scores.append(sc)
            out.append((rep, nodes, scores))
            taken = set(nodes)
            left = [k for k in left if k not in taken]
        return out


def find_pairs(
    a: np.ndarray, threshold: int, b: np.ndarray | None = None, *, colours: Colours | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of samples within ``threshold`` (``phash.distance``), by the hashes alone (and, given ``colours``,
    agreeing in colour): (i, j, distance) arrays, sorted. Not the near-duplicates (``near_clusters`` checks its
    candidates on their looks); the exact pairs of the hashes, for the benches and the tests.

    ``a`` (and ``b``) as for ``near_clusters``; ``colours`` (``Colours``) gives the colour layouts of the samples
    asked for. Within ``a`` (i < j) when ``b`` is None,
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


def _member_table(d: _Distinct) -> tuple[np.ndarray, np.ndarray]:
    """The samples holding each distinct row, by row and then sample, and each row's first place among them (one
    more at the end: their count)."""
    hashed = np.flatnonzero(d.of >= 0)
    held = hashed[np.argsort(d.of[hashed], kind="stable")]
    return held, np.concatenate([[0], np.cumsum(np.bincount(d.of[hashed], minlength=len(d.rows)))])


def _members(d: _Distinct) -> list[np.ndarray]:
    """The samples holding each distinct row, in sample order: ``_member_table`` as an array per row."""
    held, first = _member_table(d)
    return np.split(held, first[1:-1])


def clusters_of(n: int, i: np.ndarray, j: np.ndarray) -> list[list[int]]:
    """Connected components of the pairs (union-find) with more than one member, each sorted, largest first."""
    root = _components(n, np.asarray(i, np.int64), np.asarray(j, np.int64))
    groups: dict[int, list[int]] = {}
    for x in sorted(set(np.asarray(i).tolist()) | set(np.asarray(j).tolist())):
        groups.setdefault(int(root[x]), []).append(x)
    return sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))
