"""mapstyle: ShardIndexDataset, one sample at a time by position, with any sampler."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import convert_images
from oracle import read_stored

from training_adapter import ShardIndexDataset
from wds_tools.errors import OptionError

S = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """120 samples in 3 classes (a, b, c by row), train shards of 10, every 6th row in val."""
    return convert_images(tmp_path_factory.mktemp("mapstyle"), 120, size=S, shard_size=10, val_every=6)


def test_map_style_dataset_against_stock_webdataset(folder):
    import webdataset as wds

    ds = ShardIndexDataset(folder)
    ref = {
        s["__key__"]: (s["npy"], int(s["cls"]))
        for s in wds.WebDataset(
            sorted(str(p) for p in folder.glob("train-*.tar")), shardshuffle=False, empty_check=False
        ).decode()
    }
    assert len(ds) == len(ref) and sorted(ds.keys) == sorted(ref)
    for i in range(len(ds)):
        image, label, key, meta = ds[i]
        assert image.dtype == torch.uint8 and image.shape == (3, S, S)
        assert np.array_equal(image.permute(1, 2, 0).numpy(), ref[key][0]) and label == ref[key][1]
        assert meta["width"] == 96 and meta["height"] == 72
    image, *_ = ds[-1]
    image.fill_(0)  # the caller owns its copy: the shard is untouched
    assert np.array_equal(ds[-1][0].permute(1, 2, 0).numpy(), ref[ds[-1][2]][0])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_map_style_dataset_with_samplers(folder):
    ds = ShardIndexDataset(folder, subset={"label": ["a", "c"]})
    assert set(ds.labels.tolist()) == {0, 2}
    weights = np.where(ds.labels == 0, 1.0, 3.0)
    sampler = torch.utils.data.WeightedRandomSampler(
        torch.as_tensor(weights), 400, generator=torch.Generator().manual_seed(0)
    )
    dl = torch.utils.data.DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2)
    labels = torch.cat([b[1] for b in dl])
    assert len(labels) == 400 and (labels == 2).float().mean() > 0.65  # weight 3 vs 1: about 0.75
    seen = []
    for rank in range(2):
        ds_sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=1)
        seen.append({k for b in torch.utils.data.DataLoader(ds, batch_size=8, sampler=ds_sampler) for k in b[2]})
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(ds.keys)
    with pytest.raises(OptionError, match="needs shards listed in an index.json"):
        ShardIndexDataset(f"pipe:cat {folder}/train-000000.tar")


def test_index_json_path_and_pattern_resolve_to_the_same_rows(folder):
    a = ShardIndexDataset(folder / "index.json")
    b = ShardIndexDataset(str(folder / "train-{000000..000002}.tar"), allow_partial=True)
    meta = json.loads((folder / "index.json").read_text())
    counts = {s["name"]: s["samples"] for s in meta["shards"]}
    assert len(a) == sum(n for name, n in counts.items() if name.startswith("train-"))
    assert len(b) == sum(counts[f"train-{i:06d}.tar"] for i in range(3))
    assert set(b.keys) == set(read_stored([folder / f"train-{i:06d}.tar" for i in range(3)])) < set(a.keys)


def test_map_style_meta_holds_the_csv_metadata(tmp_path):
    """ds[i]'s meta: the manifest's metadata columns, typed (age a float, strings as text), None where the CSV
    cell is empty; read back against the CSV with the csv module."""
    import csv

    from test_indexed import ham_with_gaps

    from wds_tools.convert import convert

    manifest = ham_with_gaps(tmp_path / "ham")
    convert(
        manifest,
        version="v1",
        size=16,
        out=tmp_path / "out",
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        val_fraction=0.25,
        workers=1,
        progress=False,
    )
    with open(manifest, encoding="utf-8", newline="") as f:
        rows = {r["image_id"]: r for r in csv.DictReader(f)}
    seen = []
    for split in ("train", "val"):
        ds = ShardIndexDataset(tmp_path / "out" / "v1" / "16", split=split)
        assert ds.classes == ["bcc", "bkl", "mel", "nv"]
        for i in range(len(ds)):
            _, label, key, meta = ds[i]
            r = rows[key]
            assert ds.classes[label] == r["dx"]
            assert meta["age"] == (float(r["age"]) if r["age"] else None) and type(meta["age"]) in (float, type(None))
            for name in ("lesion_id", "dx_type", "sex", "localization"):
                assert meta[name] == (r[name] or None), (key, name)
            assert meta["width"] == 40 and meta["height"] == 30
            seen.append(key)
    assert sorted(seen) == sorted(rows)
