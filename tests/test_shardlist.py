"""shardlist: URL resolution and the pure per-epoch plan (ranks, workers, equal batch counts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import convert_images
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from training_adapter.shardlist import plan_epoch, resolve_urls, shard_order
from wds_tools.errors import IndexFormatError, OptionError, ShardError
from wds_tools.inspect.stats import compute_stats


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return convert_images(tmp_path_factory.mktemp("shardlist"), 30, size=16, shard_size=4, val_every=6)


def test_folder_index_and_pattern_agree(folder):
    a = resolve_urls(folder)
    b = resolve_urls(folder / "index.json")
    c = resolve_urls(str(folder / "train-{000000..000006}.tar"))
    assert a.urls == b.urls == c.urls and len(a) == 7
    assert a.counts == c.counts and sum(a.counts) == 25
    assert a.mean == c.mean and len(a.mean) == 3 and a.size == 16
    v = resolve_urls(folder, split="val")
    assert sum(v.counts) == 5 and all("/val-" in u for u in v.urls)


def test_joined_patterns_and_lists(folder):
    one = str(folder / "train-{000000..000001}.tar")
    two = str(folder / "train-000005.tar")
    assert resolve_urls(f"{one}::{two}", allow_partial=True).urls == resolve_urls([one, two], allow_partial=True).urls
    assert len(resolve_urls([one, two], allow_partial=True).counts) == 3


def test_remote_and_pipe_pass_through():
    assert resolve_urls("pipe:cat a-{0..2}.tar").urls == ["pipe:cat a-0.tar", "pipe:cat a-1.tar", "pipe:cat a-2.tar"]
    r = resolve_urls("http://127.0.0.1:1/x-{00..01}.tar")
    assert r.urls == ["http://127.0.0.1:1/x-00.tar", "http://127.0.0.1:1/x-01.tar"] and r.counts is None


def test_errors(folder, tmp_path):
    with pytest.raises(ShardError, match=r"1 of 8 shards do not exist, e.g. .*train-000007.tar"):
        resolve_urls(str(folder / "train-{000000..000007}.tar"))
    with pytest.raises(IndexFormatError, match=r"no split 'test'; the index has"):
        resolve_urls(folder, split="test")
    with pytest.raises(IndexFormatError, match="no index at"):
        resolve_urls(tmp_path)
    with pytest.raises(OptionError, match="no shard given"):
        resolve_urls([])


def test_shard_order_is_a_seeded_permutation():
    a = shard_order(50, seed=3, epoch=1, shuffle=True)
    assert sorted(a) == list(range(50))
    assert a == shard_order(50, seed=3, epoch=1, shuffle=True)
    assert a != shard_order(50, seed=3, epoch=2, shuffle=True)
    assert a != shard_order(50, seed=4, epoch=1, shuffle=True)
    assert shard_order(5, seed=3, epoch=1, shuffle=False) == [0, 1, 2, 3, 4]


def test_too_few_shards_names_numbers_and_fix():
    with pytest.raises(
        OptionError,
        match=r"6 shards cannot feed 2 ranks x 4 workers = 8 readers.*"
        r"num_workers <= 3.*resampled=True",
    ):
        plan_epoch(
            6, [10] * 6, batch_size=4, seed=0, epoch=0, rank=0, world=2, num_workers=4, shuffle=True, drop_last=True
        )


def test_ddp_needs_counts():
    with pytest.raises(OptionError, match="2 ranks need the samples per shard"):
        plan_epoch(6, None, batch_size=4, seed=0, epoch=0, rank=0, world=2, num_workers=1, shuffle=True, drop_last=True)


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=24),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    batch=st.integers(1, 9),
    epoch=st.integers(0, 5),
)
def test_plan_gives_equal_batches_and_disjoint_shards(counts, world, workers, batch, epoch):
    if len(counts) < world * workers:
        return
    plans = [
        plan_epoch(
            len(counts),
            counts,
            batch_size=batch,
            seed=1,
            epoch=epoch,
            rank=r,
            world=world,
            num_workers=workers,
            shuffle=True,
            drop_last=True,
        )
        for r in range(world)
    ]
    totals = {sum(p.batches for p in rank_plans) for rank_plans in plans}
    assert len(totals) == 1  # every rank the same number of batches
    shards = [s for rank_plans in plans for p in rank_plans for s in p.shards]
    assert sorted(shards) == list(range(len(counts)))  # each shard read by exactly one worker
    for rank_plans in plans:
        for p in rank_plans:  # a worker never has to yield more full batches than it holds
            assert p.batches * batch <= sum(counts[s] for s in p.shards)


def test_resampled_plan_splits_epoch_batches():
    plans = plan_epoch(
        1,
        None,
        batch_size=4,
        seed=0,
        epoch=0,
        rank=0,
        world=3,
        num_workers=2,
        shuffle=True,
        drop_last=True,
        resampled=True,
        epoch_batches=7,
    )
    assert [p.batches for p in plans] == [4, 3]
    with pytest.raises(OptionError, match="resampled=True needs epoch_batches"):
        plan_epoch(
            1,
            None,
            batch_size=4,
            seed=0,
            epoch=0,
            rank=0,
            world=3,
            num_workers=2,
            shuffle=True,
            drop_last=True,
            resampled=True,
        )


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    world=st.integers(2, 4),
    workers=st.integers(1, 3),
    seed=st.integers(0, 5),
    epoch=st.integers(0, 3),
)
def test_spare_shards_never_repeat_within_a_rank(n, world, workers, seed, epoch):
    """A worker's spares are other ranks' shards, disjoint from every shard and spare of its own rank,
    taken from the same worker position of ranks r+1, r+2, ... in that order."""
    assume(n >= world * workers)
    counts = [5] * n
    order = shard_order(n, seed=seed, epoch=epoch, shuffle=True)
    for rank in range(world):
        plans = plan_epoch(
            n,
            counts,
            batch_size=2,
            seed=seed,
            epoch=epoch,
            rank=rank,
            world=world,
            num_workers=workers,
            shuffle=True,
            drop_last=True,
        )
        own = [i for p in plans for i in p.shards]
        spares = [i for p in plans for i in p.spares]
        assert len(spares) == len(set(spares)) and not set(spares) & set(own)
        assert sorted(own + spares) == list(range(n))
        for w, p in enumerate(plans):
            expected = [i for d in range(1, world) for i in order[(rank + d) % world :: world][w::workers]]
            assert p.spares == expected
    one = plan_epoch(
        n, counts, batch_size=2, seed=seed, epoch=epoch, rank=0, world=1, num_workers=1, shuffle=True, drop_last=True
    )
    assert one[0].spares == []


# ------------------------------------------------------------------ issue 22, point 9: no unbounded planner loop


def _cut_by_steps(batches: list[int], quota: int) -> list[int]:
    """The rule as first written (one batch at a time from the worker with the most, the last on ties)."""
    b = list(batches)
    while sum(b) > quota:
        w = max(range(len(b)), key=lambda i: (b[i], i))
        b[w] -= 1
    return b


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(0, 250))
def test_cut_to_is_the_one_at_a_time_rule(batches, quota):
    from training_adapter.shardlist import cut_to

    got = cut_to(batches, quota)
    assert got == _cut_by_steps(batches, quota)
    assert sum(got) == min(sum(batches), max(quota, 0))


def _crafted(folder: Path, tmp: Path, samples: list[int], nbytes: list[int]) -> Path:
    import json
    import shutil

    dst = tmp / "crafted"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(folder, dst)
    meta = json.loads((dst / "index.json").read_text())
    train = [s for s in meta["shards"] if s["split"] == "train"]
    for s, n, b in zip(train, samples, nbytes):
        s["samples"], s["bytes"] = n, b
    (dst / "index.json").write_text(json.dumps(meta))
    return dst


def test_row_11_a_count_no_shard_can_hold_is_refused_before_planning(folder, tmp_path):
    import time

    dst = _crafted(folder, tmp_path, [10**12] * 7, [10240] * 7)
    t0 = time.perf_counter()
    with pytest.raises(
        IndexFormatError,
        match=r"shards\[\d\]\.samples is 1,000,000,000,000, but a shard of 10,240 "
        r"bytes holds at most 10 samples",
    ):
        resolve_urls(dst)
    assert time.perf_counter() - t0 < 5


@settings(max_examples=60, deadline=None)
@given(
    samples=st.lists(st.one_of(st.integers(0, 50), st.integers(0, 10**18)), min_size=7, max_size=7),
    nbytes=st.lists(st.one_of(st.integers(0, 10**6), st.integers(0, 10**21)), min_size=7, max_size=7),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    batch=st.integers(1, 64),
)
def test_crafted_indexes_end_in_a_named_error_or_a_plan_quickly(
    folder, tmp_path_factory, samples, nbytes, world, workers, batch
):
    """Any samples/bytes in index.json: resolving and planning every rank, and stats, end within two
    seconds, in a plan (a report) or an IndexFormatError/OptionError."""
    import time

    dst = _crafted(folder, tmp_path_factory.mktemp("c"), samples, nbytes)
    t0 = time.perf_counter()
    try:
        shards = resolve_urls(dst)
        for rank in range(world):
            plans = plan_epoch(
                len(shards),
                shards.counts,
                batch_size=batch,
                seed=0,
                epoch=0,
                rank=rank,
                world=world,
                num_workers=workers,
                shuffle=True,
                drop_last=True,
            )
            assert all(p.batches is None or p.batches >= 0 for p in plans)
    except (IndexFormatError, OptionError):
        pass
    try:  # stats reads the same counts
        compute_stats(dst, world_size=world, workers=workers)
    except (IndexFormatError, OptionError):
        pass
    assert time.perf_counter() - t0 < 2.0


def test_a_version_folder_names_its_sizes_instead_of_convert_first(folder, tmp_path, monkeypatch):
    """Issue 32: make_loader("shards/v1"), the size folder left out, said "convert first"."""
    import shutil

    from training_adapter import make_loader

    for size in ("224", "96"):
        shutil.copytree(folder, tmp_path / "shards" / "v1" / size)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        IndexFormatError, match=r"shards/v1 holds the sizes 224, 96 \(a folder each\): use shards/v1/224"
    ):
        make_loader("shards/v1", batch_size=2, train=True)
