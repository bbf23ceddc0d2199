"""LoaderOptions: checked once on creation, what applies in training and evaluation, and make_loader
building them from its keywords."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
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
        ({"batch_size": True}, r"^batch_size=True: a bool; expected a positive integer$"),
        ({"batch_size": 2.0}, r"^batch_size=2\.0: a float; expected a positive integer$"),
        ({"on_error": "ignore"}, r"^on_error='ignore': expected 'raise' or 'skip'$"),
        ({"check_samples": "pixels"}, r"^check_samples='pixels': expected 'labels' \(the default\), True"),
        ({"shuffle_buffer": -1}, r"^shuffle_buffer=-1: expected a number of samples >= 0$"),
        ({"reader": "tar"}, r"^reader='tar': expected 'auto', 'index' or 'stream'$"),
    ],
)
def test_each_bad_option_is_refused_on_creation(kw, match):
    with pytest.raises(OptionError, match=match):
        LoaderOptions(**{"batch_size": 4, "train": True, **kw})


@pytest.mark.parametrize(
    "seed, match",
    [
        (True, r"^seed=True: a bool; "),
        (np.True_, r"^seed=np.True_: a numpy bool; "),
        (torch.tensor(True), r"^seed=tensor\(True\): a Tensor of torch.bool; "),
        (3.0, r"^seed=3.0: a float; "),
        (np.float64(3), r"^seed=np.float64\(3.0\): a numpy float64; "),
        (torch.tensor(3.0), r"^seed=tensor\(3.\): a Tensor of torch.float32; "),
        ("3", r"^seed='3': a str; "),
        (None, r"^seed=None: a NoneType; "),
        (torch.tensor([3]), r"^seed=tensor\(\[3\]\): a Tensor of torch.int64, shape \(1,\); "),
        (-1, r"^seed=-1: "),
        (np.int64(-1), r"^seed=np.int64\(-1\): "),
        (2**63, r"^seed=9223372036854775808: "),
    ],
)
def test_a_seed_that_is_not_an_integer_of_the_states_range_is_refused(seed, match):
    """Issue 38, point 10: refused by name when the options are made (before: '3' and 2**63 trained and
    their states were refused, -1 and 3.0 failed at the first batch with numpy's error)."""
    with pytest.raises(OptionError, match=match + r"expected an integer from 0 to 2\*\*63 - 1$"):
        LoaderOptions(batch_size=4, train=True, seed=seed)


def test_an_integer_seed_of_any_kind_is_a_plain_int_and_its_state_loads(folder):
    """np.int64(3) trained, but its state failed json.dumps and a loader with seed=3 refused it; a 0-d
    tensor gave "len() of a 0-d tensor". Each is the int 3: the same batches, one state that loads."""
    import json

    kw = dict(batch_size=4, train=True, num_workers=0, return_keys=True)
    want = [b[-1] for b in make_loader(folder, seed=3, **kw)]
    for seed in (np.int64(3), np.uint8(3), np.array(3), torch.tensor(3), 2**63 - 1):
        ld = make_loader(folder, seed=seed, **kw)
        assert type(ld.dataset.options.seed) is int and ld.dataset.options.seed == int(seed)
        it = iter(ld)
        head = [next(it)[-1]]
        state = json.loads(json.dumps(ld.state_dict()))
        del it
        again = make_loader(folder, seed=int(seed), **kw)
        again.load_state_dict(state)
        rest = [b[-1] for b in again]
        if int(seed) == 3:
            assert head + rest == want
        else:
            assert len(head + rest) == len(want) and sorted(sum(head + rest, [])) == sorted(sum(want, []))


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
        batch_size=4,
        train=True,
        num_workers=0,
        seed=3,
        augment=AugmentConfig(size=8),
        drop_last=False,
        return_keys=True,
        subset=0.5,
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


# --- each option declared once: the signature, the checks, the config keys and the resume settings from it
def test_make_loader_takes_the_declared_options_with_their_defaults():
    """make_loader's signature is written out (typed, documented); this holds it to the declaration:
    the same keywords in the same order, the same defaults, each documented under Args."""
    import inspect

    from training_adapter.loader import make_loader as front

    params = list(inspect.signature(front).parameters.values())[1:]  # urls first
    fields = {f.name: f for f in dataclasses.fields(LoaderOptions)}
    assert [p.name for p in params] == list(fields)
    for p in params:
        f = fields[p.name]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, p.name
        assert p.default == (inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default), p.name
    doc = inspect.getdoc(front) or ""
    assert [n for n in fields if f"\n    {n}: " not in doc] == []


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(LoaderOptions)])
def test_every_option_is_checked_on_creation_by_name(name):
    """A value of no kind the option takes is refused when the options are made, naming the option."""
    with pytest.raises(OptionError, match=rf"^{name}=<object object at "):
        LoaderOptions(**{"batch_size": 4, "train": True, name: object()})


INTEGERS = [f.name for f in dataclasses.fields(LoaderOptions) if str(f.type).startswith("int")]


@pytest.mark.parametrize("name", INTEGERS)
def test_integer_options_take_numpy_integers_as_ints_and_refuse_bools(name):
    f = {f.name: f for f in dataclasses.fields(LoaderOptions)}[name]
    good = 4 if f.default in (None, dataclasses.MISSING) else f.default
    base = {"batch_size": 4, "train": True}
    got = getattr(LoaderOptions(**{**base, name: np.int64(good)}), name)
    assert type(got) is int and got == good
    for bad in (True, np.True_, float(good), str(good)):
        with pytest.raises(OptionError, match=rf"^{name}=.*: a (numpy )?(bool|float|str); expected "):
            LoaderOptions(**{**base, name: bad})


def test_flags_take_numpy_bools_and_choices_refuse_lookalikes():
    o = LoaderOptions(batch_size=4, train=np.True_, return_keys=np.False_, drop_last=None)
    assert (type(o.train), type(o.return_keys), o.drop_last) == (bool, bool, None)
    with pytest.raises(OptionError, match=r"^normalize=1: expected True or False$"):
        LoaderOptions(batch_size=4, train=True, normalize=1)
    with pytest.raises(OptionError, match=r"^check_samples=1: expected 'labels' \(the default\)"):
        LoaderOptions(batch_size=4, train=True, check_samples=1)  # 1 == True, but not the flag
    assert LoaderOptions(batch_size=4, train=True, shuffle_buffer=None).shuffle_buffer == 1000  # None: the default
    assert LoaderOptions(batch_size=4, train=True, mean=np.array([0.5, 0.5, 0.5])).mean == (0.5, 0.5, 0.5)


def test_config_keys_and_resume_settings_are_the_declared_ones(folder):
    from training_adapter.config import LOADER_KEYS
    from training_adapter.options import declared

    options = declared(LoaderOptions)
    assert LOADER_KEYS == {n for n, o in options.items() if o.config}
    assert {"train", "augment", "transform", "batch_transform", "multiprocessing_context"}.isdisjoint(LOADER_KEYS)
    order = [n for n, o in options.items() if o.order]
    # those a state recorded before the declaration, at least (a new one is added by declaring it)
    assert set(order) >= {"seed", "batch_size", "train", "shuffle_shards", "shuffle_buffer"} | {
        "drop_last",
        "resampled",
        "epoch_batches",
    }
    for reader in ("index", "stream"):
        ld = make_loader(folder, batch_size=4, train=True, num_workers=0, seed=5, reader=reader, shuffle_buffer=7)
        state = ld.state_dict()
        assert {n: state[n] for n in order} == {n: getattr(ld.dataset.options, n) for n in order}
