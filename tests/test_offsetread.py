"""offsetread: reads by offset against tarfile, the label and pixel checks against damaged shards, skip, object storage."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import convert_images, upload
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from oracle import read_stored
from shardkit import build_dataset

from training_adapter import make_loader
from training_adapter.indexplan import read_sample_index
from training_adapter.offsetread import LABEL_BYTES, MERGE_MAX, VECTOR_RUN, Gather, label_digits, labels_differ
from training_adapter.shardlist import resolve_urls
from wds_tools.errors import OptionError, ShardError

S = 8
B = 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """60 train samples in 5 shards of 12, 3 classes."""
    return convert_images(tmp_path_factory.mktemp("offsetread"), 60, size=S, shard_size=12, val_fraction=0.0)


@pytest.fixture(scope="module")
def stored(folder) -> dict:
    return read_stored(sorted(folder.glob("train-*.tar")))


def index_of(path):
    shards = resolve_urls(path, split="train")
    return read_sample_index(shards.index_base, shards.info, shards.urls, shards.names)


def read_eval(path, shuffled: bool = False, **kw) -> dict[str, tuple[int, bytes]]:
    """key -> (label, pixels) of an epoch of the index reader, in one process: in eval order (runs of
    one shard, checked vectorised) or ``shuffled`` (train mode with device_augment: stored pixels in
    a random order, checked row by row)."""
    out = {}
    mode = dict(train=True, device_augment=True, drop_last=False) if shuffled else dict(train=False)
    loader = make_loader(path, batch_size=B, num_workers=0, split="train", return_keys=True, **mode, **kw)
    assert loader.dataset.index is not None
    for images, labels, *_, keys in loader:
        for im, lab, k in zip(images, labels, keys):
            assert k not in out, f"{k} twice"
            out[k] = (int(lab), im.permute(1, 2, 0).contiguous().numpy().tobytes())
    return out


def reference(stored: dict) -> dict[str, tuple[int, bytes]]:
    return {k: (s.label, s.pixels.tobytes()) for k, s in stored.items()}


def damage(folder: Path, tmp_path: Path, edits: dict[str, list[tuple[int, int]]]) -> Path:
    """A copy of ``folder`` with bytes of shards xor-ed: {shard name: [(offset, xor)]} (sizes unchanged)."""
    bad = tmp_path / "damaged"
    shutil.copytree(folder, bad)
    for name, flips in edits.items():
        data = bytearray((bad / name).read_bytes())
        for at, x in flips:
            data[at] ^= x
        (bad / name).write_bytes(bytes(data))
    return bad


def test_reads_equal_tarfile(folder, stored):
    assert read_eval(folder) == reference(stored)
    assert read_eval(folder, check_samples=True) == reference(stored)
    assert read_eval(folder, check_samples=False) == reference(stored)


def test_a_changed_cls_digit_is_caught_by_default(folder, tmp_path):
    idx = index_of(folder)
    r = int(np.flatnonzero(idx.shard == 2)[3])
    at = int(idx.cls_offset[r])
    name = Path(idx.urls[2]).name
    digit = (folder / name).read_bytes()[at]
    new = ord("0") + (digit - ord("0") + 1) % 3  # another class's digit
    bad = damage(folder, tmp_path, {name: [(at, digit ^ new)]})
    with pytest.raises(
        ShardError,
        match=rf"{bad / name}: byte {at}: sample '{idx.key_str(r)}': its \.cls is "
        rf"b'{chr(new)}', the index's label is {digit - ord('0')} \(\w+\): the "
        r"shard does not match its index",
    ):
        read_eval(bad)
    try:
        read_eval(bad)
    except ShardError as e:
        assert (e.url, e.offset) == (str(bad / name), at)
    got = read_eval(bad, check_samples=False)  # unchecked: the index reader takes labels from the index
    assert got[idx.key_str(r)][0] == digit - ord("0")


def test_a_flipped_pixel_is_caught_with_check_samples(folder, stored, tmp_path):
    idx = index_of(folder)
    r = int(np.flatnonzero(idx.shard == 4)[0])
    at = int(idx.offset[r]) + 128 + S * S * 3 - 1  # the last pixel byte
    name = Path(idx.urls[4]).name
    bad = damage(folder, tmp_path, {name: [(at, 0x40)]})
    assert read_eval(bad) != reference(stored)  # the default checks labels only: read as it is
    with pytest.raises(
        ShardError,
        match=rf"{bad / name}: byte {int(idx.offset[r])}: sample '{idx.key_str(r)}': "
        r"its pixels do not match their checksum in the index \(npy_xxh3\)",
    ):
        read_eval(bad, check_samples=True)


def test_skip_leaves_damaged_samples_out_of_their_batch(folder, stored, tmp_path, caplog):
    """on_error='skip': each damaged sample is left out of its batch (logged), the batch count stays,
    nothing repeats; every other sample is its own."""
    idx = index_of(folder)
    rows = [int(np.flatnonzero(idx.shard == s)[i]) for s, i in ((0, 1), (0, 2), (3, 5))]
    edits: dict[str, list] = {}
    for r in rows:
        edits.setdefault(Path(idx.urls[int(idx.shard[r])]).name, []).append((int(idx.offset[r]) + 200, 1))
    bad = damage(folder, tmp_path, edits)
    with caplog.at_level("WARNING", logger="training_adapter"):
        loader = make_loader(
            bad,
            batch_size=B,
            train=False,
            num_workers=0,
            split="train",
            return_keys=True,
            check_samples=True,
            on_error="skip",
        )
        batches = list(loader)
    assert len(batches) == len(loader) == 60 // B
    assert sorted(len(b[1]) for b in batches)[:2] == [2, 3]  # rows 1 and 2 of shard 0 share a batch
    got = {
        k: (int(lab), im.permute(1, 2, 0).contiguous().numpy().tobytes())
        for images, labels, keys in batches
        for im, lab, k in zip(images, labels, keys)
    }
    want = reference(stored)
    assert set(want) - set(got) == {idx.key_str(r) for r in rows}
    assert all(got[k] == want[k] for k in got)
    assert caplog.text.count("leaving out a damaged sample") == 3


def test_skip_of_a_whole_batch_with_one_rank_shortens_the_epoch(folder, tmp_path):
    idx = index_of(folder)
    first = [int(r) for r in np.flatnonzero(idx.shard == 0)[:B]]  # the first batch in eval order
    bad = damage(folder, tmp_path, {Path(idx.urls[0]).name: [(int(idx.offset[r]) + 130, 1) for r in first]})
    loader = make_loader(
        bad, batch_size=B, train=False, num_workers=0, split="train", check_samples=True, on_error="skip"
    )
    assert sum(1 for _ in loader) == len(loader) - 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shard=st.integers(0, 4),
    pos=st.floats(0, 1, exclude_max=True),
    xor=st.integers(1, 255),
    skip=st.booleans(),
    shuffled=st.booleans(),
)
@example(shard=1, pos=0.5, xor=1, skip=False, shuffled=False)
@example(shard=1, pos=0.5, xor=1, skip=False, shuffled=True)
def test_any_flipped_byte_is_caught_or_harmless(folder, stored, tmp_path_factory, shard, pos, xor, skip, shuffled):
    """A byte flipped anywhere in a shard (size unchanged), check_samples=True: a byte of a .npy
    member, of a .cls's digits or of the .npy's name in its tar header is a ShardError naming the shard
    and the sample's offset (skip: that sample alone is missing); any other byte (the rest of the tar
    headers, .json, padding) changes nothing."""
    idx = index_of(folder)
    name = Path(idx.urls[shard]).name
    size = (folder / name).stat().st_size
    at = int(pos * size)
    mine = np.flatnonzero(idx.shard == shard)
    in_npy = mine[(idx.offset[mine] <= at) & (at < idx.offset[mine] + 128 + S * S * 3)]
    in_cls = mine[(idx.cls_offset[mine] <= at) & (at < idx.cls_offset[mine] + idx.cls_length[mine])]
    # the .npy member's name in its tar header, <key>.npy and the NUL that ends it
    name_end = idx.offset[mine] - 512 + np.array([len(idx.key_str(int(r))) + 5 for r in mine])
    in_name = mine[(idx.offset[mine] - 512 <= at) & (at < name_end)]
    hit = [int(r) for r in (*in_npy, *in_cls, *in_name)]
    bad = damage(folder, tmp_path_factory.mktemp("flip"), {name: [(at, xor)]})
    want = reference(stored)
    if not hit:
        assert read_eval(bad, shuffled, check_samples=True, on_error="skip" if skip else "raise") == want
        return
    (r,) = hit
    if skip:
        got = read_eval(bad, shuffled, check_samples=True, on_error="skip")
        assert set(want) - set(got) == {idx.key_str(r)} and all(got[k] == want[k] for k in got)
        return
    with pytest.raises(ShardError) as e:
        read_eval(bad, shuffled, check_samples=True)
    assert e.value.url == str(bad / name)
    assert e.value.offset == int(
        idx.offset[r] if len(in_npy) else idx.cls_offset[r] if len(in_cls) else idx.offset[r] - 512
    )
    assert f"byte {e.value.offset}: sample '{idx.key_str(r)}'" in str(e.value)


@pytest.fixture(scope="module")
def swapped(tmp_path_factory) -> tuple[Path, Path, str]:
    """Two datasets of the same layout (shardkit: same labels, sizes and key lengths, other keys and
    pixels), and a copy of the first with its train-000001.tar replaced by the second's shard 1 of the
    same size: (the copy, its original, the replaced shard's name)."""
    root = tmp_path_factory.mktemp("swapped")
    labels = [[(j + t) % 3 for t in range(12)] for j in range(3)]
    mine = build_dataset(root / "mine", {"train": labels}, size=S)
    other = build_dataset(root / "other", {"valid": labels}, size=S, seed=1)  # keys valid<j>x<t>
    bad = root / "bad"
    shutil.copytree(mine, bad)
    name = "train-000001.tar"
    assert (other / "valid-000001.tar").stat().st_size == (bad / name).stat().st_size
    shutil.copy(other / "valid-000001.tar", bad / name)
    return bad, mine, name


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_shard_of_another_dataset_with_the_same_size_and_labels_is_refused_by_name(swapped, shuffled):
    """Issue 38, point 3: the default check (labels) reads the tar header in front of each .npy, whose
    name is <key>.npy (docs/FORMAT.md): a same-size shard of another conversion, whose labels match where
    they are read, is a ShardError naming the shard, the header's byte offset, the sample and the name
    found (it was read silently, its pixels under this index's keys); check_samples=False reads it as
    it is; on_error='skip' leaves its samples out."""
    bad, mine, name = swapped
    idx = index_of(mine)
    rows = np.flatnonzero(idx.shard == 1)
    first = {int(idx.offset[r]) - 512: idx.key_str(int(r)) for r in rows}
    with pytest.raises(ShardError) as e:
        read_eval(bad, shuffled)
    at = e.value.offset
    assert e.value.url == str(bad / name) and at in first
    key = first[at]
    assert str(e.value) == (
        f"{bad / name}: byte {at}: sample '{key}': the tar header in front of its .npy names "
        f"'valid{key[5:]}.npy', not '{key}.npy': the shard is not the one its index was written with "
        f"(another version's or conversion's shard copied over it?); wds-tools verify lists every such sample"
    )
    assert len(read_eval(bad, shuffled, check_samples=False)) == 36
    kept = read_eval(bad, shuffled, on_error="skip")
    assert sorted(kept) == sorted(k for k in (idx.key_str(r) for r in range(len(idx))) if not k.startswith("train1x"))


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_changed_byte_of_a_npy_members_name_is_caught_by_default(folder, tmp_path, shuffled):
    idx = index_of(folder)
    r = int(np.flatnonzero(idx.shard == 2)[5])
    at = int(idx.offset[r]) - 512 + len(idx.key_str(r))  # the dot of <key>.npy
    name = Path(idx.urls[2]).name
    assert (folder / name).read_bytes()[at - len(idx.key_str(r)) : at + 4] == f"{idx.key_str(r)}.npy".encode()
    bad = damage(folder, tmp_path, {name: [(at, ord(".") ^ ord("_"))]})
    with pytest.raises(
        ShardError,
        match=rf"{bad / name}: byte {at - len(idx.key_str(r))}: sample '{idx.key_str(r)}': the tar header "
        rf"in front of its .npy names '{idx.key_str(r)}_npy', not '{idx.key_str(r)}.npy'",
    ):
        read_eval(bad, shuffled)


def test_a_swapped_shard_is_refused_in_object_storage_too(swapped, bucket):
    bad, mine, name = swapped
    fs, url = bucket
    remote = upload(fs, bad, f"{url}/swapped")
    with pytest.raises(ShardError, match=rf"{remote}/{name}: byte \d+: sample 'train1x\d+': the tar header in front"):
        read_eval(remote)
    assert len(read_eval(upload(fs, mine, f"{url}/mine"))) == 36


def test_labels_differ_is_the_writers_decimal_rule():
    def differ(cls: bytes, label: int) -> bool:
        got = np.frombuffer(cls[:LABEL_BYTES].ljust(LABEL_BYTES, b"\0"), np.uint8)[None]
        return bool(labels_differ(got, np.array([len(cls)]), label_digits(np.array([label])))[0])

    assert not differ(b"3", 3) and not differ(b"123456789", 123456789) and not differ(b"0", 0)
    assert differ(b"03", 3) and differ(b"31", 3) and differ(b"3 ", 3) and differ(b"", 3) and differ(b"4", 3)
    assert differ(b"1234567890", 1234567890 % 10**9)


def test_check_samples_option_errors(folder):
    with pytest.raises(OptionError, match=r"check_samples='pixels': expected 'labels' \(the default\), True"):
        make_loader(folder, batch_size=B, train=False, split="train", check_samples="pixels")
    with pytest.raises(OptionError, match="check_samples=True needs the index reader; drop reader='stream'"):
        make_loader(folder, batch_size=B, train=False, split="train", check_samples=True, reader="stream")
    make_loader(folder, batch_size=B, train=False, split="train", reader="stream")  # "labels": where an index is


def test_object_storage_merges_neighbours_and_checks_as_locally(folder, stored, bucket, monkeypatch):
    """From S3 (moto): the same samples; neighbours of a shard merged into ranges of at most
    MERGE_MAX bytes (eval order: one range per shard run of a batch); damage caught as locally."""
    from wds_tools.storage import transport

    fs, url = bucket
    remote = upload(fs, folder, f"{url}/v1/{S}")
    ranges = []
    real = transport.read_ranges

    def counted(urls, starts, ends):
        ranges.append(list(zip(urls, starts, ends)))
        return real(urls, starts, ends)

    monkeypatch.setattr("training_adapter.offsetread.read_ranges", counted)
    assert read_eval(remote, check_samples=True) == reference(stored)
    assert len(ranges) == 60 // B and all(len(r) == 1 for r in ranges)  # 12 per shard, batch 4: one range each
    assert all(e - s <= MERGE_MAX for r in ranges for _, s, e in r)
    ranges.clear()
    shuffled = make_loader(
        remote, batch_size=B, train=True, num_workers=0, split="train", return_keys=True, device_augment=True
    )
    keys = [k for b in shuffled for k in b[-1]]
    assert len(keys) == len(set(keys)) == 60 // B * B
    idx = index_of(folder)
    r = int(np.flatnonzero(idx.shard == 1)[4])
    name = Path(idx.urls[1]).name
    data = bytearray((folder / name).read_bytes())
    data[int(idx.cls_offset[r])] ^= 0x03
    fs.pipe(f"{remote}/{name}", bytes(data))
    with pytest.raises(
        ShardError,
        match=rf"{remote}/{name}: byte {int(idx.cls_offset[r])}: sample "
        rf"'{idx.key_str(r)}': its \.cls is",
    ):
        read_eval(remote)
    got = read_eval(remote, on_error="skip")
    assert set(reference(stored)) - set(got) == {idx.key_str(r)}


def test_map_style_dataset_checks_labels(folder, tmp_path):
    from training_adapter import ShardIndexDataset

    idx = index_of(folder)
    name = Path(idx.urls[0]).name
    bad = damage(folder, tmp_path, {name: [(int(idx.cls_offset[0]), 0x01)]})
    ds = ShardIndexDataset(bad)
    i = ds.keys.index(idx.key_str(0))
    with pytest.raises(ShardError, match="its .cls is"):
        ds[i]
    image, label, key, _ = ShardIndexDataset(bad, check_samples=False)[i]
    assert key == idx.key_str(0) and label == int(idx.label[0])
    assert torch.equal(image, ShardIndexDataset(folder)[i][0])


def test_gather_reads_rows_in_any_order(folder, stored):
    """Rows from several shards, repeated and out of file order: each its own stored pixels."""
    idx = index_of(folder)
    g = Gather(idx, labels=True, pixels=True)
    rows = np.array([5, 40, 41, 5, 0, 59, 13, 12])
    out = np.empty((len(rows), S * S * 3), np.uint8)
    assert g.read(rows, out) == list(range(len(rows)))
    for i, r in enumerate(rows):
        assert out[i].tobytes() == stored[idx.key_str(int(r))].pixels.tobytes()
    assert g.bytes_read == len(rows) * (128 + S * S * 3)


# Damage to shard 2 for the runs' differential test: {case: (the edit of the shard's bytes, given the
# index and shard 2's rows; what a field-by-field reading finds, worked out by hand: {position in the
# shard: the message's words})}. The name field's padding after its NUL and the tar padding after a
# .cls's digits are not compared: runs compare them as part of whole fields first, so they must then
# look field by field and find nothing.
SHORT, HEADER_, NAME, LABEL = "shorter than its index says", "no .npy header", "its .npy names", "its .cls is"


def _xor(*places, x: int = 0x01):
    """Each byte at ``place(idx, mine)`` xor-ed with ``x``."""

    def edit(data: bytearray, idx, mine) -> bytes:
        for place in places:
            data[place(idx, mine)] ^= x
        return bytes(data)

    return edit


def _cut(place):
    """The shard cut short at ``place(idx, mine)``."""
    return lambda data, idx, mine: bytes(data[: place(idx, mine)])


def _name(j: int, past: int):
    """Row j's name field, ``past`` bytes after its key (0: the dot of <key>.npy, 4: its NUL)."""
    return lambda idx, mine: int(idx.offset[mine[j]]) - 512 + len(idx.key_str(int(mine[j]))) + past


def _cls(j: int, past: int = 0):
    return lambda idx, mine: int(idx.cls_offset[mine[j]]) + past


def _npy(j: int, past: int):
    return lambda idx, mine: int(idx.offset[mine[j]]) + past


RUN_DAMAGE = {
    "none": (_xor(), {}),
    "name's dot": (_xor(_name(5, 0)), {5: NAME}),
    "name's NUL": (_xor(_name(5, 4)), {5: NAME}),
    "name padding after its NUL": (_xor(_name(5, 5)), {}),
    "a .cls digit": (_xor(_cls(5), x=0x03), {5: LABEL}),
    "the .cls's tar padding": (_xor(_cls(5, 1)), {}),  # its label has one digit (asserted below)
    "a NPY header byte": (_xor(_npy(5, 10)), {5: HEADER_}),
    "a pixel": (_xor(_npy(5, 128 + 7)), {}),
    "a name and a label": (_xor(_name(3, 1), _cls(4), x=0x02), {3: NAME, 4: LABEL}),
    "cut in a row's pixels": (_cut(_npy(7, 128 + 10)), dict.fromkeys(range(7, 12), SHORT)),
    "cut in a row's NPY header": (_cut(_npy(7, 50)), dict.fromkeys(range(7, 12), SHORT)),
    "the index's .cls length": (_xor(), {5: LABEL}),  # the index, not the shard: one more than its label's digits
}
RUNS = [range(12), range(4), range(3, 8), range(8, 12), [8, 7, 6, 5, 4], [7, 7, 5, 5, 6], [11, 0, 5, 3, 9, 2]]
RUNS += [[5], [4, 6], [3, 4, 5]]  # shorter than VECTOR_RUN: read row by row by locate


@pytest.mark.parametrize("labels", [True, False])
@pytest.mark.parametrize("case", list(RUN_DAMAGE))
def test_runs_find_what_rows_checked_one_by_one_find(folder, tmp_path, case, labels):
    """Issue 39: ``_check_run`` (whole fields of a run compared as bytes first, field by field where
    they differ) reports, for runs in and out of file order and with repeats, exactly the problems
    ``_check_one`` reports row by row, with the same messages and offsets, and those worked out by hand;
    ``_run_exact`` is True only where there are none, and on the shard as written (the common case takes
    it); ``locate`` with skip, which checks runs of VECTOR_RUN or more with ``_check_run`` and shorter
    ones row by row, keeps exactly the rows without one."""
    idx = index_of(folder)
    mine = np.flatnonzero(idx.shard == 2)
    assert len(mine) == 12 and idx.cls_length[mine[5]] == 1
    edit, hand = RUN_DAMAGE[case]
    if case == "the index's .cls length":
        idx = dataclasses.replace(idx, cls_length=idx.cls_length + (np.arange(len(idx)) == mine[5]))
    bad = tmp_path / "train-000002.tar"
    bad.write_bytes(edit(bytearray(Path(idx.urls[2]).read_bytes()), idx, mine))
    idx = dataclasses.replace(idx, urls=[*idx.urls[:2], str(bad), *idx.urls[3:]])
    if not labels:  # check_samples=False: bounds and NPY headers only
        hand = {j: w for j, w in hand.items() if w in (SHORT, HEADER_)}
    g = Gather(idx, labels=labels, skip=True)
    m = g._map(2)
    assert {len(run) >= VECTOR_RUN for run in RUNS} == {True, False}  # both of locate's paths
    assert g.labels == labels
    for run in map(np.array, RUNS):
        rows, o = mine[run], idx.offset[mine[run]]
        found: dict = {}
        g._check_run(2, m, rows, o, 0, found)
        one: dict = {}
        for i, r in enumerate(rows.tolist()):
            g._check_one(m, r, int(o[i]), i, one)
        assert [(i, str(e), e.offset, e.url) for i, e in sorted(found.items())] == [
            (i, str(e), e.offset, e.url) for i, e in sorted(one.items())
        ]
        want = {i: hand[j] for i, j in enumerate(run.tolist()) if j in hand}
        assert sorted(one) == sorted(want) and all(want[i] in str(e) and e.url == str(bad) for i, e in one.items())
        exact = g._run_exact(2, m, rows, o)
        assert not (exact and one)
        assert exact or case != "none", "the shard as written takes the whole-field comparison"
        good, _ = g.locate(rows)
        assert good == [i for i in range(len(run)) if i not in want]
