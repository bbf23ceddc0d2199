"""Issue 22, point 6 (the loader): no silent empty epoch (row 5), and evaluation covers every sample
exactly once across ranks (row 6), with ``loader.num_samples`` per rank; both readers. The expected
keys come from stock ``tarfile``; ranks are set as torch.distributed's launchers set them (RANK,
WORLD_SIZE), plus one real two-process gloo run."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from conftest import convert_images

from wds_tools.errors import OptionError

torch = pytest.importorskip("torch")
from training_adapter import make_loader  # noqa: E402

READERS = ("index", "stream")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """13 samples: train 11 in 4 shards of up to 3, val 2 in 1 shard (rows 5 and 6 of the issue)."""
    return convert_images(tmp_path_factory.mktemp("cover"), 13, size=16, shard_size=3, val_every=7)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """31 samples: val 11 in 4 shards of up to 3 (more val than ranks, not a multiple of 2 or 3)."""
    return convert_images(tmp_path_factory.mktemp("wide"), 31, size=16, shard_size=3, val_every=3)


def tar_keys(folder: Path, split: str) -> list[str]:
    """The sample keys of a split, read with stock tarfile (the key: a member name up to its first dot)."""
    keys = set()
    for path in sorted(folder.glob(f"{split}-*.tar")):
        with tarfile.open(path) as tf:
            keys |= {m.name.split(".", 1)[0] for m in tf.getmembers() if m.isfile()}
    return sorted(keys)


def _ranked(monkeypatch, rank: int, world: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


@pytest.mark.parametrize("reader", READERS)
def test_row_5_a_train_split_smaller_than_a_batch_is_refused_with_the_counts(folder, reader):
    assert len(tar_keys(folder, "train")) == 11
    with pytest.raises(
        OptionError,
        match=r"an epoch would have 0 batches: 11 samples, .*fewer than batch_size=64, "
        r"and drop_last=True drops a short batch; use batch_size <= \d+",
    ):
        make_loader(folder, batch_size=64, train=True, num_workers=0, reader=reader)
    ld = make_loader(folder, batch_size=64, train=True, num_workers=0, reader=reader, drop_last=False, return_keys=True)
    got = [k for b in _with_keys(ld) for k in b]
    assert len(ld) == 1 and sorted(got) == tar_keys(folder, "train") and ld.num_samples == 11


def test_row_5_streaming_workers_each_short_of_a_batch(folder):
    """11 samples, batch 7, 2 workers: the streaming reader batches per worker, each holds fewer than 7."""
    with pytest.raises(OptionError, match=r"0 batches: 11 samples, at most \d per worker.*fewer workers"):
        make_loader(folder, batch_size=7, train=True, num_workers=2, reader="stream")


def _with_keys(ld) -> list[list[str]]:
    return [list(b[-1]) for b in ld]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("which", ["folder", "wide"])
def test_row_6_eval_covers_every_sample_once_across_ranks(request, monkeypatch, reader, world, which):
    root = request.getfixturevalue(which)
    want = tar_keys(root, "val")
    seen: list[str] = []
    for rank in range(world):
        _ranked(monkeypatch, rank, world)
        ld = make_loader(root, batch_size=2, train=False, num_workers=0, reader=reader, return_keys=True)
        mine = [k for b in _with_keys(ld) for k in b]
        assert ld.num_samples == len(mine), (rank, world)
        assert len(ld) == -(-len(mine) // 2) or reader == "stream"
        seen += mine
    assert sorted(seen) == want, "every val sample exactly once across the ranks"


@pytest.mark.parametrize("reader", READERS)
def test_eval_with_workers_covers_too(wide, monkeypatch, reader):
    want = tar_keys(wide, "val")
    seen = []
    for rank in range(2):
        _ranked(monkeypatch, rank, 2)
        ld = make_loader(wide, batch_size=2, train=False, num_workers=2, reader=reader, return_keys=True)
        seen += [k for b in _with_keys(ld) for k in b]
    assert sorted(seen) == want


def test_row_15_streaming_eval_on_more_ranks_than_shards_needs_no_advice(folder, monkeypatch):
    """3 ranks, a val split of 1 shard: evaluation reads it on one rank (no resampled=True advice)."""
    seen = []
    for rank in range(3):
        _ranked(monkeypatch, rank, 3)
        ld = make_loader(folder, batch_size=4, train=False, reader="stream", return_keys=True)
        assert ld.num_workers == 1
        seen += [k for b in _with_keys(ld) for k in b]
    assert sorted(seen) == tar_keys(folder, "val")


def test_row_15_training_on_more_ranks_than_shards_gets_advice_that_applies(folder, monkeypatch):
    _ranked(monkeypatch, 0, 5)
    with pytest.raises(OptionError, match=r"4 shards cannot feed 5 ranks x 1 worker = 5 readers") as e:
        make_loader(folder, batch_size=1, train=True, reader="stream", num_workers=1)
    assert "num_workers <=" not in str(e.value)
    assert "smaller --shard-size" in str(e.value) and "resampled=True" in str(e.value)


def _rank_main(rank: int, world: int, init: str, folder: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        got = {}
        for reader in READERS:
            ld = make_loader(folder, batch_size=2, train=False, num_workers=0, reader=reader, return_keys=True)
            got[reader] = {"keys": [k for b in ld for k in b[-1]], "num_samples": ld.num_samples}
        Path(out, f"rank{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def test_gloo_eval_on_two_ranks_covers_every_sample(wide, tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    mp.spawn(_rank_main, args=(2, f"file://{tmp_path}/init", str(wide), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for reader in READERS:
        keys = [k for r in ranks for k in r[reader]["keys"]]
        assert sorted(keys) == tar_keys(wide, "val"), reader
        assert [r[reader]["num_samples"] for r in ranks] == [len(r[reader]["keys"]) for r in ranks]


def test_streaming_eval_skipping_a_damaged_shard_on_two_ranks_goes_on(wide, tmp_path, monkeypatch, caplog):
    """Evaluation ranks need not yield equal batch counts, so a skipped shard is a warning there, not an error."""
    import shutil

    root = Path(shutil.copytree(wide, tmp_path / "w"))
    bad = root / "val-000001.tar"
    bad.write_bytes(bad.read_bytes()[:3000])
    intact = set()
    for p in sorted(root.glob("val-*.tar")):
        if p != bad:
            with tarfile.open(p) as tf:
                intact |= {m.name.split(".", 1)[0] for m in tf.getmembers()}
    seen = []
    for rank in range(2):
        _ranked(monkeypatch, rank, 2)
        ld = make_loader(
            root, batch_size=2, train=False, num_workers=0, reader="stream", on_error="skip", return_keys=True
        )
        seen += [k for b in _with_keys(ld) for k in b]
    assert len(seen) == len(set(seen)) and intact <= set(seen) < set(tar_keys(wide, "val"))
    assert "val-000001.tar" in caplog.text
