"""Decoding in batches across the workers, placed in plan order and written by the workers: the same bytes
as one process."""

import shutil
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


# ------------------------------------------------------------------ every worker count and byte path: one process's bytes

CONFIGS = {
    "workers-2": (2, None),
    "workers-3": (3, None),
    "default-workers": (None, None),  # what a user gets: the usable cores
    "no-shared-memory": (2, "no_shared"),  # a spawned pool's path: fragments come back by pipe, written here
    "slots-too-small": (2, "small_slots"),  # some batches fit a slot, others come back by pipe
    "two-slots": (2, "two_slots"),  # every slot reused as soon as its bytes are written
    "spawned-pool": (2, "spawn"),
}
MODES = ("single", "incremental", "multi")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """A corpus with a scan failure and a decode failure, and its one-process conversions: one size, two
    sizes, and a version 2 (added, relabeled and changed rows) on the one-size version 1."""
    root = tmp_path_factory.mktemp("matrix")
    rows = make_images(root / "c", 36)
    rows, more = rows[:30], rows[30:]
    rows[3]["path"] = "img/missing.jpg"
    (root / "c" / rows[20]["path"]).write_bytes(b"\xff\xd8\xff\xe0 not a JPEG after its first bytes")
    v1 = write_manifest(root / "c" / "v1.csv", rows)
    v2_rows = rows[4:] + more
    v2_rows[10] = {**v2_rows[10], "label": "b" if v2_rows[10]["label"] != "b" else "a"}  # relabeled
    (root / "c" / "img" / "changed.jpg").write_bytes((root / "c" / rows[25]["path"]).read_bytes())
    v2_rows[25 - 4] = {**v2_rows[25 - 4], "path": "img/changed.jpg"}
    v2 = write_manifest(root / "c" / "v2.csv", v2_rows)
    run = {"single": (v1, "v1", 32), "multi": (v1, "v1", "48,32"), "incremental": (v2, "v2", 32)}
    counts = {}
    for mode, (manifest, version, size) in run.items():
        ref = root / "ref" / mode
        if mode == "incremental":  # on version 1 at 32 px, the single mode's conversion
            for out in (ref, root / "bases"):
                shutil.copytree(root / "ref" / "single" / "v1", out / "v1")
        res = convert(manifest, version=version, size=size, out=ref, **_COMMON, workers=1)
        counts[mode] = [(r.failed, r.samples_written) for r in getattr(res, "results", [res])]
    assert counts["single"] == [(2, 28)]  # a scan and a decode failure
    return root, run, counts


_OPTIONS = dict(shard_size=7, max_errors=2)
_COMMON = dict(**_OPTIONS, progress=False)


def _folders(out, version, size):
    sides = [int(s) for s in str(size).split(",")]
    return {side: _files(out / version / str(side)) for side in sides}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_worker_count_and_byte_path_writes_one_process_bytes(matrix, tmp_path, config):
    """Every shard, samples.npz, index.json and sidecar equals the one-process run's, byte for byte, for
    one size, two sizes at once (the spill's bytes ride in the fragments) and an incremental version:
    with the default workers, with 2 and 3, down each path a fragment can take, and with a spawned pool.
    The three conversions run one after the other in a fresh process (pooled.py: its pool forks, as the
    command's does, with the shared memory; under pytest-xdist this process has threads and would spawn
    one), each with its own pool."""
    import pooled

    root, run, counts = matrix
    workers, how = CONFIGS[config]
    runs = []
    for mode in MODES:
        manifest, version, size = run[mode]
        out = tmp_path / mode
        if mode == "incremental":
            shutil.copytree(root / "bases" / "v1", out / "v1")  # the base, as a one-process run wrote it
        runs.append(dict(manifest=str(manifest), out=str(out), version=version, size=size, workers=workers))
        runs[-1]["options"] = _OPTIONS
    got = pooled.run(dict(how=how, runs=runs))["runs"]
    for mode, one in zip(MODES, got):
        _, version, size = run[mode]
        assert one["method"] == ("spawn" if how == "spawn" else "fork"), (mode, one)
        results, paths = one["results"], one["paths"]
        assert [(r["failed"], r["samples_written"]) for r in results] == counts[mode], mode
        if mode == "incremental":
            assert results[0]["reused"] > 0 and results[0]["decoded"] > 0  # copied from the base and decoded
        if mode == "multi":
            assert results[1]["decodes"] == 0  # the 32 px pixels came from the 48 px run's spill
        # the byte path each batch took: a slot of shared memory, or back with its result
        if how in ("no_shared", "spawn"):
            assert paths["slot"] == 0 and paths["pipe"] > 0, (mode, paths)
        elif how == "small_slots":
            assert paths["slot"] > 0 and paths["pipe"] > 0, (mode, paths)
        elif workers is not None:
            assert paths["slot"] > 0 and paths["pipe"] == 0, (mode, paths)
        # the progress bar (one per size) reaches its total, never passes it, and counts a shard before it is done
        assert len(one["progress"]) == len(results), (mode, one["progress"])
        for bar in one["progress"]:
            assert bar["counted"] == bar["total"] > 0 and not bar["past_total"] and not bar["done_early"], (mode, bar)
        assert _folders(tmp_path / mode, version, size) == _folders(root / "ref" / mode, version, size), mode
        assert not [p.name for p in (tmp_path / mode / version).rglob("*") if ".partial-" in p.name], mode
