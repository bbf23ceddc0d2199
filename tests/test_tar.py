import io
import tarfile

import pytest

from wds_tools.format.tar import TarHeaderError, parse_header, scan_file, walk_headers
from wds_tools.format.tarwrite import ShardWriter


@pytest.fixture
def shard(tmp_path):
    w = ShardWriter(str(tmp_path / "s.tar"))
    for i in range(6):
        w.add(f"k{i}.cls", str(i).encode())
        w.add(f"k{i}.json", b"{" + b"x" * (300 * i) + b"}")  # some cross 512-byte blocks
        w.add(f"k{i}.npy", bytes(range(256)) * (i + 1))
    w.close()
    return tmp_path / "s.tar"


def _tarfile_members(path):
    with tarfile.open(path) as tf:
        return [(m.name, m.offset_data, m.size, tf.extractfile(m).read()) for m in tf.getmembers()]


@pytest.mark.parametrize("chunk", [512, 1024, 1536, 4096, 1 << 20])
def test_walker_matches_tarfile_at_any_chunk_size(shard, chunk):
    want = _tarfile_members(shard)
    w = scan_file(shard, lambda n: -1 if n.endswith(".json") else 16, chunk=chunk)
    assert w.error is None and w.ended
    assert [(m.name, m.offset, m.size) for m in w.members] == [(n, o, s) for n, o, s, _ in want]
    assert [m.data for m in w.members] == [d if n.endswith(".json") else d[:16] for n, _, _, d in want]
    h = walk_headers(shard, lambda n: 16, window=1024)
    assert [(m.name, m.offset, m.size, m.data) for m in h.members] == [(n, o, s, d[:16]) for n, o, s, d in want]


def test_truncation_and_bad_headers(shard, tmp_path):
    data = shard.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:2000])
    for w in (scan_file(cut), walk_headers(cut)):
        assert w.error and w.error.startswith("truncated")
    cut.write_bytes(data[:1024 + 100])  # inside the second header
    assert "inside the header at 1024" in scan_file(cut).error
    bad = bytearray(data)
    bad[1024 + 5] ^= 1
    with pytest.raises(TarHeaderError, match="offset 1024 fails its checksum"):
        parse_header(bytes(bad[1024:1536]), 1024)
    assert parse_header(bytes(512)) is None
    with pytest.raises(TarHeaderError, match="no ustar header at offset 7"):
        parse_header(b"x" * 512, 7)


def test_pax_records_are_refused(tmp_path):
    p = tmp_path / "pax.tar"
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("k." + "n" * 120)  # a long name needs a PAX record
        info.size = 1
        tf.addfile(info, io.BytesIO(b"1"))
    w = scan_file(p)
    assert w.members == [] and "has type b'x'" in w.error and "regular files only" in w.error


def test_header_byte_sum_is_exact_for_any_block():
    import random

    from wds_tools.format.tar import _byte_sum

    rng = random.Random(0)
    blocks = [bytes(512), b"\xff" * 512, b"\xff" * 256 + bytes(256)]
    blocks += [bytes(rng.randrange(256) for _ in range(512)) for _ in range(200)]
    for b in blocks:
        assert _byte_sum(b) == sum(b)


def test_a_header_checksum_off_by_one_is_caught(shard):
    data = bytearray(shard.read_bytes())
    data[0] ^= 1  # the first member's name changes by one bit: the sum differs by one
    with pytest.raises(TarHeaderError, match="checksum"):
        parse_header(bytes(data[:512]), 0)
