"""format.names: shard names and the brace patterns that name several."""

from __future__ import annotations

from wds_tools.convert import plan
from wds_tools.format.names import expand, shard_name, shard_split, url_pattern


def test_names_and_patterns():
    assert shard_name("train", 3) == "train-000003.tar"
    assert url_pattern("train", 42) == "train-{000000..000041}.tar" and url_pattern("val", 1) == "val-000000.tar"
    assert expand(url_pattern("val", 3)) == [shard_name("val", i) for i in range(3)]
    assert [shard_split(n) for n in ("train-000000.tar", "my-val-000012.tar", "x.tar", "val-12.tar")] == [
        "train",
        "my-val",
        "all",
        "all",
    ]
    assert plan.ShardPlan("val", 12, ()).name == "val-000012.tar"  # the converter names shards by format.names
