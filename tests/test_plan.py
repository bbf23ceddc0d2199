from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.errors import OptionError
from wds_tools.convert.plan import (
    assign_split, default_shard_size, key_hash, parse_shard_size, plan_split, sample_bytes,
)


def test_key_hash_is_stable_and_seeded():
    assert key_hash("abc", 0) == key_hash("abc", 0)
    assert key_hash("abc", 0) != key_hash("abc", 1)
    assert key_hash("abc", 0) != key_hash("abd", 0)
    assert 0 <= key_hash("abc", 0) < 2**64


def test_assign_split_fraction_is_close():
    keys = [f"k{i}" for i in range(20000)]
    val = sum(assign_split(k, seed=0, val_fraction=0.1) == "val" for k in keys)
    assert 1800 < val < 2200
    assert all(assign_split(k, seed=0, val_fraction=0.0) == "train" for k in keys[:100])


def test_default_shard_size_lands_between_100_and_500_mb():
    for size in (64, 128, 224, 256, 384, 512, 1024):
        n = default_shard_size(size)
        assert 100e6 <= n * sample_bytes(size) <= 500e6 or n == 1, size


def test_parse_shard_size():
    assert parse_shard_size("2000", 224) == 2000
    assert parse_shard_size(7, 224) == 7
    assert parse_shard_size("256MB", 224) == int(256e6 // sample_bytes(224))
    assert parse_shard_size(None, 224) == default_shard_size(224)
    with pytest.raises(OptionError, match="shard-size"):
        parse_shard_size("lots", 224)
    with pytest.raises(OptionError, match="at least 1"):
        parse_shard_size("0", 224)
    with pytest.raises(OptionError, match="at least 1"):
        parse_shard_size("1KB", 224)


items_strategy = st.lists(
    st.tuples(st.text("abcdefgh0123456789", min_size=1, max_size=8), st.integers(0, 4)),
    min_size=1, max_size=300, unique_by=lambda t: t[0],
)


@settings(max_examples=150, deadline=None)
@given(items=items_strategy, shard_size=st.integers(1, 50), seed=st.integers(0, 3))
def test_plan_is_a_balanced_stratified_partition(items, shard_size, seed):
    plans = plan_split("train", items, shard_size=shard_size, seed=seed)
    members = [i for p in plans for i in p.members]
    assert sorted(members) == list(range(len(items)))  # every item exactly once
    counts = [len(p.members) for p in plans]
    assert max(counts) - min(counts) <= 1
    assert max(counts) <= shard_size
    assert len(plans) == -(-len(items) // shard_size)
    total = Counter(label for _, label in items)
    for label, n in total.items():  # each class spread as evenly as integers allow
        per_shard = [sum(items[i][1] == label for i in p.members) for p in plans]
        assert max(per_shard) - min(per_shard) <= 1
    for p in plans:  # within a shard: ordered by the seeded key hash
        hashes = [key_hash(items[i][0], seed) for i in p.members]
        assert hashes == sorted(hashes)


def test_plan_is_deterministic_and_order_independent():
    items = [(f"k{i}", i % 3) for i in range(100)]
    a = plan_split("train", items, shard_size=16, seed=5)
    b = plan_split("train", list(reversed(items)), shard_size=16, seed=5)
    keys_a = [[items[i][0] for i in p.members] for p in a]
    rev = list(reversed(items))
    keys_b = [[rev[i][0] for i in p.members] for p in b]
    assert keys_a == keys_b
    c = plan_split("train", items, shard_size=16, seed=6)
    assert keys_a != [[items[i][0] for i in p.members] for p in c]


def test_plan_empty():
    assert plan_split("train", [], shard_size=10, seed=0) == []
