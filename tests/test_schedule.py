"""Decoding in batches across the workers, appended in plan order: the same bytes as one process."""

from pathlib import Path

import pytest

from conftest import make_images, write_manifest
from wds_tools.convert import convert
from wds_tools.convert.schedule import batch_size


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("workers", [2, 3])
def test_fewer_shards_than_workers_gives_the_bytes_of_one_worker(tmp_path, workers):
    """One train shard (the default shard size) and more workers than shards: every worker
    decodes batches of that one shard; the shard equals a one-process conversion."""
    root = tmp_path / "c"
    rows = make_images(root, 45, size=(320, 240))
    rows[7]["path"] = "img/missing.jpg"  # a scan failure on the way
    good = (root / rows[9]["path"]).read_bytes()
    (root / rows[9]["path"]).write_bytes(good[: len(good) // 2])  # and a decode failure mid-shard
    manifest = write_manifest(root / "m.csv", rows)
    common = dict(version="v1", size=48, val_fraction=0.0, max_errors="2", progress=False)
    one = convert(manifest, out=tmp_path / "one", workers=1, **common)
    many = convert(manifest, out=tmp_path / "many", workers=workers, **common)
    assert one.shards == many.shards == 1 and many.samples_written == 43 and many.failed == 2
    assert batch_size(44, workers, 48 * 48 * 3) < 44  # the shard really was cut into batches
    assert _files(tmp_path / "many/v1/48") == _files(tmp_path / "one/v1/48")


def test_batch_size():
    assert batch_size(60, 2, 224 * 224 * 3) == 2  # ~16 batches per worker: the last ones spread
    assert batch_size(370_000, 16, 224 * 224 * 3) == 16  # at most 16 samples
    assert batch_size(10_000, 4, 2048 * 2048 * 3) == 1  # at most 8 MiB of pixels
    assert batch_size(3, 8, 100) == 1
