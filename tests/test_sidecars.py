"""format.sidecars: the wids shard list and DALI index files, checked with wids itself and with tarfile."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import convert_images, upload

from wds_tools.format.index import load_index
from wds_tools.format.sample import MEMBERS_V1
from wds_tools.format.sidecars import dali_index, dali_name, sidecar_files, wids_shard_list


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A conversion: convert writes the sidecars itself, before index.json."""
    return convert_images(tmp_path_factory.mktemp("sidecars"), 30, size=8, shard_size=7, val_every=5)


def test_convert_writes_every_sidecar_derived_from_the_index(folder):
    idx = load_index(folder)
    files = sidecar_files(idx.info, idx.samples.columns)
    assert sorted(files) == sorted(["train.wids.json", "val.wids.json"] + [dali_name(s["name"]) for s in idx.shards])
    for name, data in files.items():
        assert (folder / name).read_bytes() == data, name


def test_index_command_writes_them_for_an_existing_folder(folder, tmp_path):
    from click.testing import CliRunner

    from wds_tools.cli import cli

    copy = tmp_path / "v1" / "8"
    shutil.copytree(folder, copy)
    sidecars = sorted(p.name for p in copy.iterdir() if p.name.endswith((".idx", ".wids.json")))
    want = {name: (copy / name).read_bytes() for name in sidecars}
    for name in sidecars:
        (copy / name).unlink()
    r = CliRunner().invoke(cli, ["index", str(copy), "--wids"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in copy.glob("*.wids.json")) == ["train.wids.json", "val.wids.json"]
    assert not list(copy.glob("*.idx")) and "wrote 2 files" in r.output
    r = CliRunner().invoke(cli, ["index", "--out", str(tmp_path), "--json"])  # both kinds, newest version
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)  # the wids lists written just before are up to date: not written again
    assert got["unchanged"] == ["train.wids.json", "val.wids.json"]
    assert sorted(got["written"] + got["unchanged"]) == sidecars
    assert {name: (copy / name).read_bytes() for name in sidecars} == want
    r = CliRunner().invoke(cli, ["index", str(tmp_path / "nowhere")])
    assert r.exit_code == 1 and "no index at" in r.output


def test_index_command_refuses_a_samples_npz_that_is_not_its_index_table(folder, tmp_path):
    """A samples.npz of the size index.json records but other bytes (two rows' keys swapped: another
    version's table, say) would give DALI index files naming the wrong samples: refused, naming the file
    and the field that disagrees, and nothing written."""
    from click.testing import CliRunner

    from wds_tools.cli import cli
    from wds_tools.format.index import read_npz, write_npz

    copy = tmp_path / "v1" / "8"
    shutil.copytree(folder, copy)
    table = copy / "samples.npz"
    cols = read_npz(table)
    cols["key"][[0, 1]] = cols["key"][[1, 0]]
    swapped = write_npz(cols)
    assert len(swapped) == table.stat().st_size and swapped != table.read_bytes()
    table.write_bytes(swapped)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    r = CliRunner().invoke(cli, ["index", str(copy)])
    assert r.exit_code == 1, r.output
    assert f"{table}: sha256 " in r.output and f"{copy / 'index.json'} says" in r.output, r.output
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before


def test_index_command_writes_to_object_storage(folder, bucket):
    from wds_tools.convert.reindex import write_reader_indexes

    fs, url = bucket
    skip = [p.name for p in folder.iterdir() if p.name.endswith((".idx", ".wids.json"))]
    s3 = upload(fs, folder, f"{url}/v1/8", skip=skip)
    written = write_reader_indexes(s3).written
    assert sorted(written) == sorted(skip)
    for name in written:
        assert fs.cat_file(f"{s3}/{name}") == (folder / name).read_bytes()


def test_wids_reads_the_shard_list(folder, tmp_path):
    wids = pytest.importorskip("wids")
    idx = load_index(folder)
    table = idx.samples
    by_key = {k: i for i, k in enumerate(table.keys)}
    for split in ("train", "val"):
        ds = wids.ShardListDataset(
            str(folder / f"{split}.wids.json"), cache_dir=str(tmp_path / "cache"), transformations=[lambda s: s]
        )
        assert len(ds) == idx.splits[split]["samples"]
        for i in range(len(ds)):
            sample = ds[i]
            r = by_key[sample["__key__"]]
            pixels = np.load(io.BytesIO(sample[".npy"].read() if hasattr(sample[".npy"], "read") else sample[".npy"]))
            with tarfile.open(folder / idx.shards[int(table["shard"][r])]["name"]) as tf:
                stored = np.load(io.BytesIO(tf.extractfile(f"{sample['__key__']}.npy").read()))
            assert np.array_equal(pixels, stored)
            cls = sample[".cls"].read() if hasattr(sample[".cls"], "read") else sample[".cls"]
            assert int(cls) == int(table["label"][r])


def test_dali_index_files_match_every_member_tarfile_sees(folder):
    idx = load_index(folder)
    for s in idx.shards:
        text = (folder / dali_name(s["name"])).read_text()
        head, *lines = text.splitlines()
        assert head == f"v1.2 {s['samples']}" and len(lines) == s["samples"]
        with tarfile.open(folder / s["name"]) as tf:
            members = [(m.name, m.offset_data, m.size) for m in tf if m.isfile()]
        listed = []
        for line in lines:
            parts = line.split(" ")
            assert len(parts) == 16 == 4 * len(idx.info.members)  # cls, i32, json, npy
            for j in range(0, 16, 4):
                ext, off, size, name = parts[j : j + 4]
                assert name.endswith("." + ext)
                listed.append((name, int(off), int(size)))
        assert listed == members  # every member, in file order, at its data offset


def test_wids_description_fields(folder):
    idx = load_index(folder)
    desc = wids_shard_list(idx.info, "train")
    assert desc["wids_version"] == 1 and json.loads((folder / "train.wids.json").read_text()) == desc
    assert [s["url"] for s in desc["shardlist"]] == [s["name"] for s in idx.shards if s["split"] == "train"]
    assert sum(s["nsamples"] for s in desc["shardlist"]) == idx.splits["train"]["samples"]


def test_dali_index_of_an_empty_shard_number():
    cols = {
        "shard": np.array([0], np.uint32),
        "key": np.array([b"a"]),
        **{
            f"{m}_{f}": np.array([512 * (1 + j) if f == "offset" else 3], np.uint64)
            for j, m in enumerate(("cls", "json", "npy"))
            for f in ("offset", "length")
        },
    }
    assert dali_index(cols, 0, MEMBERS_V1) == "v1.2 1\ncls 512 3 a.cls json 1024 3 a.json npy 1536 3 a.npy\n"
    assert dali_index(cols, 1, MEMBERS_V1) == "v1.2 0\n"
    cols.update(i32_offset=np.array([2048], np.uint64), i32_length=np.array([4], np.uint64))
    assert dali_index(cols, 0) == (
        "v1.2 1\ncls 512 3 a.cls i32 2048 4 a.i32 json 1024 3 a.json npy 1536 3 a.npy\n"
    )  # version 2's members, in MEMBERS order
