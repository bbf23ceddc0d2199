"""similar/near.py: the search's cost follows the distinct hashes (one image under many keys is one
cluster, not N^2 pairs), thresholds it cannot serve are refused at once, and a long search shows its
progress. (Exactness against an all-pairs scan: tests/test_dups.py; the check and the clusters of verified
pairs: tests/test_match.py.)"""

from __future__ import annotations

import bisect
import itertools
import time
import tracemalloc

import numpy as np
import pytest

from wds_tools.errors import OptionError
from wds_tools.similar import near
from wds_tools.similar.match import GRID
from wds_tools.similar.near import MAX_THRESHOLD, find_pairs, near_clusters


def _copies(n: int, others: int = 200, seed: int = 0) -> np.ndarray:
    """n samples with one image's seven hashes, then ``others`` random samples."""
    rng = np.random.default_rng(seed)
    one = rng.integers(0, 2**63, (1, 7), dtype=np.uint64)
    return np.concatenate([np.repeat(one, n, axis=0), rng.integers(0, 2**63, (others, 7), dtype=np.uint64)])


def looks_by_hash(*sets: np.ndarray):
    """``near_clusters``' ``looks`` for samples of random hashes: each sample's look is a random texture drawn from
    its whole-image hash (equal hashes, equal looks: they pass the check; any two others fail it), its colour
    grey."""

    def looks(side: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.asarray(sets[side], np.uint64).reshape(len(sets[side]), -1)[rows, 0]
        uniq, inverse = np.unique(h, return_inverse=True)
        made = np.stack([np.random.default_rng(int(x)).integers(0, 256, (GRID, GRID), dtype=np.uint8) for x in uniq])
        return np.zeros((len(rows), 2, 2, 2), np.int16), made[inverse.reshape(-1)]

    return looks


def clusters(a: np.ndarray, t: int, b: np.ndarray | None = None, **kw) -> near.NearClusters:
    """near_clusters with ``looks_by_hash``."""
    return near_clusters(a, t, b, looks=looks_by_hash(a, *([] if b is None else [b])), **kw)


def _peak(h: np.ndarray) -> tuple[near.NearClusters, int]:
    """near_clusters at the default threshold, and the peak of Python and numpy allocations it made."""
    tracemalloc.start()
    try:
        return clusters(h, 5), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_many_copies_of_one_image_are_one_cluster_in_little_memory():
    """50,000 samples with equal hashes (one JPEG under 50,000 keys): one cluster of all 50,000, found with
    a peak of allocations within 16 MB of that for 50 copies (the bucket tables, about 50 MB, are the same
    for both). Before the copies were collapsed the search made every pair of them (1.25e9 pairs: 5,000
    copies already ended in a MemoryError)."""
    res, peak = _peak(_copies(50_000))
    assert [c.tolist() for c in res.clusters] == [list(range(50_000))]
    assert res.max_distance == [0] and res.distinct == 201 and not len(res.flat)
    few, base = _peak(_copies(50))
    assert [c.tolist() for c in few.clusters] == [list(range(50))]
    assert peak - base < 16 * 2**20, f"{peak / 2**20:.0f} MiB against {base / 2**20:.0f} MiB"


def test_copies_cost_the_same_as_one():
    """The search's own work follows the distinct hashes: 20,000 copies take about the time of 20 (both well
    under a second; the bound is loose for a loaded machine)."""
    few, many = _copies(20), _copies(20_000)
    clusters(few, 5)  # warm the caches
    t0 = time.process_time()
    clusters(few, 5)
    t_few = time.process_time() - t0
    t0 = time.process_time()
    res = clusters(many, 5)
    t_many = time.process_time() - t0
    assert len(res.clusters) == 1 and len(res.clusters[0]) == 20_000
    assert t_many < 5 * t_few + 0.5, (t_few, t_many)


def test_copies_across_two_sets():
    """Across: copies on both sides are one cluster; copies on one side only are no cluster."""
    a, b = _copies(300, 50, seed=1), _copies(200, 50, seed=2)
    b[:100] = a[0]  # a hundred of b's samples are the image a has 300 copies of
    res = clusters(a, 5, b)
    assert [c.tolist() for c in res.clusters] == [list(range(300)) + list(range(350, 450))]


@pytest.mark.parametrize("threshold", [-1, MAX_THRESHOLD + 1, 20, 63, 64])
def test_thresholds_the_search_cannot_serve_are_refused_at_once(threshold):
    """Above MAX_THRESHOLD the probes grow to 1,562 band values per hash and band and more (--threshold 20
    ran 18 minutes and grew past 3 GB; 63 took 89 s on 20 samples): refused before any work, naming the limit."""
    h = _copies(2, 18)
    for call in (lambda: clusters(h, threshold), lambda: find_pairs(h, threshold)):
        t0 = time.perf_counter()
        with pytest.raises(OptionError, match=rf"--threshold must be 0\.\.{MAX_THRESHOLD} bits, not {threshold}"):
            call()
        assert time.perf_counter() - t0 < 0.5


def test_the_largest_threshold_served_is_fast_on_a_small_set():
    h = _copies(2, 18)
    t0 = time.process_time()
    res = clusters(h, MAX_THRESHOLD)
    assert time.process_time() - t0 < 10
    assert [c.tolist() for c in res.clusters] == [[0, 1]]


def test_a_long_search_shows_progress(monkeypatch, capsys):
    """Past PROGRESS_AFTER seconds the search shows its steps on stderr (plain lines off a terminal); a short
    search, or one asked for none, shows nothing."""
    h = _copies(2, 200)
    clusters(h, 5, progress=True)
    assert capsys.readouterr().err == ""  # well under PROGRESS_AFTER
    monkeypatch.setattr(near, "PROGRESS_AFTER", 0.0)
    clusters(h, 5)
    assert capsys.readouterr().err == ""  # not asked
    clusters(h, 5, progress=True)
    err = capsys.readouterr().err
    steps = 2 * 3 * (1 + 21)  # three bands, each probed at the band values within 1 bit; whole hashes, edge windows
    assert f"near-duplicate search: {steps}/{steps} step (100%)" in err, err


def _doc_look_neighbours(look: np.ndarray, side: np.ndarray | None = None) -> set[tuple[int, int]]:
    """docs/FORMAT.md's look neighbours, written from its text with Python lists: each node's coarse look (4x4-cell
    means less their mean, over their norm); per tree t of 8, parts halved level by level while one holds more than
    32 nodes (each part's direction drawn in part order from RandomState(t), its nodes sorted by (dot product, node),
    the first floor(m/2) the first half); each node's neighbour the node of greatest dot product, then least node,
    among those sharing one of its leaves (across two sets: of the other set)."""
    n = len(look)
    m = look.astype(np.float64).reshape(n, 8, 4, 8, 4).mean(axis=(2, 4)).reshape(n, 64)
    m -= m.mean(axis=1, keepdims=True)
    c = m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-9)
    best: dict[int, tuple[float, int]] = {}
    for t in range(8):
        gen = np.random.RandomState(t)
        parts = [list(range(n))]
        while max(len(p) for p in parts) > 32:
            halves = []
            for p in parts:
                d = gen.standard_normal(64)
                ordered = sorted(p, key=lambda x: (float(c[x] @ d), x))
                halves += [ordered[: len(p) // 2], ordered[len(p) // 2 :]]
            parts = halves
        for leaf in parts:
            for x in leaf:
                for y in leaf:
                    if y == x or (side is not None and side[x] == side[y]):
                        continue
                    key = (float(c[x] @ c[y]), -y)
                    if x not in best or key > (best[x][0], -best[x][1]):
                        best[x] = (key[0], y)
    return {(min(x, y), max(x, y)) for x, (_, y) in best.items()}


@pytest.mark.parametrize("n", [2, 31, 300, 1000])
def test_look_neighbours_are_the_documented_rule(n):
    """near._look_neighbours against the rule as docs/FORMAT.md writes it: looks of random smooth blobs (with some
    equal coarse looks, for the ties), within one set and across two."""
    rng = np.random.default_rng(n)
    yy, xx = np.mgrid[0:GRID, 0:GRID]
    centres = rng.uniform(8, 24, (n, 2))
    look = 180 - 60 * np.exp(-((yy - centres[:, :1, None]) ** 2 + (xx - centres[:, 1:, None]) ** 2) / 40)
    look = np.clip(look + rng.normal(0, 2, look.shape), 0, 255).astype(np.uint8)
    look[n // 2 :: 7] = look[0]  # equal looks: the least node wins a tie
    got = near._look_neighbours(look)
    assert set(zip(got[0].tolist(), got[1].tolist())) == _doc_look_neighbours(look)
    assert len(got[0]) >= n // 2
    side = np.arange(n) >= n // 3
    got = near._look_neighbours(look, side)
    assert set(zip(got[0].tolist(), got[1].tolist())) == _doc_look_neighbours(look, side)
    assert all(side[x] != side[y] for x, y in zip(got[0].tolist(), got[1].tolist()))


def _cut_by_hand(q: list[int], s: list[int], bits: list[int], nearest: int) -> list[tuple[int, int, int]]:
    """``_Nearest``'s cut in plain Python, as docs/FORMAT.md states it: each (query, row) once, at its fewest bits;
    then each query's first ``nearest`` by (bits, row)."""
    fewest: dict[tuple[int, int], int] = {}
    for qq, ss, bb in zip(q, s, bits):
        fewest[(qq, ss)] = min(bb, fewest.get((qq, ss), bb))
    out: list[tuple[int, int, int]] = []
    taken: dict[int, int] = {}
    for qq, bb, ss in sorted((qq, bb, ss) for (qq, ss), bb in fewest.items()):
        if taken.get(qq, 0) < nearest:
            taken[qq] = taken.get(qq, 0) + 1
            out.append((qq, ss, bb))
    return out


@pytest.mark.parametrize("offset", [0, 1 << 26])  # 0: the packed key's sort; 2^26 and more: the lexsort
@pytest.mark.parametrize("seed", range(4))
def test_the_nearest_cut_is_the_plain_sort(seed, offset):
    """The cap's cut (each query's ``nearest`` distinct rows by bits, then row) equals a plain Python sort of its
    entries, repeats of one (query, row) at several bits among them, whichever sort it takes."""
    rng = np.random.default_rng(seed)
    n = 3000
    q = rng.integers(0, 40, n) + offset
    s = rng.integers(0, 60, n) * (1 + (rng.random(n) < 0.1) * ((1 << 31) // 64 - 1))  # some rows near 2^31
    bits = rng.integers(0, 9, n)
    cut = near._Nearest(5, same=False)
    got = cut._cut([(q.astype(np.int64), s.astype(np.int64), bits.astype(np.int64))])
    want = _cut_by_hand(q.tolist(), s.tolist(), bits.tolist(), 5)
    assert list(zip(*(x.tolist() for x in got))) == want
    assert len(want) == 40 * 5


def _key_by_hand(h: int, b: int) -> int:
    """The hash's 63 bits with band ``b`` (bits 21b ... 21b + 20) on top, then band b + 1, then b + 2 (mod 3)."""
    bands = [(h >> (21 * ((b + i) % 3))) & ((1 << 21) - 1) for i in range(3)]
    return (bands[0] << 42) | (bands[1] << 21) | bands[2]


def _probe_by_hand(queries: list[int], stored: list[list[int]], t: int, read: int) -> set[tuple[int, int, int]]:
    """docs/FORMAT.md's candidate search in plain Python: (query, row, bits) of every stored hash the query reads
    within ``t`` bits. Per band, each bucket (one band value) ordered by (key of that band, place in the rows);
    the query probes every value within t // 3 bits of its own band value; of a bucket of more than ``read``
    hashes it reads the ``read`` from (its key's place in the bucket - read // 2), kept within the bucket."""
    found = set()
    for b in range(3):
        buckets: dict[int, list[tuple[int, int, int, int]]] = {}
        for row, hashes in enumerate(stored):
            for k, h in enumerate(hashes):
                buckets.setdefault((h >> (21 * b)) & ((1 << 21) - 1), []).append(
                    (_key_by_hand(h, b), row * 10 + k, h, row)
                )
        for bucket in buckets.values():
            bucket.sort()
        for qi, qh in enumerate(queries):
            own = (qh >> (21 * b)) & ((1 << 21) - 1)
            for r in range(t // 3 + 1):
                for flips in itertools.combinations(range(21), r):
                    v = own ^ sum(1 << f for f in flips)
                    bucket = buckets.get(v, [])
                    if len(bucket) > read:
                        want = (v << 42) | (_key_by_hand(qh, b) & ((1 << 42) - 1))
                        place = bisect.bisect_left([e[0] for e in bucket], want)
                        start = min(max(place - read // 2, 0), len(bucket) - read)
                        bucket = bucket[start : start + read]
                    for _, _, h, row in bucket:
                        bits = bin(qh ^ h).count("1")
                        if bits <= t:
                            found.add((qi, row, bits))
    return found


class _Collect:
    def __init__(self) -> None:
        self.found: set[tuple[int, int, int]] = set()

    def __call__(self, q: np.ndarray, s: np.ndarray, bits: np.ndarray) -> None:
        self.found |= set(zip(q.tolist(), s.tolist(), bits.tolist()))

    def flush(self) -> None:
        pass


def _crowded(n: int, k: int, seed: int) -> list[list[int]]:
    """Hashes as smooth photos give them: one base, each hash it with a few of 12 bits (4 per band) flipped, so that
    each band takes few values and its buckets fill with n."""
    rng = np.random.default_rng(seed)
    base = int(rng.integers(0, 1 << 62)) | (1 << 61)
    places = [21 * b + int(x) for b in range(3) for x in rng.choice(21, 4, replace=False)]
    return [
        [base ^ sum(1 << places[i] for i in rng.choice(12, int(rng.integers(0, 6)), replace=False)) for _ in range(k)]
        for _ in range(n)
    ]


@pytest.mark.parametrize("threshold", [5, 7])
@pytest.mark.parametrize("read", [4, 32, 1 << 20])
def test_a_crowded_bucket_is_read_as_documented(read, threshold):
    """The search reads a bucket of more than ``read`` hashes only around the query's place in it, by the rule
    written in docs/FORMAT.md (a plain Python reference); with ``read`` above every bucket it is exact: every pair
    within the threshold (all pairs compared by hand)."""
    made = _crowded(340, 2, seed=read + threshold)
    stored, queries = made[:300], [hs[0] for hs in made[300:]]
    got = _Collect()
    near._probe(
        np.array(queries, np.uint64).reshape(-1, 1),
        np.array(stored, np.uint64),
        threshold,
        reduce=got,  # type: ignore[arg-type]
        turned=False,
        read=read,
    )
    want = _probe_by_hand(queries, stored, threshold, read)
    assert got.found == want
    every = {
        (qi, row, bin(qh ^ h).count("1"))
        for qi, qh in enumerate(queries)
        for row, hs in enumerate(stored)
        for h in hs
        if bin(qh ^ h).count("1") <= threshold
    }
    if read >= 600:
        assert want == every  # nothing crowded: exact
    else:
        assert want < every  # buckets of up to 600 hashes, read at most ``read`` a probe: some pairs not read


def test_near_clusters_bounds_its_reads(monkeypatch):
    """``near_clusters`` searches with ``BUCKET_READ`` (32): the bound that keeps its time linear on smooth photos."""
    asked = []
    probe = near._probe

    def spy(*args, **kw):
        asked.append(kw.get("read"))
        return probe(*args, **kw)

    monkeypatch.setattr(near, "_probe", spy)
    h = _copies(3, others=50)
    near_clusters(h, 5, looks=looks_by_hash(h))
    assert near.BUCKET_READ == 32 and asked and set(asked) == {32}


@pytest.mark.parametrize("seed", range(3))
def test_each_node_keeps_its_nearest_looks_whichever_side_it_is_on(seed):
    """docs/FORMAT.md, Looks: each node keeps the 8 of its pairs whose coarse looks (4x4-cell means less their mean,
    over their norm) have the greatest dot product with its own (then by node), whether it is a pair's first or
    second node; a pair either kept is checked (a plain Python reference)."""
    rng = np.random.default_rng(seed)
    n = 60
    look = rng.integers(0, 256, (n, GRID, GRID), dtype=np.uint8)
    pairs = {(int(min(x, y)), int(max(x, y))) for x, y in rng.integers(0, n, (900, 2)) if x != y}
    u = np.array([min(p) for p in sorted(pairs)], np.int64)
    v = np.array([max(p) for p in sorted(pairs)], np.int64)
    cells = look.astype(np.float64).reshape(n, 8, GRID // 8, 8, GRID // 8).mean(axis=(2, 4)).reshape(n, 64)
    cells -= cells.mean(axis=1, keepdims=True)
    cells /= np.linalg.norm(cells, axis=1, keepdims=True)
    kept = set()
    for node in range(n):
        mine = [
            (float(cells[node] @ cells[o]), o, (min(node, o), max(node, o)))
            for o in range(n)
            if (min(node, o), max(node, o)) in pairs
        ]
        mine.sort(key=lambda e: (-e[0], e[1]))
        kept |= {pair for _, _, pair in mine[:8]}
    got = near._nearest_looks(look, u, v, 8)
    assert {(int(x), int(y)) for x, y, k in zip(u, v, got) if k} == kept
    assert 0 < len(kept) < len(pairs)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_band_values_are_sorted_as_numpy_sorts_them(dtype):
    """The search's two-pass sort of band values gives numpy's stable argsort, repeats and the extremes included."""
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.integers(0, 1 << 21, 50_000), [0, (1 << 21) - 1] * 50, rng.integers(0, 40, 5_000)])
    values = values.astype(dtype)
    assert np.array_equal(near._by_value(values), np.argsort(values, kind="stable"))


def test_the_samples_of_each_row_are_grouped_as_by_hand():
    """``_member_table`` (and ``_members`` from it): each distinct row's samples in sample order, samples too flat
    to hash (row -1) in none, rows of no sample empty; against a plain Python grouping."""
    rng = np.random.default_rng(11)
    of = rng.integers(-1, 40, 500)
    of[of == 7] = 3  # row 7 holds no sample
    d = near._Distinct(np.zeros((41, 1), np.uint64), of, np.flatnonzero(of < 0))
    by_hand: list[list[int]] = [[] for _ in range(41)]
    for sample, row in enumerate(of.tolist()):
        if row >= 0:
            by_hand[row].append(sample)
    held, first = near._member_table(d)
    assert [held[first[r] : first[r + 1]].tolist() for r in range(41)] == by_hand
    assert [m.tolist() for m in near._members(d)] == by_hand
    assert by_hand[7] == [] and len(by_hand[40]) == 0
