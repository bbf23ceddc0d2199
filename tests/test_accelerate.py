"""The Hugging Face Accelerate recipe of docs/guide/accelerate.md, read from the page and run.

In processes started as torchrun starts them (gloo, CPU; ACCELERATE_USE_CPU=1, as ``accelerate launch --cpu``
sets it, without which Accelerate runs each process alone where there is no CUDA), 1 and 2 ranks, 0 and 2
loader workers: the
recipe saves its whole state (``save_state``, the loader registered for checkpointing) after every
batch; fresh processes load the one after the first batch, one mid-epoch and the one after an epoch's
last batch, and must see the uninterrupted run's keys from there on, rank by rank, batch by batch.
Each epoch holds every sample once across the ranks, each validation every val sample once; the recipe
as written (gradient accumulation 2) resumes exactly; a 2-rank state loaded on 1 rank loses and repeats
nothing. Two spawns of two processes run it all (world-1 runs go in those processes once their process
group is ended).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import once_per_run
from shardkit import build_dataset
from test_eval_coverage import tar_keys
from trainerkit import join_group, leave_group, load, once_each, recipe, save, spawn

from training_adapter import make_loader

B = 4
TRAIN = [[(j + t) % 3 for t in range(16)] for j in range(4)]  # 64 samples: 16 batches on 1 rank, 8 on each of 2
VAL = [[t % 3 for t in range(5)], [1, 2, 0, 1]]  # 9: on 2 ranks 5 and 4, so 2 batches and 1
STOPS = {1: (1, 7, 16), 2: (1, 3, 8)}  # states loaded: after the first batch, mid-epoch, the last batch
GUIDE = "docs/guide/accelerate.md"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("accelerate"), {"train": TRAIN, "val": VAL})


def _recipe() -> dict:
    ns: dict = {"__name__": "guide_recipe"}
    exec(compile(recipe(GUIDE, "accelerate"), f"{GUIDE} recipe", "exec"), ns)
    return ns


def test_prepare_hands_the_loader_back_and_it_can_be_registered(folder):
    """What the page says of prepare(): a ShardLoader is no torch DataLoader, so Accelerate leaves it as it is
    (it re-wraps DataLoaders, sharding them again); register_for_checkpointing takes it."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    try:
        accelerator = Accelerator(cpu=True)
        loader = make_loader(folder, batch_size=B, train=True, num_workers=0)
        model = torch.nn.Linear(2, 2)
        prepared_model, prepared_loader = accelerator.prepare(model, loader)
        assert prepared_loader is loader
        accelerator.register_for_checkpointing(loader)
        dl = accelerator.prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=2))
        assert dl is not None and type(dl).__name__ == "DataLoaderShard", "a torch DataLoader is re-wrapped"
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert "def train(" in recipe(GUIDE, "accelerate")


# --- in processes of their own ----------------------------------------------------------------------
def _run(job: dict, folder: str, run: str) -> dict:
    """One run of the page's recipe, whole or loaded from ``resume``; what each stage saw: train
    [epoch, keys] per batch, val [epoch, keys] per batch."""
    from accelerate.state import AcceleratorState

    seen: dict = {"train": [], "val": []}

    def on_batch(stage, epoch, batch):
        seen[stage].append([epoch, list(batch[-1])])

    AcceleratorState._reset_state(reset_partial_state=True)  # the singleton of the job before
    os.environ["ACCELERATE_USE_CPU"] = "1"  # as accelerate launch --cpu: one gloo group of the processes, no CUDA here
    seen["validated"] = _recipe()["train"](
        folder,
        f"{run}/{job['name']}",
        resume=job.get("resume"),
        batch_size=B,
        accumulate=job.get("accumulate", 1),
        save_every=job.get("save_every", 1_000_000),
        on_batch=on_batch,
        return_keys=True,
        num_workers=job["workers"],
    )
    seen["processes"] = AcceleratorState().num_processes
    return seen


def _rank_main(rank: int, world: int, run: str, group: str, folder: str, jobs: list[dict]) -> None:
    """The jobs on ``world`` ranks, then (the group ended) each world-1 job in the process its ``on`` names."""
    join_group(rank, world, group)
    for job in jobs:
        if job["world"] == world:
            save(run, job["name"], rank, _run(job, folder, run))
    leave_group()
    for job in jobs:
        if job["world"] == 1 and job["on"] == rank:
            save(run, job["name"], 0, _run(job, folder, run))


def _make_runs(folder: Path, run: Path) -> dict:
    every = dict(accumulate=1, save_every=1)  # a state after every batch
    before = [
        dict(name="full2-w0", world=2, workers=0, **every),
        dict(name="full2-w2", world=2, workers=2, **every),
        dict(name="recipe2", world=2, workers=0, accumulate=2, save_every=2),
        dict(name="full1-w0", world=1, on=0, workers=0, **every),
        dict(name="recipe1", world=1, on=0, workers=0, accumulate=2, save_every=2),
        dict(name="full1-w2", world=1, on=1, workers=2, **every),
    ]
    spawn(_rank_main, 2, run, str(folder), before)
    after = []
    for world in (2, 1):
        for w in (0, 2):
            for k in STOPS[world]:
                after.append(
                    dict(
                        name=f"resume{world}-w{w}-{k}",
                        world=world,
                        on=0 if w == 0 else 1,
                        workers=w,
                        resume=str(run / f"full{world}-w{w}" / f"step-{k}"),
                    )
                )
    after += [
        dict(name="elastic21", world=1, on=1, workers=0, resume=str(run / "full2-w0" / "step-3")),
        dict(name="recipe2-4", world=2, workers=0, accumulate=2, resume=str(run / "recipe2" / "step-4")),
        dict(name="recipe1-6", world=1, on=0, workers=0, accumulate=2, resume=str(run / "recipe1" / "step-6")),
    ]
    spawn(_rank_main, 2, run, str(folder), after)
    jobs = before + after
    return {j["name"]: load(run, j["name"], j["world"]) for j in jobs} | {"jobs": jobs}


@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory) -> dict:
    """Every spawned run of the tests below, made once per test run (conftest.once_per_run)."""
    return once_per_run(tmp_path_factory, "test_accelerate-runs", lambda tmp: _make_runs(folder, tmp))


def _train(seen: dict, epoch: int | None = None) -> list[list[str]]:
    return [keys for e, keys in seen["train"] if epoch is None or e == epoch]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact_in_a_fresh_process(runs, world, workers):
    """Loaded after the first batch, mid-epoch and after the epoch's last batch: every rank's batches from there
    on (the rest of epoch 0, then epoch 1) are the uninterrupted run's, key for key, in the same epochs."""
    full = runs[f"full{world}-w{workers}"]
    per_epoch = 16 // world
    for k in STOPS[world]:
        resumed = runs[f"resume{world}-w{workers}-{k}"]
        for r in range(world):
            assert len(_train(full[r])) == 2 * per_epoch
            assert resumed[r]["train"] == full[r]["train"][k:], f"rank {r}, resumed after batch {k}"


def test_each_sample_once_per_epoch_across_ranks(runs, folder):
    want = tar_keys(folder, "train")
    for name, world in (("full1-w0", 1), ("full1-w2", 1), ("full2-w0", 2), ("full2-w2", 2)):
        for epoch in (0, 1):
            keys = [k for r in range(world) for b in _train(runs[name][r], epoch) for k in b]
            assert once_each(keys, want) is None, f"{name} epoch {epoch}: {once_each(keys, want)}"
        assert _train(runs[name][0], 0) != _train(runs[name][0], 1), "each epoch its own order"


def test_every_validation_covers_the_val_split_once(runs, folder):
    """Each validation's keys over the ranks are the val split's, each once; the recipe's one reduce after the
    loop counts all 9 on every rank (with Accelerate not running the ranks as one group, 5 and 4)."""
    val = tar_keys(folder, "val")
    for job in runs["jobs"]:
        for seen in runs[job["name"]]:
            assert seen["processes"] == job["world"], job["name"]
            assert seen["validated"][1] == len(val), f"{job['name']}: the reduce counted {seen['validated'][1]}"
        by_epoch: dict[int, list[str]] = {}
        for seen in runs[job["name"]]:
            for epoch, keys in seen["val"]:
                by_epoch.setdefault(epoch, []).extend(keys)
        assert by_epoch, job["name"]
        for epoch, keys in by_epoch.items():
            assert once_each(keys, val) is None, f"{job['name']} epoch {epoch}: {once_each(keys, val)}"
    two = runs["full2-w0"]
    assert [len(b) for _, b in two[0]["val"]] == [4, 1] * 2 and [len(b) for _, b in two[1]["val"]] == [4] * 2


def test_the_recipe_as_written_resumes_exactly(runs):
    """Gradient accumulation 2, a state every 2 batches after the optimizer step: loaded after batch 6 (1 rank)
    and after batch 4 of each of 2 ranks, the batches are the uninterrupted run's."""
    assert runs["recipe1-6"][0]["train"] == runs["recipe1"][0]["train"][6:]
    for r in range(2):
        assert runs["recipe2-4"][r]["train"] == runs["recipe2"][r]["train"][4:]


def test_a_two_rank_state_loaded_on_one_rank_loses_and_repeats_nothing(runs, folder):
    """Stopped after 3 batches on each of 2 ranks (24 samples), loaded on 1: the other 40 of epoch 0, each once;
    epoch 1 is the one-rank run's own."""
    full, resumed = runs["full2-w0"], runs["elastic21"][0]
    before = [k for r in range(2) for b in _train(full[r], 0)[:3] for k in b]
    after = [k for b in _train(resumed, 0) for k in b]
    assert len(before) == 24 and len(after) == 40
    assert once_each(before + after, tar_keys(folder, "train")) is None, once_each(before + after, [])
    assert _train(resumed, 1) == _train(runs["full1-w0"][0], 1)
