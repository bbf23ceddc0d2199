"""training_adapter.config: the dataset block of YAML and TOML trainer configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_images, write_manifest

from training_adapter import AugmentConfig, load_config
from wds_tools.convert import convert
from wds_tools.errors import OptionError

YAML = """\
model: {name: resnet50}
dataset:
  train_urls: shards/v1/16/train-{000000..000002}.tar
  val_urls: shards/v1/16
  batch_size: 2
  num_workers: 0
  seed: 4
  shuffle_buffer: 0
  augment:
    crop_scale: [0.5, 1.0]
    vflip: 0.0
    affine_p: 0.3
"""

TOML = """\
[model]
name = "resnet50"

[dataset]
train_urls = "shards/v1/16"
val_urls = ["shards/v1/16/index.json"]
batch_size = 2
num_workers = 0

[dataset.augment]
rot90 = false
brightness = 0.1
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cfg")
    rows = make_images(root / "c", 16)
    for i, r in enumerate(rows):
        r["split"] = "val" if i % 4 == 0 else "train"
    convert(
        write_manifest(root / "c" / "m.csv", rows),
        version="v1",
        size=16,
        out=root / "shards",
        shard_size=4,
        workers=1,
        progress=False,
    )
    return root


def test_yaml(root):
    (root / "t.yaml").write_text(YAML)
    cfg = load_config(root / "t.yaml")
    ds = cfg.dataset
    assert cfg.raw["model"] == {"name": "resnet50"}
    assert ds.train_urls == str(root / "shards/v1/16/train-{000000..000002}.tar")  # relative to the config
    assert ds.loader == {"batch_size": 2, "num_workers": 0, "seed": 4, "shuffle_buffer": 0}
    assert ds.augment == AugmentConfig(crop_scale=(0.5, 1.0), vflip=0.0, affine_p=0.3)
    images, labels = next(iter(ds.train_loader()))
    assert images.shape == (2, 3, 16, 16)
    assert sum(len(b[1]) for b in ds.val_loader()) == 4


def test_toml(root):
    (root / "t.toml").write_text(TOML)
    ds = load_config(root / "t.toml").dataset
    assert ds.val_urls == [str(root / "shards/v1/16/index.json")]
    assert ds.augment.rot90 is False and ds.augment.brightness == 0.1
    assert len(ds.train_loader()) == 12 // 2


@pytest.mark.parametrize(
    "text, suffix, msg",
    [
        ("model: {}\n", ".yaml", r"no 'dataset' block"),
        ("dataset: {val_urls: x}\n", ".yaml", r"dataset.train_urls is missing"),
        ("dataset: {train_urls: x, batchsize: 3}\n", ".yaml", r"unknown dataset setting 'batchsize'"),
        ("dataset: {train_urls: x, augment: {hflip: 3}}\n", ".yaml", r"augment.hflip=3"),
        ("dataset: [\n", ".yaml", r"not valid YAML"),
        ("[dataset\n", ".toml", r"not valid TOML"),
        ("{}", ".json", r"unknown extension '.json'"),
    ],
)
def test_errors(tmp_path, text, suffix, msg):
    p = tmp_path / f"c{suffix}"
    p.write_text(text)
    with pytest.raises(OptionError, match=msg):
        load_config(p)


def test_missing_file(tmp_path):
    with pytest.raises(OptionError, match="no such file"):
        load_config(tmp_path / "nope.yaml")


def test_urls_pass_through(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("dataset: {train_urls: 'pipe:cat a.tar', val_urls: 'http://h/v-{0..1}.tar'}\n")
    ds = load_config(p).dataset
    assert ds.train_urls == "pipe:cat a.tar" and ds.val_urls == "http://h/v-{0..1}.tar"


def test_metadata_reaches_both_loaders(root):
    """dataset.metadata goes to make_loader: width (samples.npz's own column) comes with every batch, and a
    column this index lacks is refused, naming it."""
    (root / "m.yaml").write_text(
        "dataset:\n  train_urls: shards/v1/16\n  val_urls: shards/v1/16\n  batch_size: 2\n"
        "  num_workers: 0\n  metadata: [width]\n"
    )
    ds = load_config(root / "m.yaml").dataset
    for loader in (ds.train_loader(), ds.val_loader()):
        images, labels, meta = next(iter(loader))
        assert meta["width"].tolist() == [96.0, 96.0]  # make_images writes 96 x 72 JPEGs
    (root / "m.yaml").write_text("dataset:\n  train_urls: shards/v1/16\n  batch_size: 2\n  metadata: [age]\n")
    with pytest.raises(OptionError, match="'age' is not a column of this index"):
        load_config(root / "m.yaml").dataset.train_loader()


def test_a_yaml_config_without_pyyaml_names_the_package_to_install(tmp_path, monkeypatch):
    import sys

    from wds_tools.errors import ExtraNotInstalledError

    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    (tmp_path / "t.yaml").write_text("dataset: {train_urls: x}\n")
    with pytest.raises(
        ExtraNotInstalledError, match=r"needs pyyaml: pip install pyyaml==6\.0\.3 \(part of the 'train'"
    ):
        load_config(tmp_path / "t.yaml")
