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
    cut.write_bytes(data[: 1024 + 100])  # inside the second header
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


# --- fuzzing: every malformed input ends, in a ShardError naming URL and offset or a recorded error ------
import contextlib  # noqa: E402
import signal  # noqa: E402

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from wds_tools.errors import ShardError  # noqa: E402
from wds_tools.format import tar as tarmod  # noqa: E402
from wds_tools.format.tar import TarWalker, group_samples, iter_members, pax_path  # noqa: E402


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail (instead of hanging the suite) when the body runs longer than ``seconds``."""

    def hang(signum, frame):
        raise TimeoutError(f"no result after {seconds} s: the reader does not terminate")

    old = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _header(name: bytes, size: int, kind: bytes = b"0") -> bytearray:
    info = tarfile.TarInfo(name.decode("latin-1"))
    info.size, info.type = size, kind
    return bytearray(info.tobuf(format=tarfile.USTAR_FORMAT, encoding="latin-1"))


def _fix_checksum(block: bytearray) -> bytearray:
    block[148:156] = b"        "
    block[148:156] = f"{sum(block):06o}\0 ".encode()
    return block


def _member(name: bytes, data: bytes, kind: bytes = b"0") -> bytes:
    return bytes(_header(name, len(data), kind)) + data + bytes(-len(data) % 512)


def _sample(key: bytes, label: bytes, pixels: bytes) -> bytes:
    from wds_tools.format.npy import npy_header

    return (
        _member(key + b".cls", label)
        + _member(key + b".json", b'{"k":1}')
        + _member(key + b".npy", npy_header((4, 4, 3)) + pixels)
    )


BASE = b"".join(_sample(b"k%d" % i, b"%d" % i, bytes(range(i, i + 48))) for i in range(4))  # no end blocks yet

# Parts a crafted shard is made of: whole well-formed samples, and records tarfile would write or
# damage would leave (PAX and GNU records with arbitrary bodies, headers with arbitrary fields).
_NUMBER = st.one_of(
    st.integers(0, 10**12).map(lambda n: b"%011o" % n),
    st.binary(min_size=1, max_size=12),
    st.sampled_from(
        [
            b"-0000001000",
            b"-1",
            b"+777",
            b"1_0",
            b"7" * 12,
            b"\xff" * 12,
            b"\x80" + bytes(10) + b"\x01",
            b"\x80" + b"\x7f" * 11,
            b" 17 ",
            b"",
        ]
    ),
)
_KIND = st.sampled_from([b"0", b"\0", b"7", b"x", b"g", b"L", b"K", b"5", b"2", b"1", b"S", b"Z"])
_PAX_RECORD = st.one_of(
    st.binary(max_size=80),
    st.builds(
        lambda n, k, v: b"%d %s=%s\n" % (n, k, v),
        st.integers(0, 200),
        st.sampled_from([b"path", b"size", b"x"]),
        st.binary(max_size=40),
    ),
    st.sampled_from([b"0 path=x\n", b"00000000000000000000000 path=x\n", b"5 a=b\n", b"1 \n", b"99999999999999 p=q\n"]),
)
_PART = st.one_of(
    st.builds(_sample, st.sampled_from([b"a", b"b/c", b"d.e"]), st.binary(max_size=30), st.binary(max_size=100)),
    st.builds(
        lambda recs, kind: _member(b"PaxHeader/x", b"".join(recs), kind),
        st.lists(_PAX_RECORD, max_size=3),
        st.sampled_from([b"x", b"g"]),
    ),
    st.builds(lambda body: _member(b"././@LongLink", body, b"L"), st.binary(max_size=200)),
    st.builds(
        lambda name, size, kind, body: bytes(_fix_checksum(_set(_header(name, 0, b"0"), 124, size, kind))) + body,
        st.binary(min_size=1, max_size=99),
        _NUMBER,
        _KIND,
        st.binary(max_size=1100),
    ),
)


def _set(block: bytearray, at: int, value: bytes, kind: bytes) -> bytearray:
    block[at : at + 12] = value[:12].ljust(12, b"\0")
    block[156:157] = kind
    return block


class _Counting(io.BytesIO):
    read_bytes = 0

    def readinto(self, b):
        n = super().readinto(b)
        self.read_bytes += n
        return n


def _stream_read(data: bytes) -> tuple[list, ShardError | None, int]:
    stream = _Counting(data)
    got, err = [], None
    try:
        for key, members, offset in group_samples(iter_members(stream, "fuzz.tar", chunk_size=1024), "fuzz.tar"):
            got.append((key, {k: bytes(v) for k, v in members.items()}, offset))
    except ShardError as e:
        err = e
    return got, err, stream.read_bytes


def _walk(data: bytes, path) -> list[TarWalker]:
    path.write_bytes(data)
    return [
        scan_file(path, lambda n: -1, chunk=512),
        scan_file(path, chunk=1 << 20),
        walk_headers(path, lambda n: 16, window=1024),
    ]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(_PART, max_size=5),
    cut=st.one_of(st.none(), st.integers(0, 4000)),
    flips=st.lists(st.tuples(st.integers(0, 6000), st.integers(1, 255)), max_size=3),
    end=st.sampled_from([bytes(1024), bytes(512), b""]),
)
@example(parts=[_member(b"PaxHeader/x", b"0 path=x\n")], cut=None, flips=[], end=bytes(1024))  # looped for ever
@example(
    parts=[bytes(_fix_checksum(_set(_header(b"d", 0), 124, b"-0000001000", b"5")))], cut=None, flips=[], end=bytes(1024)
)  # a negative size moved the walk backwards, for ever
@example(parts=[bytes(_fix_checksum(_set(_header(b"d", 0), 124, b"-1000", b"L")))], cut=None, flips=[], end=bytes(1024))
def test_fuzzed_tars_end_in_a_shard_error_or_a_recorded_error(tmp_path, monkeypatch, parts, cut, flips, end):
    """Crafted and damaged tars (headers with any size and type, PAX and GNU records with any body,
    truncations, flipped bytes): the streaming reader either reads them or raises ShardError naming
    the URL and a byte offset inside the file; the strict walkers record an error; nothing hangs or
    raises anything else. Work is bounded by the bytes read: at most one header decoded per
    512-byte block the reader took from the stream."""
    data = bytearray(BASE + b"".join(parts) + end)
    if cut is not None:
        data = data[:cut]
    for at, x in flips:
        if at < len(data):
            data[at] ^= x
    data = bytes(data)
    decoded = [0]
    real = tarmod.decode_header

    def counted(block, pos=0):
        decoded[0] += 1
        return real(block, pos)

    monkeypatch.setattr(tarmod, "decode_header", counted)
    with deadline(10):
        got, err, read = _stream_read(data)
    assert decoded[0] <= read // 512 + 1, "more headers decoded than blocks read"
    if err is not None:
        assert err.url == "fuzz.tar" and str(err).startswith("fuzz.tar: ")
        assert isinstance(err.offset, int) and 0 <= err.offset <= len(data), err
        assert f"byte {err.offset}" in str(err)
    monkeypatch.setattr(tarmod, "decode_header", real)
    with deadline(10):
        walkers = _walk(data, tmp_path / "fuzz.tar")
    for w in walkers:
        assert (w.error is None) == w.ended
        assert w.error is None or (isinstance(w.error_offset, int) and 0 <= w.error_offset <= len(data))


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(st.binary(max_size=300), st.lists(_PAX_RECORD, max_size=6).map(b"".join)))
def test_pax_records_end_in_a_path_or_a_value_error(body):
    """Any PAX body: a path, None, or ValueError (never a hang or another exception); each record
    consumed advances by its own length, at least 5 bytes ("5 k=\\n")."""
    with deadline(5):
        try:
            path = pax_path(memoryview(body))
        except ValueError:
            return
    assert path is None or isinstance(path, str)


@pytest.mark.parametrize(
    "field, value",
    [(124, b"-0000001000"), (124, b"+0000001000"), (124, b"0000_001000"), (124, b"\xff" * 12), (124, b"00000001x00")],
)
def test_header_numbers_are_octal_digits_and_never_negative(field, value):
    block = _fix_checksum(_set(_header(b"k.cls", 0), field, value, b"0"))
    with pytest.raises(TarHeaderError, match=r"bad size field .* in the header at offset 512"):
        parse_header(bytes(block), 512)
    ok = _fix_checksum(_set(_header(b"k.cls", 0), field, b"\x80" + (5 << 33).to_bytes(11, "big"), b"0"))
    assert parse_header(bytes(ok), 0) == ("k.cls", 5 << 33)  # GNU base-256, positive
