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
    convert(
        write_manifest(root / "m.csv", rows),
        version="v1",
        size=32,
        out=root / "shards",
        val_fraction=0.0,
        workers=1,
        progress=False,
    )
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
    assert sorted(members) == ["cls", "i32", "json", "npy"]  # format version 2
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
    bad.write_bytes(data[: at + 600])
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


def _long_name_tar(path: Path, fmt: int, key: str = "k" * 120) -> bytes:
    """A one-member tar whose name needs a GNU long-name or PAX record (the first member)."""
    import io

    with tarfile.open(path, "w", format=fmt) as tf:
        info = tarfile.TarInfo(f"{key}.cls")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"7"))
    return path.read_bytes()


def _edit_first_member_data(data: bytes, new: bytes) -> bytes:
    """Replace the data of the tar's first member (a PAX or GNU record) with ``new``, same length,
    header untouched (a tar header's checksum covers the header only)."""
    size = int(data[124:136].rstrip(b"\0 "), 8)
    assert len(new) == size
    return data[:512] + new + data[512 + size :]


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(lambda r: b"0" + r[1:], id="length-0"),  # used to loop for ever
        pytest.param(lambda r: b"9" * (r.index(b" ")) + r[r.index(b" ") :], id="length-past-end"),
        pytest.param(lambda r: b"x" + r[1:], id="length-not-digits"),
        pytest.param(lambda r: r.replace(b"path=", b"path:"), id="no-equals"),
        pytest.param(lambda r: r.replace(b"kkkk", b"\xff\xfe\xfd\xfc", 1), id="path-not-utf8"),
        pytest.param(lambda r: r[:-1] + b"X", id="no-newline"),
    ],
)
def test_malformed_pax_record_is_a_shard_error(tmp_path, record):
    data = _long_name_tar(tmp_path / "pax.tar", tarfile.PAX_FORMAT)
    size = int(data[124:136].rstrip(b"\0 "), 8)
    bad = tmp_path / "bad.tar"
    bad.write_bytes(_edit_first_member_data(data, record(data[512 : 512 + size])))
    with pytest.raises(ShardError, match=rf"{bad}: corrupt PAX header at byte 0: "):
        list(iter_samples(str(bad)))


def test_pax_record_followed_by_nul_padding_is_read(tmp_path):
    import io

    key = "k" * 120
    body = f"path={key}.cls\n".encode()
    record = f"{len(body) + 4} ".encode() + body  # the length counts its own 3 digits and the space
    assert int(record.split(b" ")[0]) == len(record)
    path = tmp_path / "padded.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        pax = tarfile.TarInfo("PaxHeader/x")
        pax.type, pax.size = tarfile.XHDTYPE, len(record) + 8
        tf.addfile(pax, io.BytesIO(record + b"\0" * 8))
        info = tarfile.TarInfo("short.cls")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"7"))
    assert [(k, bytes(m["cls"])) for k, m, _ in iter_samples(str(path))] == [(key, b"7")]


def test_malformed_gnu_long_name_is_a_shard_error(tmp_path):
    data = _long_name_tar(tmp_path / "gnu.tar", tarfile.GNU_FORMAT)
    size = int(data[124:136].rstrip(b"\0 "), 8)
    bad = tmp_path / "bad.tar"
    bad.write_bytes(_edit_first_member_data(data, b"\xff" * size))
    with pytest.raises(ShardError, match=rf"{bad}: corrupt GNU long name at byte 0: .*utf-8"):
        list(iter_samples(str(bad)))


def test_absurd_member_size_is_a_shard_error(shard, tmp_path):
    data = bytearray(shard.read_bytes()[:4096])
    data[124:136] = b"\x80" + (1 << 60).to_bytes(11, "big")  # GNU base-256 size of an exabyte
    data[148:156] = b"        "
    data[148:155] = f"{sum(data[:512]):06o}\0".encode()
    bad = tmp_path / "huge.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{bad}: corrupt tar header at byte 0: member '.*' claims {1 << 60} bytes"):
        list(iter_samples(str(bad)))


def test_damage_anywhere_ends_in_a_shard_error_or_a_clean_read(shard, tmp_path):
    """Truncations and flipped bytes anywhere in a real shard: iter_samples ends (no hang), either
    reading the whole tar or raising ShardError naming the file and a byte offset; nothing else."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    data = shard.read_bytes()
    bad = tmp_path / "fuzz.tar"

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        cut=st.integers(0, len(data)),
        flips=st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(1, 255)), max_size=4),
    )
    def check(cut, flips):
        b = bytearray(data[:cut] if cut < len(data) - 1024 else data)
        for at, x in flips:
            if at < len(b):
                b[at] ^= x
        bad.write_bytes(bytes(b))
        try:
            for _ in iter_samples(str(bad), chunk_size=4096):
                pass
        except ShardError as e:
            assert str(bad) in str(e) and "byte" in str(e)

    check()


def test_shard_errors_carry_url_and_offset_through_pickling(shard, tmp_path):
    import pickle

    data = shard.read_bytes()
    at = _third_sample_offset(shard)
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[: at + 600])
    with pytest.raises(ShardError) as info:
        list(iter_samples(str(bad)))
    assert info.value.url == str(bad) and info.value.offset == at
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.url, again.offset, str(again)) == (str(bad), at, str(info.value))
