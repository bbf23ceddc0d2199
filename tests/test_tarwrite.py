import hashlib
import io
import os
import tarfile

import numpy as np
import pytest

from wds_tools.format.npy import npy_header
from wds_tools.format.tarwrite import ShardWriter, partial_path


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
