"""indexed: the index reader's batches carry the metadata columns asked for (make_loader(metadata=...)),
checked against the manifest CSV read with the csv module and the JPEGs' sizes read with PIL."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_ham
from PIL import Image

from training_adapter import make_loader
from wds_tools.errors import OptionError

COLUMNS = ["age", "sex", "localization", "width"]


def ham_with_gaps(root: Path) -> Path:
    """A HAM-shaped manifest (ages missing every 5th row) plus one row whose age and localization are empty."""
    manifest = write_ham(root, [3, 1, 2, 4, 1, 1, 2, 3, 1, 2, 2, 1])
    shutil.copy(root / "images" / "ISIC_0000000.jpg", root / "images" / "ISIC_0000099.jpg")
    with open(manifest, "a", encoding="utf-8", newline="") as f:
        csv.writer(f).writerow(["HAM_0000099", "ISIC_0000099", "nv", "histo", "", "female", ""])
    return manifest


@pytest.fixture(scope="module")
def ham(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """(the converted folder, the CSV's rows by image_id, each with the source JPEG's width)."""
    from wds_tools.convert import convert

    root = tmp_path_factory.mktemp("ham")
    manifest = ham_with_gaps(root / "ham")
    convert(
        manifest,
        version="v1",
        size=16,
        out=root / "out",
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        group="lesion_id",
        val_fraction=0.25,
        workers=1,
        progress=False,
    )
    with open(manifest, encoding="utf-8", newline="") as f:
        rows = {r["image_id"]: r for r in csv.DictReader(f)}
    for key, r in rows.items():
        with Image.open(root / "ham" / "images" / f"{key}.jpg") as im:
            r["width"] = im.size[0]
    return root / "out" / "v1" / "16", rows


def check(meta: dict, keys: list[str], rows: dict[str, dict]) -> None:
    """Each column's values are the CSV's: ages float32 with NaN where empty, strings with None where empty."""
    assert set(meta) == set(COLUMNS)
    assert meta["age"].dtype == torch.float32 and meta["age"].shape == (len(keys),)
    assert meta["width"].dtype == torch.float32
    for i, key in enumerate(keys):
        r = rows[key]
        age = float(meta["age"][i])
        assert math.isnan(age) if r["age"] == "" else age == float(r["age"]), (key, age, r["age"])
        assert meta["sex"][i] == (r["sex"] or None)
        assert meta["localization"][i] == (r["localization"] or None)
        assert float(meta["width"][i]) == r["width"]


@pytest.mark.parametrize("train, workers", [(False, 0), (False, 2), (True, 2)])
def test_metadata_in_batches_equal_the_csv(ham, train, workers):
    folder, rows = ham
    seen = []
    for split in ("train", "val"):
        loader = make_loader(
            folder,
            batch_size=4,
            train=train,
            split=split,
            metadata=COLUMNS,
            return_keys=True,
            num_workers=workers,
            drop_last=False,
        )
        for images, _labels, meta, keys in loader:
            assert images.shape[0] == len(keys)
            check(meta, keys, rows)
            seen += keys
    assert sorted(seen) == sorted(rows)  # every row of the CSV, the empty-cell one among them
    assert any(rows[k]["age"] == "" for k in seen) and any(rows[k]["localization"] == "" for k in seen)


def test_metadata_with_device_augment_comes_after_the_params(ham):
    folder, rows = ham
    images, labels, params, meta, keys = next(
        iter(
            make_loader(
                folder, batch_size=4, train=True, num_workers=0, device_augment=True, metadata=COLUMNS, return_keys=True
            )
        )
    )
    assert params.shape == (4, 14)
    check(meta, keys, rows)


def test_metadata_names_are_checked(ham, tmp_path):
    folder, _ = ham
    with pytest.raises(OptionError, match=r"'weight' is not a column of this index; it has lesion_id, dx_type, age"):
        make_loader(folder, batch_size=4, train=True, metadata=["age", "weight"])
    with pytest.raises(OptionError, match="metadata needs the index reader"):
        make_loader(folder, batch_size=4, train=True, metadata=["age"], reader="stream")
    with pytest.raises(OptionError, match="expected a list of column names"):
        make_loader(folder, batch_size=4, train=True, metadata="age")


def test_loader_classes_are_the_index_classes(ham):
    folder, _ = ham
    loader = make_loader(folder, batch_size=4, train=True, num_workers=0)
    assert loader.classes == json.loads((folder / "index.json").read_text())["classes"]
    assert sorted(loader.classes) == ["bcc", "bkl", "mel", "nv"]
