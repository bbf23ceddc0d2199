"""The worker side of writing: a batch's fragment against the references (stock tarfile, decode_image, numpy)."""

import io
import json
import tarfile

import numpy as np
import pytest
from conftest import make_images

from wds_tools.convert.decode import DecodeSettings, decode_image
from wds_tools.convert.write import SampleTask, ShardTask, _histogram, _span, encode_batch


@pytest.mark.parametrize("low, high", [(0, 256), (100, 108), (37, 38), (0, 1), (255, 256)])
def test_histogram_and_span_equal_numpys(low, high):
    rng = np.random.default_rng(low)
    pixels = rng.integers(low, high, (24, 24, 3), dtype=np.uint8)
    pixels[0, 0] = (low, high - 1, low)
    stored = np.frombuffer(pixels.tobytes(), dtype=np.uint8).reshape(24, 24, 3)  # read-only, as reused pixels are
    for px in (pixels, stored):
        want = np.concatenate([np.bincount(px[..., c].ravel(), minlength=256) for c in range(3)])
        got = _histogram(px)
        assert got.dtype == np.int64 and np.array_equal(got, want)
        assert _span(got) == (int(px.min()), int(px.max()))


def _task(root, n, side=32):
    rows = make_images(root, n)
    samples = tuple(
        SampleTask(r["key"], str(root / r["path"]), r["path"], i % 3, "abc"[i % 3], i + 2, None)
        for i, r in enumerate(rows)
    )
    return ShardTask(
        str(root), str(root), "train-000000.tar", "train", "0" * 64, side, "center-crop", DecodeSettings(), samples
    )


def test_a_batch_fragment_holds_each_sample_as_decode_image_makes_it(tmp_path):
    """Read with stock tarfile, sample by sample: key, label, .json and pixels as ``decode_image`` gives
    them alone; the rows' places point at those bytes."""
    task = _task(tmp_path, 5)
    enc = encode_batch(task, 0, 5)
    assert enc.slot is None and len(enc.data) == enc.nbytes  # one process: the bytes travel in the result
    data = bytes(enc.data)
    with tarfile.open(fileobj=io.BytesIO(data + bytes(1024))) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf}
    assert len(members) == 4 * 5
    for s, row in zip(task.samples, enc.rows):
        ref = decode_image(open(s.path, "rb").read(), 32)
        npy = members[f"{s.key}.npy"]
        assert np.array_equal(np.load(io.BytesIO(npy)), ref.pixels)
        assert members[f"{s.key}.cls"] == str(s.label).encode()
        meta = json.loads(members[f"{s.key}.json"])
        assert (meta["key"], meta["label"], meta["width"], meta["height"]) == (s.key, s.label_name, 96, 72)
        (cls_at, cls_n), _, _, (npy_at, npy_n) = row.placed
        assert data[cls_at : cls_at + cls_n] == str(s.label).encode() and data[npy_at : npy_at + npy_n] == npy


def test_what_a_batch_returned_is_not_changed_by_the_next(tmp_path):
    task = _task(tmp_path, 6)
    first = encode_batch(task, 0, 3)
    kept = bytes(first.data)
    encode_batch(task, 3, 6)
    encode_batch(task, 0, 3)
    assert bytes(first.data) == kept
