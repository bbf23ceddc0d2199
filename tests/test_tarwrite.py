import hashlib
import io
import os
import tarfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.format.npy import npy_header
from wds_tools.format.tarwrite import SIZE_MAX, ShardWriter, member_header, partial_path, seal


def test_writer_offsets_ustar_and_atomic_rename(tmp_path):
    path = str(tmp_path / "s.tar")
    arr = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    w = ShardWriter(path)
    assert os.path.exists(partial_path(path)) and not os.path.exists(path)
    cls = w.add("k1.cls", b"7")
    npy = w.add("k1.npy", npy_header(arr.shape), arr.reshape(-1).data)
    nbytes, sha = w.close()
    data = open(path, "rb").read()
    assert not os.path.exists(partial_path(path))
    assert nbytes == len(data) and len(data) % 10240 == 0
    assert sha == hashlib.sha256(data).hexdigest()
    assert data[cls[0] : cls[0] + cls[1]] == b"7"
    assert np.array_equal(np.load(io.BytesIO(data[npy[0] : npy[0] + npy[1]])), arr)
    with tarfile.open(path) as tf:
        members = tf.getmembers()
        assert [m.name for m in members] == ["k1.cls", "k1.npy"]
        assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" and not m.pax_headers for m in members)
        assert [m.offset_data for m in members] == [cls[0], npy[0]]


def test_npy_header_matches_numpy_and_is_aligned():
    arr = np.zeros((224, 224, 3), np.uint8)
    buf = io.BytesIO()
    np.save(buf, arr)
    header = npy_header((224, 224, 3))
    assert buf.getvalue()[: len(header)] == header
    assert len(header) % 64 == 0


def test_abort_leaves_nothing(tmp_path):
    path = str(tmp_path / "s.tar")
    with pytest.raises(RuntimeError):
        with ShardWriter(path) as w:
            w.add("a.cls", b"1")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_a_block_that_ends_without_close_finishes_the_shard(tmp_path):
    path = str(tmp_path / "s.tar")
    with ShardWriter(path) as w:
        w.add("a.cls", b"1")
    assert w.closed and os.listdir(tmp_path) == ["s.tar"]  # no .partial left, no handle open
    with tarfile.open(path) as tf:
        assert [(m.name, tf.extractfile(m).read()) for m in tf] == [("a.cls", b"1")]
    with ShardWriter(path) as w:  # close() inside the block: __exit__ leaves the finished shard alone
        w.add("b.cls", b"2")
        w.close()
    assert os.listdir(tmp_path) == ["s.tar"]


# ------------------------------------------------------------------ the header template against stock tarfile

KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"  # format.names' key characters


def _tarfile_header(name: str, size: int) -> bytes:
    """The reference: a member header as stock ``tarfile`` writes it for the converter's members."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="ascii", errors="strict")


SIZES = [0, 1, 4, 127, 511, 512, 513, 1023, 1024, 1025, 128 + 224 * 224 * 3, 128 + 8192 * 8192 * 3, 2**32, SIZE_MAX]
NAMES = [
    "a.cls",  # a key of 1 character
    "A" * 95 + ".json",  # a key of 95 characters: the 100-byte name field full, no NUL after it
    "z" * 95 + ".npy",
    "_-09Zz.i32",  # the alphabet's edges
    "-" + "_" * 94 + ".cls",
    KEY_ALPHABET[:95] + ".i32",
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", SIZES)
def test_member_header_is_tarfiles_bytes(name, size):
    assert len(name) <= 100
    assert member_header(name, size) == member_header(name.encode(), size) == _tarfile_header(name, size)


@given(
    key=st.text(alphabet=KEY_ALPHABET, min_size=1, max_size=95),
    ext=st.sampled_from(["cls", "i32", "json", "npy"]),
    size=st.integers(min_value=0, max_value=SIZE_MAX),
)
@settings(max_examples=300, deadline=None)
def test_member_header_matches_tarfile_for_any_key_and_size(key, ext, size):
    name = f"{key}.{ext}"[:100]
    assert member_header(name, size) == _tarfile_header(name, size)


def test_member_header_refuses_what_ustar_cannot_hold():
    # ustar's size field holds 11 octal digits: tarfile refuses a larger member too (no PAX/GNU records here)
    with pytest.raises(ValueError, match="overflow"):
        _tarfile_header("a.npy", SIZE_MAX + 1)
    with pytest.raises(ValueError, match=r"'a.npy' of 8589934592 bytes: a ustar member holds 0 to 8589934591 bytes"):
        member_header("a.npy", SIZE_MAX + 1)
    with pytest.raises(ValueError, match="0 to 8589934591 bytes"):
        member_header("a.npy", -1)
    with pytest.raises(ValueError, match="1 to 100 ASCII bytes"):
        member_header("k" * 96 + ".json", 1)  # 101 bytes: tarfile would move part of it to the prefix field
    with pytest.raises(ValueError, match="1 to 100 ASCII bytes"):
        member_header(b"", 1)
    with pytest.raises(ValueError, match="1 to 100 ASCII bytes"):
        member_header(b"a\0.cls", 1)
    with pytest.raises(ValueError):  # UnicodeEncodeError: not ASCII
        member_header("é.cls", 1)


def test_shard_writer_writes_what_tarfile_writes(tmp_path):
    """A whole archive, end blocks and record padding included, against stock tarfile's."""
    members = [
        ("a.cls", b"7"),
        ("a.i32", b"\x07\x00\x00\x00"),
        ("a.json", b"{}" * 300),
        ("b" * 95 + ".npy", bytes(1025)),
    ]
    ours = str(tmp_path / "ours.tar")
    with ShardWriter(ours) as w:
        for name, data in members:
            w.add(name, data)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
    assert open(ours, "rb").read() == buf.getvalue()


def test_reserve_end_and_seal(tmp_path):
    """Members left to another writer (``reserve`` + ``write_at``), then ``end`` and ``seal`` in any order of
    writes: the bytes and sha256 of a shard written in one go."""
    from wds_tools.format.tarwrite import seal, write_at

    one = ShardWriter(str(tmp_path / "one.tar"))
    a, b = one.add("a.cls", b"1"), one.add("b.cls", b"22")
    nbytes, sha = one.close()
    frag_a = (tmp_path / "one.tar").read_bytes()[: a[0] + 512]
    frag_b = (tmp_path / "one.tar").read_bytes()[a[0] + 512 : b[0] + 512]
    two = ShardWriter(str(tmp_path / "two.tar"), digest=False)
    at_a, at_b = two.reserve(len(frag_a)), two.reserve(len(frag_b))
    assert two.end() == nbytes  # the end blocks go first: the reserved ranges are written after
    fd = os.open(two.tmp, os.O_WRONLY)
    write_at(fd, frag_b, at_b)
    write_at(fd, frag_a, at_a)
    os.close(fd)
    assert seal(two.tmp, two.path, nbytes) == sha
    assert (tmp_path / "two.tar").read_bytes() == (tmp_path / "one.tar").read_bytes()
    assert not os.path.exists(two.tmp)
    with pytest.raises(ValueError, match="not whole 512-byte blocks"):
        ShardWriter(str(tmp_path / "x.tar"), digest=False).reserve(100)
    with pytest.raises(ValueError, match="cannot leave bytes to others"):
        ShardWriter(str(tmp_path / "y.tar")).reserve(512)


def test_seal_refuses_a_file_of_another_length(tmp_path):
    from wds_tools.format.tarwrite import seal

    w = ShardWriter(str(tmp_path / "s.tar"), digest=False)
    w.add("a.cls", b"1")
    n = w.end()
    with pytest.raises(OSError, match=rf"is {n} bytes, {n + 512} were written"):
        seal(w.tmp, w.path, n + 512)
    assert not os.path.exists(w.path)  # not renamed into place


def _record_syncs(monkeypatch) -> list[tuple]:
    """Every os.fsync and os.replace, in order: ("fsync", (dev, inode), is a folder) and ("replace", dst)."""
    import stat

    calls: list[tuple] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        st = os.fstat(fd)
        calls.append(("fsync", (st.st_dev, st.st_ino), stat.S_ISDIR(st.st_mode)))
        return fsync(fd)

    def recording_replace(src, dst):
        calls.append(("replace", os.fspath(dst)))
        return replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    return calls


def _folder_id(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_a_published_shard_and_index_sync_their_folder_after_the_rename(tmp_path, monkeypatch):
    """A rename is durable only once the folder holding the new name is synced: the shard's bytes are
    synced, then renamed, then its folder synced (``ShardWriter.close``, ``seal``), as is an index
    file's (``atomic_write_bytes``)."""
    from wds_tools.storage.fsutil import atomic_write_bytes

    out = tmp_path / "v1" / "224"
    out.mkdir(parents=True)
    folder = _folder_id(out)
    calls = _record_syncs(monkeypatch)
    with ShardWriter(str(out / "train-000000.tar")) as w:
        w.add("a.cls", b"0")
    w2 = ShardWriter(str(out / "train-000001.tar"), digest=False)
    w2.add("b.cls", b"1")
    n = w2.end()
    seal(w2.tmp, str(out / "train-000001.tar"), n)
    atomic_write_bytes(out / "index.json", b"{}")
    for name in ("train-000000.tar", "train-000001.tar", "index.json"):
        at = calls.index(("replace", str(out / name)))
        assert calls[at - 1][0] == "fsync" and not calls[at - 1][2], calls  # the file's bytes first
        assert calls[at + 1] == ("fsync", folder, True), calls  # then the folder that holds its new name
    assert sum(c == ("fsync", folder, True) for c in calls) == 3


def test_a_folder_that_cannot_be_synced_does_not_stop_the_write(tmp_path, monkeypatch):
    """Some network filesystems refuse fsync on a folder (EINVAL): the file is still written; another
    error (EIO: the disk failed) is raised."""
    import errno
    import stat

    from wds_tools.storage.fsutil import atomic_write_bytes

    fsync = os.fsync

    def refusing(code):
        def f(fd):
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                raise OSError(code, os.strerror(code))
            return fsync(fd)

        return f

    monkeypatch.setattr(os, "fsync", refusing(errno.EINVAL))
    atomic_write_bytes(tmp_path / "a.json", b"1")
    assert (tmp_path / "a.json").read_bytes() == b"1"
    monkeypatch.setattr(os, "fsync", refusing(errno.EIO))
    with pytest.raises(OSError, match="Input/output error"):
        atomic_write_bytes(tmp_path / "b.json", b"2")
