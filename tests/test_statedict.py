"""What ``load_state_dict`` refuses (training_adapter/statedict.py; issue 32, points 1 and 3).

Point 1: a state loaded into a loader whose settings would order the samples differently (train,
shuffle, class weights, batch size, shuffle buffer, drop_last, ...) or that reads another dataset
(a re-conversion with the same shard count) is refused, naming the setting and both values; a
setting that does not change the order (the index reader's shuffle_buffer size, equal class shares,
workers, a copy of the folder) is accepted and the rest is exactly the uninterrupted run's.
Point 3: a state edited by hand is refused naming the field, never run as a shortened or empty
epoch; fuzzed states either fail so or continue exactly where the state says.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import convert_images
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from shardkit import build_dataset
from test_eval_coverage import tar_keys

from training_adapter import make_loader
from wds_tools.errors import OptionError

B = 8
SHARDS, PER_SHARD = 6, 20  # 120 train samples: 15 batches of 8, none left over


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_dataset(
        tmp_path_factory.mktemp("state"),
        {"train": [[(j + t) % 3 for t in range(PER_SHARD)] for j in range(SHARDS)]},
        size=8,
    )


def _keys(ld) -> list[str]:
    return [k for b in ld for k in b[-1]]


def _stopped(folder: Path, stop: int, **opts) -> tuple[list[str], dict]:
    """The keys of the first ``stop`` batches, and the state then (through JSON, as a checkpoint keeps it)."""
    ld = make_loader(folder, return_keys=True, **{"num_workers": 0, **opts})
    it = iter(ld)
    head = [k for _ in range(stop) for k in next(it)[-1]]
    state = json.loads(json.dumps(ld.state_dict()))
    del it
    return head, state


def _resumed(folder: Path, state: dict, **opts) -> list[str]:
    ld = make_loader(folder, return_keys=True, **{"num_workers": 0, **opts})
    ld.load_state_dict(state)
    return _keys(ld)


TRAIN = dict(train=True, batch_size=B)
STREAM = dict(train=True, batch_size=B, reader="stream", shuffle_buffer=100)


# --- point 1: every setting that decides the order is in the state and checked ----------------------------
@pytest.mark.parametrize(
    "saved,changed,match",
    [
        # the index-reader cases
        (TRAIN, dict(train=False, split="train"), r"train=True, this loader has train=False"),
        (
            TRAIN,
            dict(shuffle_shards=False, shuffle_buffer=0),
            r"shuffle_shards=True, shuffle_buffer=1000 \(samples shuffled\), this loader has "
            r"shuffle_shards=False, shuffle_buffer=0 \(index order\)",
        ),
        (TRAIN, dict(class_weights="balanced"), r"class_weights=None .*this loader has class_weights='balanced'"),
        # the others that decide which sample comes when
        (TRAIN, dict(seed=5), r"seed=0, this loader has seed=5"),
        (TRAIN, dict(batch_size=4), r"batch_size=8, this loader has batch_size=4"),
        (TRAIN, dict(drop_last=False), r"drop_last=None \(True in training\), this loader has drop_last=False"),
        (TRAIN, dict(resampled=True), r"resampled=False, this loader has resampled=True"),
        (TRAIN, dict(epoch_batches=10), r"epoch_batches=None, this loader has epoch_batches=10"),
        (dict(TRAIN, class_weights={"a": 1}), dict(class_weights={"a": 1, "b": 1}), r"class_weights=\{'a': 1.0\}"),
        # the streaming cases, and the rest
        (STREAM, dict(batch_size=1), r"batch_size=8, this loader has batch_size=1"),
        (STREAM, dict(shuffle_buffer=0), r"shuffle_buffer=100, this loader has shuffle_buffer=0"),
        (STREAM, dict(shuffle_shards=False), r"shuffle_shards=True, this loader has shuffle_shards=False"),
        (STREAM, dict(train=False, split="train"), r"train=True, this loader has train=False"),
        (STREAM, dict(drop_last=False), r"drop_last=None \(True in training\), this loader has drop_last=False"),
    ],
)
def test_a_setting_that_orders_the_samples_otherwise_is_refused_naming_both_values(folder, saved, changed, match):
    _, state = _stopped(folder, 3, **saved)
    with pytest.raises(OptionError, match=r"^load_state_dict: the state was saved with " + match):
        _resumed(folder, state, **{**saved, **changed})


@pytest.mark.parametrize(
    "saved,changed",
    [
        (TRAIN, dict(shuffle_buffer=500)),  # the index reader shuffles the samples for any buffer > 1
        (TRAIN, dict(num_workers=2)),
        (dict(TRAIN, subset=0.5, class_weights="balanced", device_augment=True), dict(num_workers=2)),
        (TRAIN, dict(augment=False, check_samples=True)),  # pixels and checks, not the order
        (dict(TRAIN, class_weights="balanced"), dict(class_weights={"a": 2, "b": 2, "c": 2})),  # equal shares
        (dict(train=False, batch_size=B, split="train"), dict(shuffle_buffer=0, shuffle_shards=False)),  # eval
        (dict(STREAM, train=False, split="train"), dict(shuffle_buffer=7)),  # eval streams with no buffer
    ],
)
def test_a_setting_that_keeps_the_order_is_accepted_and_exact(folder, saved, changed):
    """The rest is the one the saved settings give; with the index reader, the uninterrupted run's."""
    full = _keys(make_loader(folder, return_keys=True, num_workers=0, **saved))
    head, state = _stopped(folder, 3, **saved)
    rest = _resumed(folder, state, **{**saved, **changed})
    assert rest == _resumed(folder, state, **saved)
    assert head + rest == full if saved.get("reader") != "stream" else not set(head) & set(rest)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path, Path]:
    """One corpus converted twice (center-crop, then squash: other pixels, the same keys and shard
    counts), and a copy of the first folder."""
    root = tmp_path_factory.mktemp("reconverted")
    one = convert_images(root / "one", 24, size=16, shard_size=4, val_every=5)
    two = convert_images(root / "two", 24, size=16, shard_size=4, val_every=5, resize="squash")
    copy = Path(shutil.copytree(one.parents[1], root / "copy")) / one.relative_to(one.parents[1])
    return one, two, copy


@pytest.mark.parametrize("reader", ["index", "stream"])
def test_a_re_converted_dataset_with_the_same_shard_count_is_refused(converted, reader):
    one, two, copy = converted
    assert tar_keys(one, "train") == tar_keys(two, "train") and len(list(one.glob("train-*"))) == len(
        list(two.glob("train-*"))
    )
    opts = dict(train=True, batch_size=2, reader=reader, shuffle_buffer=3)
    full = _keys(make_loader(one, return_keys=True, num_workers=0, **opts))
    head, state = _stopped(one, 2, **opts)
    with pytest.raises(OptionError, match=r"shards_xxh3=0x[0-9a-f]{16}, this loader has 0x[0-9a-f]{16}: .*re-conv"):
        _resumed(two, state, **opts)
    rest = _resumed(copy, state, **opts)  # the same bytes elsewhere: the same dataset
    if reader == "index":
        assert head + rest == full
    else:
        assert not set(head) & set(rest) and set(head) | set(rest) <= set(tar_keys(one, "train"))


# --- point 3: a state edited by hand -------------------------------------------------------------------
INDEX_EDITS = [
    ("position", -40, r"position=-40: expected an integer from 0 to"),
    ("position", 10**9, r"position=1000000000: expected from 0 to 119 \(end=120\)"),
    ("position", None, r"position=None: expected an integer"),
    ("position", "24", r"position='24': expected an integer"),
    ("position", 24.0, r"position=24.0: expected an integer"),
    ("position", 120, r"position=120: expected from 0 to 119 \(end=120\); a state at an epoch's end names the next"),
    ("end", 10**9, r"end=1000000000: expected at most 120, the samples of the epoch"),
    ("end", 0, r"end=0: expected an integer from 1"),
    ("end", 10, r"position=24: expected from 0 to 9 \(end=10\)"),
    ("draws", -3, r"draws=-3: expected an integer from 1"),
    ("draws", 16, r"draws=16: expected None \(only resampled=True draws\)"),
    ("epoch", -1, r"epoch=-1: expected an integer from 0"),
    ("epoch", True, r"epoch=True: expected an integer"),
    ("epoch", 2**63, r"epoch=9223372036854775808: expected an integer from 0 to 9223372036854775807"),
    ("world", 0, r"world=0: expected an integer from 1 to 65536"),
    ("samples", None, r"samples=None: expected an integer"),
    ("rows_xxh3", "x", r"rows_xxh3='x': expected an integer"),
    ("rows_xxh3", 1, r"saved with rows_xxh3=0x0000000000000001, this loader has 0x"),
    ("samples", 119, r"saved with samples=119, this loader has 120"),
    ("left_out", -1, r"left_out=-1: expected an integer from 0"),
    ("left_out", 10**6, r"left_out=1000000: expected at most 120"),
    ("batch_size", 0, r"batch_size=0: expected a positive integer"),  # the settings: by their options' checks
    ("train", "yes", r"train='yes': expected True or False"),
    ("drop_last", "no", r"drop_last='no': expected True, False or None"),
    ("shuffle_buffer", -1, r"shuffle_buffer=-1: expected a number of samples >= 0"),
    ("epoch_batches", 0, r"epoch_batches=0: expected a number of batches >= 1, or None"),
    ("class_weights", 3, r"class_weights=3: expected None, 'balanced' or a \{class: weight\} dict"),
    ("seed", None, r"seed=None: a NoneType; expected an integer"),
    ("seed", -1, r"seed=-1: expected an integer from 0 to"),  # no loader takes it (options.MAX_SEED)
    ("version", 1, r"state version 1; this loader reads version 2"),
    ("version", "2", r"state version '2'"),
    ("version", 2.0, r"state version 2.0"),
    ("kind", "other", r"expected the dict loader.state_dict\(\) returned"),
]


@pytest.mark.parametrize("field,value,match", INDEX_EDITS)
def test_an_index_state_edited_by_hand_is_refused_naming_the_field(folder, field, value, match):
    _, state = _stopped(folder, 3, **TRAIN)
    assert (state["position"], state["end"], state["draws"]) == (24, 120, None)
    ld = make_loader(folder, return_keys=True, num_workers=0, **TRAIN)
    with pytest.raises(OptionError, match=match):
        ld.load_state_dict({**state, field: value})
    assert ld.state_dict()["position"] == 0 and len(_keys(ld)) == 120, "a refused state leaves the loader as it was"


def test_a_missing_or_unknown_field_is_named(folder):
    _, state = _stopped(folder, 3, **TRAIN)
    ld = make_loader(folder, return_keys=True, num_workers=0, **TRAIN)
    with pytest.raises(OptionError, match=r"the state has no 'position' field; a state of the index reader has .*"):
        ld.load_state_dict({k: v for k, v in state.items() if k != "position"})
    with pytest.raises(OptionError, match=r"has no 'draws' field \(nor 'left_out'\)"):
        ld.load_state_dict({k: v for k, v in state.items() if k not in ("draws", "left_out")})
    with pytest.raises(OptionError, match=r"a field this version does not know: 'postion'"):
        ld.load_state_dict({**state, "postion": 24})


def test_resampled_draws_are_checked(folder):
    opts = dict(TRAIN, resampled=True)
    full = _keys(make_loader(folder, return_keys=True, num_workers=0, **opts))
    head, state = _stopped(folder, 3, **opts)
    assert state["draws"] == 120 and head + _resumed(folder, state, **opts) == full
    for draws, match in [(-3, r"draws=-3: expected an integer from 1"), (None, r"draws=None: expected the samples")]:
        with pytest.raises(OptionError, match=match):
            _resumed(folder, {**state, "draws": draws}, **opts)
    for draws in (124, 8 * 2**16 + 8):  # not a multiple of batch_size; more than 65536 ranks draw
        with pytest.raises(OptionError, match=rf"draws={draws}: expected .* a multiple of 8 .* up to 524288"):
            _resumed(folder, {**state, "draws": draws}, **opts)


STREAM_EDITS = [
    ("batches", -1, r"batches=-1: expected an integer from 0"),
    (
        "batches",
        10**9,
        r"batches=1000000000: expected from 0 to 14: the epoch has 15 batches on its longest rank \(of world=1, workers=1\)",
    ),
    ("batches", 15, r"batches=15: expected from 0 to 14"),
    ("batches", None, r"batches=None: expected an integer"),
    ("world", 0, r"world=0: expected an integer from 1 to 65536"),
    ("world", 7, r"world=7: with workers=1: 7 readers, but in training each needs one of the 6 shards"),
    ("workers", 10**9, r"workers=1000000000: expected an integer from 1 to 1024"),
    ("skipped", -5, r"skipped=-5: expected an integer from 0"),
    ("skipped", 10**9, r"skipped=1000000000: expected at most 120"),
    ("plan", "x", r"plan='x': expected None or a dict of 'shards' and 'batches'"),
    ("plan", {"shards": [], "batches": []}, r"plan\['shards'\]=\[\]: expected a list of world=1 ranks"),
    (
        "plan",
        {"shards": [[[0, 9]]], "batches": [[1]]},
        r"plan\['shards'\]\[0\]\[0\]=\[0, 9\]: expected a list of shard",
    ),
    (
        "plan",
        {"shards": [[[0, 0]]], "batches": [[1]]},
        r"plan\['shards'\]\[0\]\[0\]=\[0, 0\]: expected each shard once",
    ),
    ("plan", {"shards": [[[0]]], "batches": [[4]]}, r"plan\['batches'\]\[0\]\[0\]=4: expected an integer from 0 to 3"),
    ("plan", {"shards": [[[0]]], "batches": [[0]]}, r"batches=2: the plan holds no batch"),
    ("shards_xxh3", 2**64, r"shards_xxh3=18446744073709551616: expected an integer from 0 to 18446744073709551615"),
]


@pytest.mark.parametrize("field,value,match", STREAM_EDITS)
def test_a_streamed_state_edited_by_hand_is_refused_naming_the_field(folder, field, value, match):
    opts = dict(STREAM, shuffle_buffer=0)
    _, state = _stopped(folder, 2, **opts)
    assert (state["batches"], state["world"], state["workers"], state["plan"]) == (2, 1, 1, None)
    ld = make_loader(folder, return_keys=True, num_workers=0, **opts)
    with pytest.raises(OptionError, match=match):
        ld.load_state_dict({**state, field: value})
    assert len(_keys(ld)) == 120, "a refused state leaves the loader as it was"


# --- point 3, fuzzed: refused naming the field, or continued exactly ---------------------------------------
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 130),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.lists(st.integers(-2, 8), max_size=3),
    st.dictionaries(st.sampled_from(["shards", "batches", "a"]), st.lists(st.integers(0, 3), max_size=2), max_size=3),
)


@pytest.fixture(scope="module")
def saved(folder) -> dict:
    """A state of each reader after 3 batches, and the keys of each reader's epochs 0 and 1 uninterrupted."""
    out = {}
    for reader, opts in (("index", TRAIN), ("stream", dict(STREAM, shuffle_buffer=0))):
        head, state = _stopped(folder, 3, **opts)
        ld = make_loader(folder, return_keys=True, num_workers=0, **opts)
        out[reader] = (opts, head, state, [_keys(ld) for _ in range(2)])
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reader=st.sampled_from(["index", "stream"]), data=st.data(), drop=st.integers(0, 9).map(lambda i: i == 0))
def test_fuzzed_states_are_refused_by_name_or_continue_exactly(folder, saved, reader, data, drop):
    opts, head, state, epochs = saved[reader]
    name = data.draw(st.sampled_from(sorted(state)))
    was = state[name]
    near = st.integers(max(0, was - 30), was + 30) if type(was) is int else st.nothing()
    value = data.draw(st.one_of(_VALUES, near, near))  # half the time a number near the saved one
    edited = {k: v for k, v in state.items() if k != name} if drop else {**state, name: value}
    ld = make_loader(folder, return_keys=True, num_workers=0, **opts)
    try:
        ld.load_state_dict(edited)
    except OptionError as e:
        assert name in str(e), (name, str(e))
        event(f"refused {name}")
        return
    event(f"accepted: {reader}")
    rest = _keys(ld)  # accepted: a valid state, perhaps another one; it must run as it says
    e = edited["epoch"]
    assert ld.epoch == e
    assert len(rest) == len(set(rest)), "no sample twice"
    if e > 1:
        return
    full = epochs[e]
    if reader == "index":
        start = edited["position"] if edited["end"] is not None else 0
        end = edited["end"] if edited["end"] is not None else 120
        assert rest == full[start : start + (end - start) // B * B]
    elif edited["batches"] == 0:
        assert rest == full
    elif (edited["world"], edited["workers"]) == (1, 1):  # the stop the state says: none of its batches again
        assert not set(rest) & set(full[: B * edited["batches"]])
