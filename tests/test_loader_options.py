"""LoaderOptions: checked once on creation, what applies in training and evaluation, and make_loader
building them from its keywords."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import convert_images

from training_adapter import AugmentConfig, LoaderOptions, make_loader
from training_adapter.indexed import IndexedDataset
from training_adapter.streaming import StreamingDataset
from wds_tools.errors import OptionError

S = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """40 train samples in 4 shards of 10."""
    return convert_images(tmp_path_factory.mktemp("options"), 40, size=S, shard_size=10, val_fraction=0.0)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"batch_size": 0}, r"^batch_size=0: expected a positive integer$"),
        ({"batch_size": True}, r"^batch_size=True: expected a positive integer$"),
        ({"batch_size": 2.0}, r"^batch_size=2\.0: expected a positive integer$"),
        ({"on_error": "ignore"}, r"^on_error='ignore': expected 'raise' or 'skip'$"),
        ({"check_samples": "pixels"}, r"^check_samples='pixels': expected 'labels' \(the default\), True"),
        ({"shuffle_buffer": -1}, r"^shuffle_buffer=-1: expected a number of samples >= 0$"),
        ({"reader": "tar"}, r"^reader='tar': expected 'auto', 'index' or 'stream'$"),
    ],
)
def test_each_bad_option_is_refused_on_creation(kw, match):
    with pytest.raises(OptionError, match=match):
        LoaderOptions(**{"batch_size": 4, "train": True, **kw})


def test_options_are_frozen():
    o = LoaderOptions(batch_size=4, train=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.batch_size = 8  # type: ignore[misc]


def test_evaluation_neither_augments_nor_shuffles_and_keeps_the_last_batch():
    cfg = AugmentConfig(size=8)
    ev = LoaderOptions(batch_size=4, train=False, augment=cfg, device_augment=True, shuffle_buffer=50)
    assert (ev.augmentation, ev.on_device, ev.buffer, ev.shuffles_shards, ev.drops_last) == (
        None,
        False,
        0,
        False,
        False,
    )
    tr = LoaderOptions(batch_size=4, train=True, augment=cfg, device_augment=True, shuffle_buffer=50)
    assert (tr.augmentation, tr.on_device, tr.buffer, tr.shuffles_shards, tr.drops_last) == (cfg, True, 50, True, True)
    assert LoaderOptions(batch_size=4, train=True).augmentation == AugmentConfig()  # the default settings
    assert LoaderOptions(batch_size=4, train=True, drop_last=False).drops_last is False
    assert LoaderOptions(batch_size=4, train=False, drop_last=True).drops_last is True


def test_needs_index_names_the_options_only_the_index_reader_takes():
    assert LoaderOptions(batch_size=4, train=True).needs_index == []
    o = LoaderOptions(batch_size=4, train=True, subset=0.5, class_weights="balanced", check_samples=True)
    assert o.needs_index == ["subset", "class_weights", "check_samples=True"]


def test_make_loader_passes_its_keywords_as_options(folder):
    ld = make_loader(
        folder,
        batch_size=4,
        train=True,
        num_workers=0,
        seed=3,
        augment={"size": 8},
        drop_last=False,
        return_keys=True,
        subset=0.5,
    )
    assert isinstance(ld.dataset, IndexedDataset)
    assert ld.dataset.options == LoaderOptions(
        batch_size=4, train=True, seed=3, augment=AugmentConfig(size=8), drop_last=False, return_keys=True, subset=0.5
    )
    st = make_loader(folder, batch_size=4, train=False, num_workers=0, reader="stream", split="train")
    assert isinstance(st.dataset, StreamingDataset) and st.dataset.options.shuffle_buffer == 1000


def test_a_subset_function_reaches_spawned_workers(folder):
    """The options the dataset holds carry the subset; a function there (a lambda does not pickle)
    is already applied and left behind when a spawned worker gets the dataset."""
    kw = dict(batch_size=4, train=True, seed=1, return_keys=True, subset=lambda c: c["label"] % 2 == 0)
    want = [(k, int(lab)) for b in make_loader(folder, num_workers=0, **kw) for k, lab in zip(b[-1], b[1])]
    ld = make_loader(folder, num_workers=1, multiprocessing_context="spawn", **kw)
    assert not ld.dataset.copies_only  # CPU augmentation: a worker process, not a reader thread
    got = [(k, int(lab)) for b in ld for k, lab in zip(b[-1], b[1])]
    assert got == want and want
