"""indexplan: epoch plans from samples.npz, subsets, class-balanced epochs, reads by offset."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import convert_images
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import read_stored

from training_adapter import ShardIndexDataset, make_loader
from training_adapter.indexplan import (
    SampleIndex,
    class_shares,
    deal,
    epoch_order,
    read_sample_index,
    select,
)
from training_adapter.shardlist import resolve_urls
from wds_tools.errors import IndexFormatError, OptionError, ShardError

S = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """120 samples in 3 classes (a, b, c by row), train shards of 10, every 6th row in val."""
    return convert_images(tmp_path_factory.mktemp("indexplan"), 120, size=S, shard_size=10, val_every=6)


@pytest.fixture(scope="module")
def stored(folder) -> dict:
    return read_stored(sorted(folder.glob("train-*.tar")))


def train_index(folder: Path) -> SampleIndex:
    shards = resolve_urls(folder, split="train")
    return read_sample_index(shards.index_base, shards.info, shards.urls, shards.names)


# --- pure planning -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 200), seed=st.integers(0, 9), epoch=st.integers(0, 9), shuffle=st.booleans())
def test_epoch_order_is_a_seeded_permutation(n, seed, epoch, shuffle):
    rows = np.arange(n) * 3
    labels = np.zeros(3 * n + 1, np.int64)
    a = epoch_order(rows, labels, seed=seed, epoch=epoch, shuffle=shuffle)
    assert sorted(a.tolist()) == rows.tolist()
    assert np.array_equal(a, epoch_order(rows, labels, seed=seed, epoch=epoch, shuffle=shuffle))
    if not shuffle:
        assert np.array_equal(a, rows)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    batch=st.integers(1, 9),
    drop_last=st.booleans(),
)
def test_deal_gives_disjoint_equal_ranks_and_ordered_batches(n, world, workers, batch, drop_last):
    order = np.random.default_rng(n).permutation(n)
    per_rank = []
    for rank in range(world):
        plans = deal(order, batch_size=batch, rank=rank, world=world, num_workers=workers, drop_last=drop_last)
        assert len(plans) == workers
        # the DataLoader takes batch j from worker j % workers: interleave back to rank order
        batches = [b for j in range(max(map(len, plans), default=0)) for p in plans if j < len(p) for b in [p[j]]]
        flat = np.concatenate(batches) if batches else np.array([], int)
        mine = order[rank::world][: n // world] if world > 1 else order
        assert np.array_equal(flat, mine[: len(flat)])
        assert all(len(b) == batch for b in batches[:-1])
        if drop_last:
            assert all(len(b) == batch for b in batches)
        else:
            assert len(flat) == len(mine)
        per_rank.append((len(batches), set(flat.tolist())))
    assert len({nb for nb, _ in per_rank}) == 1  # equal batch counts on every rank
    sets = [s for _, s in per_rank]
    assert sum(map(len, sets)) == len(set().union(*sets))  # disjoint


def test_balanced_draws_follow_the_shares_with_replacement_for_small_classes():
    labels = np.array([0] * 670 + [1] * 300 + [2] * 30)  # skewed like HAM10000: 67% to 3%
    rows = np.arange(len(labels))
    shares = np.array([1 / 3, 1 / 3, 1 / 3])
    a = epoch_order(rows, labels, seed=1, epoch=0, shuffle=True, shares=shares)
    counts = Counter(labels[a].tolist())
    assert len(a) == 1000 and sorted(counts.values()) == [333, 333, 334]
    small = Counter(a[labels[a] == 2].tolist())
    assert set(small) == set(range(970, 1000)) and max(small.values()) - min(small.values()) <= 1  # whole passes
    big = a[labels[a] == 0]
    assert len(set(big.tolist())) == len(big)  # a large class is drawn without replacement
    assert np.array_equal(a, epoch_order(rows, labels, seed=1, epoch=0, shuffle=True, shares=shares))
    assert not np.array_equal(a, epoch_order(rows, labels, seed=1, epoch=1, shuffle=True, shares=shares))


def test_class_shares_options_and_errors(folder):
    idx = train_index(folder)
    rows = np.arange(len(idx))
    assert class_shares(idx, "balanced", rows).tolist() == pytest.approx([1 / 3] * 3)
    assert class_shares(idx, {"a": 1, "c": 3}, rows).tolist() == pytest.approx([0.25, 0, 0.75])
    assert class_shares(idx, {0: 2, 1: 2, 2: 0}, rows).tolist() == pytest.approx([0.5, 0.5, 0])
    with pytest.raises(OptionError, match="class_weights='even': expected 'balanced'"):
        class_shares(idx, "even", rows)
    with pytest.raises(OptionError, match="class_weights: no class 'd'; the index has a, b, c"):
        class_shares(idx, {"d": 1}, rows)
    with pytest.raises(OptionError, match=r"class_weights\['a'\]=-1: expected a number >= 0"):
        class_shares(idx, {"a": -1}, rows)
    with pytest.raises(OptionError, match="every class present has weight 0"):
        class_shares(idx, {"a": 0}, rows)
    with pytest.raises(OptionError, match="class 'b' has a weight but no sample"):
        class_shares(idx, {"b": 1}, rows[idx.label[rows] != 1])


def test_select_subsets(folder, stored):
    idx = train_index(folder)
    keys = [k.decode() for k in idx.key]
    assert sorted(keys) == sorted(stored)
    half = select(idx, 0.5)
    assert 0.3 * len(idx) < len(half) < 0.7 * len(idx)
    assert np.array_equal(half, select(idx, 0.5))  # the same samples every time
    assert set(select(idx, 0.25)) <= set(half)  # nested fractions
    assert len(select(idx, 1.0)) == len(idx)
    some = [keys[3], keys[7]]
    assert [keys[i] for i in select(idx, some)] == some
    assert set(idx.label[select(idx, {"label": "b"})]) == {1}
    assert set(idx.label[select(idx, {"label": [0, "c"]})]) == {0, 2}
    assert np.array_equal(select(idx, lambda c: c["label"] == 2), select(idx, {"label": 2}))
    with pytest.raises(OptionError, match=r"1 key\(s\) are not in this split, e.g. 'nope'"):
        select(idx, [keys[0], "nope"])
    with pytest.raises(OptionError, match=r"subset: no column 'site'"):
        select(idx, {"site": "back"})
    with pytest.raises(OptionError, match=r"subset=1.5: a fraction must be in \(0, 1\]"):
        select(idx, 1.5)
    with pytest.raises(OptionError, match="must return a boolean array"):
        select(idx, lambda c: c["label"])
    with pytest.raises(OptionError, match="no class '\u00b2'; the index has a, b, c"):  # str.isdigit takes it
        select(idx, {"label": "\u00b2"})


def test_classes_are_named_first_then_taken_as_indexes():
    from training_adapter.indexplan import _class_index

    idx = SimpleNamespace(classes=["07", "7", "\u00b2"])  # labels that are not plain integers are names
    assert [_class_index(idx, v, "subset") for v in ("07", "7", "\u00b2", "2", 1)] == [0, 1, 2, 2, 1]
    with pytest.raises(OptionError, match=r"class index 3 out of range 0..2"):
        _class_index(idx, "3", "subset")


# --- the loader on the index ---------------------------------------------------------------------
def _epoch(loader) -> list[tuple[str, int, bytes]]:
    return [
        (k, int(lab), im.permute(1, 2, 0).contiguous().numpy().tobytes())
        for images, labels, keys in loader
        for im, lab, k in zip(images, labels, keys)
    ]


def test_index_and_stream_readers_give_the_same_samples_in_eval(folder, stored):
    kw = dict(batch_size=7, train=False, num_workers=0, return_keys=True, split="train")
    by_index = _epoch(make_loader(folder, **kw))
    by_stream = _epoch(make_loader(folder, reader="stream", **kw))
    assert by_index == by_stream  # the same plan: every shard in order, each in file order
    assert {k for k, _, _ in by_index} == set(stored)
    assert all(stored[k].pixels.tobytes() == px and stored[k].label == lab for k, lab, px in by_index)


def test_subset_reads_only_its_samples_once_and_about_its_share_of_bytes(folder, stored):
    full = make_loader(folder, batch_size=4, train=True, num_workers=0, return_keys=True, drop_last=False)
    keys = [k for _, _, ks in full for k in ks]
    full_bytes = full.dataset._gather.bytes_read
    part = make_loader(folder, batch_size=4, train=True, num_workers=0, return_keys=True, drop_last=False, subset=0.1)
    got = [k for _, _, ks in part for k in ks]
    idx = part.dataset.index
    want = {idx.key_str(r) for r in select(idx, 0.1)}
    assert sorted(got) == sorted(want) and len(set(got)) == len(got)
    assert set(keys) == set(stored)
    assert part.dataset._gather.bytes_read == full_bytes * len(got) // len(keys)  # only the subset's bytes
    listed = sorted(want)[:3]
    by_keys = make_loader(
        folder, batch_size=2, train=False, num_workers=0, return_keys=True, split="train", subset=listed
    )
    assert sorted(k for _, _, ks in by_keys for k in ks) == listed


def test_balanced_epochs_from_the_loader(folder, stored):
    kw = dict(batch_size=5, train=True, num_workers=2, return_keys=True, subset={"label": ["a", "b", "c"]})
    skewed = lambda c: (c["label"] == 2) | (np.arange(len(c["label"])) % 5 == 0)  # noqa: E731 - mostly class c
    plain = make_loader(folder, subset=skewed, **{k: v for k, v in kw.items() if k != "subset"})
    mix = Counter(int(lab) for _, labels, _ in plain for lab in labels)
    assert mix[2] > 2 * (mix[0] + mix[1])
    loader = make_loader(
        folder, subset=skewed, class_weights="balanced", **{k: v for k, v in kw.items() if k != "subset"}
    )
    first = [(k, int(lab)) for _, labels, keys in loader for k, lab in zip(keys, labels)]
    mix = Counter(lab for _, lab in first)
    n = sum(mix.values())
    assert all(abs(mix[c] / n - 1 / 3) <= 0.02 for c in range(3)), mix
    assert all(stored[k].label == lab for k, lab in first)
    loader.set_epoch(0)
    assert [(k, int(lab)) for _, labels, keys in loader for k, lab in zip(keys, labels)] == first  # reproducible
    assert [k for _, _, keys in loader for k in keys] != [k for k, _ in first]  # epoch 1 differs


def test_index_reader_feeds_more_workers_than_shards(folder, stored):
    loader = make_loader(
        str(folder / "val-000000.tar"),
        batch_size=2,
        train=False,
        num_workers=3,
        return_keys=True,
        split="val",
        allow_partial=True,
    )
    assert sorted(k for _, _, ks in loader for k in ks) == sorted(read_stored([folder / "val-000000.tar"]))


def test_a_shard_that_does_not_match_its_index_is_refused(folder, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    idx = train_index(bad)
    at = int(idx.offset[np.flatnonzero(idx.shard == 1)[2]])  # the third sample of train-000001's .npy header
    data = bytearray((bad / "train-000001.tar").read_bytes())
    data[at : at + 128] = bytes(128)  # same size, a header gone
    (bad / "train-000001.tar").write_bytes(bytes(data))
    loader = make_loader(bad, batch_size=4, train=False, num_workers=0, split="train")
    with pytest.raises(ShardError, match=rf"{bad}/train-000001.tar: byte {at}: sample '[^']+': no .npy header"):
        list(loader)
    (bad / "train-000002.tar").write_bytes(b"")
    with pytest.raises(ShardError, match=rf"{bad}/train-000002.tar is 0 bytes; its index says"):
        make_loader(bad, batch_size=4, train=False, num_workers=0, split="train")


def test_an_index_json_that_disagrees_with_its_samples_npz_is_named(folder, tmp_path):
    """Issue 38, point 12: index.json with one shard entry removed (every later entry one place back; 10
    train shards of 10, then 2 val shards of 10: rows 110-119 name the last) or a shard's sample count changed: make_loader names samples.npz, index.json and what disagrees (it raised
    a bare IndexError: index 15 is out of bounds)."""
    import json
    import shutil

    for name, edit, match in [
        (
            "removed",
            lambda m: m["shards"].pop(3),
            # index.json against itself first (format.model): its split no longer counts the shards it lists
            r"index.json: splits.train.shards is 10; shards lists 9 train shard\(s\)",
        ),
        (
            # the last shard's entry removed and its split's counts made to agree: index.json agrees with itself
            "dropped",
            lambda m: (
                m["splits"]["val"].update(
                    shards=1,
                    samples=m["splits"]["val"]["samples"] - m["shards"].pop()["samples"],
                    urls="val-000000.tar",
                ),
                m.update(samples=m["samples"] - 10),
            ),
            r"samples.npz and the index.json beside it disagree: 10 row\(s\) name a shard past the 11 that index.json "
            r"lists \(first: row 110, sample 's\d+', shard 11\)",
        ),
        (
            "recounted",
            lambda m: m["shards"][4].update(samples=9),
            r"samples.npz and the index.json beside it disagree: index.json's shards\[4\] \(train-000004.tar\) "
            r"holds 9 samples, samples.npz has 10 rows for shard 4",
        ),
    ]:
        bad = tmp_path / name
        shutil.copytree(folder, bad)
        meta = json.loads((bad / "index.json").read_text())
        assert [e["name"] for e in meta["shards"]][-3:] == ["train-000009.tar", "val-000000.tar", "val-000001.tar"]
        edit(meta)
        (bad / "index.json").write_text(json.dumps(meta))
        for split in ("train", "val"):
            with pytest.raises(IndexFormatError, match=rf"{bad}/{match}.*wds-tools verify lists"):
                make_loader(bad, batch_size=4, train=split == "train", num_workers=0, split=split)


def test_reader_option_errors(folder, tmp_path):
    with pytest.raises(OptionError, match="reader='fast': expected 'auto', 'index' or 'stream'"):
        make_loader(folder, batch_size=2, train=True, reader="fast")
    with pytest.raises(OptionError, match="subset needs the index reader; drop reader='stream'"):
        make_loader(folder, batch_size=2, train=True, reader="stream", subset=0.5)
    with pytest.raises(OptionError, match="class_weights needs the index reader, but no index.json lists these"):
        make_loader(f"pipe:cat {folder}/train-000000.tar", batch_size=2, train=True, class_weights="balanced")
    with pytest.raises(OptionError, match="selects no sample"):
        make_loader(folder, batch_size=2, train=True, subset=lambda c: c["label"] < 0)
    with pytest.raises(OptionError, match="epoch_batches=99: a rank has only"):
        make_loader(folder, batch_size=2, train=True, epoch_batches=99)


def test_check_samples_catches_a_flipped_pixel(folder, tmp_path):
    import shutil

    bad = tmp_path / "flipped"
    shutil.copytree(folder, bad)
    idx = train_index(bad)
    r = int(np.flatnonzero(idx.shard == 3)[1])
    at = int(idx.offset[r]) + 128 + 77  # a pixel byte of that sample
    data = bytearray((bad / "train-000003.tar").read_bytes())
    data[at] ^= 0x01
    (bad / "train-000003.tar").write_bytes(bytes(data))
    kw = dict(batch_size=4, train=False, num_workers=0, split="train")
    assert sum(len(b[1]) for b in make_loader(bad, **kw)) == len(idx)  # unchecked: read as it is
    with pytest.raises(
        ShardError,
        match=rf"train-000003.tar: byte {int(idx.offset[r])}: sample "
        rf"'{idx.key_str(r)}': its pixels do not match their checksum",
    ):
        list(make_loader(bad, check_samples=True, **kw))
    assert sum(len(b[1]) for b in make_loader(folder, check_samples=True, **kw)) == len(idx)


def test_a_metadata_column_named_label_is_named_in_the_subset_message(tmp_path):
    from conftest import make_images, write_manifest

    from wds_tools.convert import convert

    rows = make_images(tmp_path / "c", 8)
    for i, r in enumerate(rows):
        r["dx"], r["label"], r["split"] = r["label"], f"grade{i % 2}", "train"
    convert(
        write_manifest(tmp_path / "c" / "m.csv", rows, fields=("key", "path", "dx", "label", "split")),
        version="v1",
        size=S,
        out=tmp_path / "out",
        label="dx",
        workers=1,
        progress=False,
    )
    folder = tmp_path / "out" / "v1" / str(S)
    assert len(ShardIndexDataset(folder, subset={"meta.label": ["grade0"]})) == 4  # reachable, under another name
    with pytest.raises(OptionError, match=r"meta\.label"):
        ShardIndexDataset(folder, subset={"label": ["grade0"]})
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide" / "clinical.md").read_text()
    assert "meta.<" in guide or "meta.label" in guide
