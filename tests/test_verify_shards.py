"""inspect/verify/shards.py: the exact per-channel pixel sums a full verify takes from each shard's bytes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.format.index import histogram_mean_std
from wds_tools.inspect.verify.shards import PixelSums
from wds_tools.inspect.verify.totals import mean_std


@settings(max_examples=40, deadline=None)
@given(pieces=st.lists(st.binary(min_size=0, max_size=700), min_size=1, max_size=30), repeat=st.integers(1, 300))
def test_pixel_sums_match_a_direct_sum(pieces, repeat):
    """PixelSums (phase-aligned slots, flushed uint16/uint32 sums) against int64 sums of the bytes by
    position mod 3; mean_std against the converter's histogram_mean_std of the same bytes."""
    sums = PixelSums()
    data = b"".join(pieces) * repeat
    pos = 0
    for _ in range(repeat):
        for p in pieces:
            sums.add(p, pos % 3)
            pos += len(p)
    count, s1, s2 = sums.totals()
    a = np.frombuffer(data, np.uint8).astype(np.int64)
    assert count == [len(a[c::3]) for c in range(3)]
    assert s1 == [int(a[c::3].sum()) for c in range(3)]
    assert s2 == [int((a[c::3] ** 2).sum()) for c in range(3)]
    if len(a) % 3 == 0 and len(a):
        hist = np.stack([np.bincount(a[c::3], minlength=256) for c in range(3)])
        assert mean_std(count, s1, s2) == tuple(histogram_mean_std(hist))


def test_pixel_sums_flush_before_they_overflow():
    for size in (3 * 1000, 3 * 7000):  # gathered small pieces, and pieces added directly
        sums = PixelSums()
        white = bytes([255]) * size
        for _ in range(700):  # 700 pieces on the same slots: uint16 sums would wrap after 257
            sums.add(white, 0)
        count, s1, s2 = sums.totals()
        n = 700 * size // 3
        assert count == [n] * 3 and s1 == [255 * n] * 3 and s2 == [255**2 * n] * 3


def test_pixel_sums_of_large_and_mixed_pieces_match_a_direct_sum():
    """Pieces from a few bytes to more than the slots hold, at every phase, as a verify of 224 px
    and larger shards cuts them at 1 MiB chunk ends."""
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
    cuts = np.sort(rng.integers(0, len(data), 40))
    sums, pos = PixelSums(), 0
    for end in [*cuts.tolist(), len(data)]:
        sums.add(memoryview(data[pos:end]), pos % 3)
        pos = end
    count, s1, s2 = sums.totals()
    a = data.astype(np.int64)
    assert count == [len(a[c::3]) for c in range(3)]
    assert s1 == [int(a[c::3].sum()) for c in range(3)] and s2 == [int((a[c::3] ** 2).sum()) for c in range(3)]
