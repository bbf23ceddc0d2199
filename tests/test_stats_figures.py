"""inspect/stats/figures.py: the rank/worker arithmetic of ``distribute``."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.errors import OptionError
from wds_tools.inspect.stats.figures import distribute

# ------------------------------------------------------------------ rank / worker arithmetic


def test_distribute_even_split():
    d = distribute([10] * 8, world_size=2, workers=2)
    assert d.rank_shards == [4, 4] and d.rank_samples == [40, 40]
    assert d.worker_shards == [[2, 2], [2, 2]] and d.worker_samples == [[20, 20], [20, 20]]
    assert d.idle_workers == 0 and d.warnings == []
    assert (d.even_shards_below, d.even_shards_above) == (8, 8)


def test_distribute_follows_split_by_node_then_worker():
    # rank r gets shards r, r+R, ...; its j-th shard goes to worker j % W
    d = distribute([1, 2, 4, 8, 16, 32, 64], world_size=2, workers=2)
    # rank 0: shards 0, 2, 4, 6 -> workers 0: 0, 4 (1 + 16); 1: 2, 6 (4 + 64)
    # rank 1: shards 1, 3, 5    -> workers 0: 1, 5 (2 + 32); 1: 3 (8)
    assert d.worker_samples == [[17, 68], [34, 8]] and d.worker_shards == [[2, 2], [2, 1]]
    assert d.rank_samples == [85, 42]
    assert (d.even_shards_below, d.even_shards_above) == (4, 8)
    assert any("unequal sample counts per epoch (42 to 85)" in w and "4 or 8" in w for w in d.warnings)


def test_distribute_fewer_shards_than_readers():
    d = distribute([5, 5, 5], world_size=2, workers=4)
    assert d.rank_shards == [2, 1] and d.idle_workers == 5
    assert d.even_shards_below is None and d.even_shards_above == 8
    assert (
        d.warnings[0] == "3 shards for 2 ranks × 4 workers = 8 readers: 5 readers get no shard; use at least 8 shards"
    )
    assert "unequal sample counts per epoch (5 to 10)" in d.warnings[1]


def test_distribute_fewer_shards_than_ranks():
    d = distribute([7], world_size=3, workers=1)
    assert d.rank_shards == [1, 0, 0] and d.rank_samples == [7, 0, 0]
    assert "ranks without any shard: 2" in d.warnings[0]
    assert d.even_shards_above == 3


def test_distribute_uneven_counts_even_shards_warns_on_samples_only():
    d = distribute([10, 10, 9, 9], world_size=2, workers=1)
    assert d.rank_samples == [19, 19] and d.warnings == []
    d = distribute([10, 10, 10, 9], world_size=2, workers=1)
    assert d.rank_samples == [20, 19] and len(d.warnings) == 1 and "(19 to 20)" in d.warnings[0]


def test_distribute_no_shards_and_bad_arguments():
    d = distribute([], world_size=2, workers=2)
    assert d.shards == 0 and d.rank_samples == [0, 0] and d.even_shards_above == 4
    with pytest.raises(OptionError, match="world_size 0: expected an integer >= 1"):
        distribute([1], world_size=0, workers=1)
    with pytest.raises(OptionError, match="workers -2: expected an integer >= 1"):
        distribute([1], world_size=1, workers=-2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 9), st.integers(1, 6))
def test_distribute_properties(counts, r, w):
    d = distribute(counts, world_size=r, workers=w)
    assert sum(d.rank_samples) == sum(counts) and sum(d.rank_shards) == len(counts)
    assert max(d.rank_shards) - min(d.rank_shards) <= 1
    assert [sum(row) for row in d.worker_shards] == d.rank_shards
    assert [sum(row) for row in d.worker_samples] == d.rank_samples
    assert d.idle_workers == sum(x == 0 for row in d.worker_shards for x in row)
    assert d.even_shards_above % (r * w) == 0 and d.even_shards_above >= len(counts)
    assert d.even_shards_above - len(counts) < r * w or not counts
    if d.even_shards_below is not None:
        assert d.even_shards_below % (r * w) == 0 and 0 < d.even_shards_below <= len(counts)
    assert (len(counts) < r * w) == any("get no shard" in x or "gets no shard" in x for x in d.warnings)


def test_the_index_reader_in_evaluation_reads_every_sample_once():
    # 8 + 8 + 8 + 6 = 30 samples over 4 ranks: 8, 8, 7, 7 (rank r reads rows r, r + 4, ...), none left out
    d = distribute([8, 8, 8, 6], world_size=4, workers=3, reader="index", evaluation=True)
    assert (d.mode, d.rank_samples, d.left_out, d.idle_workers, d.warnings) == ("eval", [8, 8, 7, 7], 0, 0, [])
    few = distribute([1, 1], world_size=3, workers=1, reader="index", evaluation=True)
    assert few.rank_samples == [1, 1, 0] and few.warnings == [
        "2 samples for 3 ranks: 1 rank gets no sample in evaluation (each sample is read once, by one rank)"
    ]
    assert distribute([8, 8, 8, 6], world_size=4, workers=3, reader="index").mode == "train"
