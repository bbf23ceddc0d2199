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
    assert batch_size(43, workers, 48 * 48 * 3) < 43  # the shard really was cut into batches
    assert _files(tmp_path / "many/v1/48") == _files(tmp_path / "one/v1/48")


def test_batch_size():
    assert batch_size(60, 2, 224 * 224 * 3) == 8  # a quarter of each worker's share of what remains
    assert batch_size(5, 2, 224 * 224 * 3) == 1  # ...down to single samples at the end
    assert batch_size(370_000, 16, 224 * 224 * 3) == 32  # at most 32 samples
    assert batch_size(370_000, 16, 384 * 384 * 3) == 18  # at most 8 MiB of pixels (18 x 442 kB)
    assert batch_size(10_000, 4, 2048 * 2048 * 3) == 1  # at most 8 MiB of pixels
    assert batch_size(3, 8, 100) == 1


def test_pieces_cover_every_sample_once_in_plan_order():
    from wds_tools.convert.decode import DecodeSettings
    from wds_tools.convert.schedule import _pieces
    from wds_tools.convert.write import SampleTask, ShardTask

    def task(name, n):
        return ShardTask(
            "d",
            "w",
            name,
            "train",
            "",
            32,
            "center-crop",
            DecodeSettings(),
            tuple(SampleTask(f"{name}{i}", "p", "p", 0, "a", i, None) for i in range(n)),
        )

    tasks = [task("a", 37), task("b", 5), task("c", 21)]
    pieces = _pieces(tasks, 2, 32 * 32 * 3)
    keys = [s.key for t, lo, hi in pieces for s in t.samples[lo:hi]]
    assert keys == [s.key for t in tasks for s in t.samples]
    sizes = [hi - lo for _, lo, hi in pieces]
    assert sizes[0] == 8 and sizes[-1] == 1 and max(sizes) <= 32
