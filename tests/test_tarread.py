"""tarread: the streaming ustar reader against tarfile, on real converted shards."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from conftest import make_images, write_manifest
from training_adapter.tarread import iter_members, iter_samples, open_url, split_name
from wds_tools.convert import convert
from wds_tools.errors import ShardError


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tarread")
    rows = make_images(root, 12)
    convert(write_manifest(root / "m.csv", rows), version="v1", size=32, out=root / "shards",
            val_fraction=0.0, workers=1, progress=False)
    return root / "shards" / "v1" / "32" / "train-000000.tar"


def _tarfile_members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isfile()]


@pytest.mark.parametrize("chunk", [8 << 20, 1000, 513])
def test_members_match_tarfile(shard, chunk):
    with open_url(str(shard)) as f:
        got = [(n, bytes(d)) for n, _, d in iter_members(f, str(shard), chunk_size=chunk)]
    assert got == _tarfile_members(shard)


def test_samples_group_by_key(shard):
    samples = list(iter_samples(str(shard)))
    assert len(samples) == 12
    key, members, offset = samples[1]
    assert sorted(members) == ["cls", "json", "npy"]
    assert len(members["npy"]) == 128 + 32 * 32 * 3
    with open(shard, "rb") as f:  # the offset is the sample's first header
        f.seek(offset)
        assert f.read(100).split(b"\0")[0] == f"{key}.cls".encode()


def test_pipe_url(shard):
    assert [k for k, _, _ in iter_samples(f"pipe:cat {shard}")] == [k for k, _, _ in iter_samples(str(shard))]


def test_split_name_follows_webdataset():
    assert split_name("a/b.c/key.seg.npy") == ("a/b.c/key", "seg.npy")
    assert split_name("noext") == (None, None)


def _third_sample_offset(shard: Path) -> int:
    return list(iter_samples(str(shard)))[2][2]


def test_truncated_shard_names_url_and_offset(shard, tmp_path):
    data = shard.read_bytes()
    at = _third_sample_offset(shard)
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[:at + 600])
    with pytest.raises(ShardError, match=rf"{bad}: truncated at byte {at}: member '.*cls' needs"):
        list(iter_samples(str(bad)))
    bad.write_bytes(data[:at])  # cut at a member boundary: no end-of-archive blocks
    with pytest.raises(ShardError, match=rf"truncated at byte {at}: the stream ended without"):
        list(iter_samples(str(bad)))


def test_corrupt_header_names_offset(shard, tmp_path):
    data = bytearray(shard.read_bytes())
    at = _third_sample_offset(shard)
    data[at + 10] ^= 0xFF  # inside the member name
    bad = tmp_path / "corrupt.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{bad}: corrupt tar header at byte {at} \(checksum mismatch\)"):
        list(iter_samples(str(bad)))


def test_missing_file(tmp_path):
    with pytest.raises(ShardError, match="cannot open shard"):
        list(iter_samples(str(tmp_path / "nope.tar")))


def test_long_names_and_pax(tmp_path):
    path = tmp_path / "gnu.tar"
    long_key = "k" * 120
    import io

    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name in (f"{long_key}.cls", f"{long_key}.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"7"))
    with tarfile.open(tmp_path / "pax.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("dir/" + "é" * 3 + ".cls")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"3"))
    assert [(k, sorted(m)) for k, m, _ in iter_samples(str(path))] == [(long_key, ["cls", "txt"])]
    assert [k for k, _, _ in iter_samples(str(tmp_path / "pax.tar"))] == ["dir/ééé"]
