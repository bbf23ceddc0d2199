"""ranks: the one rule dealing shards to ranks and workers, worked out by hand and against webdataset."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wds_tools.ranks import deal


def test_deal_by_hand():
    # 7 shards, 2 ranks: rank 0 gets 0 2 4 6, rank 1 gets 1 3 5; then each rank's j-th shard to worker j % 2
    assert deal(range(7), 2, 2) == [[[0, 4], [2, 6]], [[1, 5], [3]]]
    assert deal(["a", "b", "c"], 1, 1) == [[["a", "b", "c"]]]
    # fewer shards than readers: some get none
    assert deal([9, 8], 3, 2) == [[[9], []], [[8], []], [[], []]]
    assert deal([], 2, 1) == [[[]], [[]]]


def test_deal_keeps_the_items_not_their_positions():
    assert deal([40, 10, 30, 20], 2, 1) == [[[40, 30]], [[10, 20]]]


@given(n=st.integers(0, 60), world=st.integers(1, 7), workers=st.integers(1, 5))
def test_deal_is_a_partition_by_i_mod_world_then_j_mod_workers(n, world, workers):
    dealt = deal(range(n), world, workers)
    assert len(dealt) == world and all(len(row) == workers for row in dealt)
    assert sorted(i for row in dealt for part in row for i in part) == list(range(n))
    for rank, row in enumerate(dealt):
        for w, part in enumerate(row):
            assert all(i % world == rank and (i // world) % workers == w for i in part)
            assert part == sorted(part)


@pytest.mark.parametrize("n, world, workers", [(0, 1, 1), (7, 2, 2), (10, 3, 4), (5, 4, 2), (13, 1, 3), (9, 3, 1)])
def test_deal_is_webdatasets_split_by_node_then_split_by_worker(n, world, workers, monkeypatch):
    """The reference: webdataset's own ``split_by_node`` and ``split_by_worker``, rank and worker set
    through the environment variables they read."""
    shardlists = pytest.importorskip("webdataset.shardlists")
    dealt = deal(range(n), world, workers)
    for rank in range(world):
        for worker in range(workers):
            for name, value in (("RANK", rank), ("WORLD_SIZE", world), ("WORKER", worker), ("NUM_WORKERS", workers)):
                monkeypatch.setenv(name, str(value))
            got = list(shardlists.split_by_worker(shardlists.split_by_node(iter(range(n)))))
            assert dealt[rank][worker] == got, (rank, worker)
