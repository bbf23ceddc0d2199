"""training_adapter.lightning: ShardDataModule under PyTorch Lightning's Trainer (docs/guide/lightning.md).

In processes started as torchrun starts them (gloo, CPU), 1 and 2 ranks, 0 and 2 loader workers, a tiny
model: uninterrupted fits save a Lightning checkpoint after every step; fresh processes resume from the
one after the first batch, one mid-epoch and the one after an epoch's last batch, and must see the
uninterrupted run's keys from there on, rank by rank, batch by batch. Each epoch holds every sample
once across the ranks; each validation, ``trainer.test`` and ``trainer.predict`` covers its split once
(the ranks' last batches uneven). The guide's recipe (accumulate_grad_batches, limit_train_batches,
val_check_interval mid-epoch) is read from the page and run the same way. A 2-rank checkpoint resumed
on 1 rank loses and repeats nothing. Two spawns of two processes run it all (world-1 runs go in those
processes once their process group is ended).
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from conftest import once_per_run
from shardkit import build_dataset
from test_eval_coverage import tar_keys
from torch import nn
from trainerkit import join_group, leave_group, load, once_each, recipe, save, spawn

from training_adapter import make_loader, to_device
from training_adapter.lightning import EVAL_DROPPED, ShardDataModule, TrainerLoader
from wds_tools.errors import ExtraNotInstalledError, IndexFormatError, OptionError

B = 4
TRAIN = [[(j + t) % 3 for t in range(16)] for j in range(4)]  # 64 samples: 16 batches on 1 rank, 8 on each of 2
VAL = [[t % 3 for t in range(5)], [1, 2, 0, 1]]  # 9: on 2 ranks 5 and 4, so 2 batches and 1
TEST = [[0, 1, 2, 0, 1]]
STOPS = {1: (1, 7, 16), 2: (1, 3, 8)}  # checkpoints resumed: after the first batch, mid-epoch, the last batch
GUIDE = "docs/guide/lightning.md"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("lightning"), {"train": TRAIN, "val": VAL, "test": TEST})


def _trainer(**kw) -> pl.Trainer:
    quiet = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    return pl.Trainer(**{"accelerator": "cpu", "devices": 1, **quiet, **kw})


# --- in this process ------------------------------------------------------------------------------
def test_without_lightning_the_import_names_the_extra(monkeypatch):
    monkeypatch.delitem(sys.modules, "training_adapter.lightning")
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)  # `import pytorch_lightning` raises ImportError
    with pytest.raises(ExtraNotInstalledError, match=r"pytorch-lightning==2\.6\.6 .*pip install -e '\.\[lightning\]'"):
        import training_adapter.lightning  # noqa: F401


def test_options_are_checked(folder):
    with pytest.raises(OptionError, match="no shards"):
        ShardDataModule(batch_size=4)
    with pytest.raises(OptionError, match="no batch_size"):
        ShardDataModule(folder)
    for name in ("train", "split"):
        with pytest.raises(OptionError, match=f"{name}= is the data module's"):
            ShardDataModule(folder, batch_size=4, **{name: "x"})
    dm, ref = ShardDataModule(folder, batch_size=4), make_loader(folder, batch_size=4, train=True)
    assert (dm.classes, dm.mean, dm.std) == (["a", "b", "c"], ref.mean, ref.std) and len(dm.mean) == 3


def test_the_splits_and_what_evaluation_leaves_out(folder):
    dm = ShardDataModule(
        folder,
        batch_size=4,
        num_workers=0,
        return_keys=True,
        augment=False,
        epoch_batches=2,
        drop_last=True,
        eval_options={"batch_size": 5},
    )
    for loader, split in (
        (dm.val_dataloader(), "val"),
        (dm.test_dataloader(), "test"),
        (dm.predict_dataloader(), "test"),
    ):
        keys = [k for b in loader for k in b[-1]]
        assert keys == tar_keys(folder, split), split  # every sample once, in index order: no epoch_batches cut
    assert [len(b[-1]) for b in dm.train_dataloader()] == [4, 4]  # epoch_batches=2 in training
    assert [len(b[-1]) for b in dm.val_dataloader()] == [5, 4]  # eval_options' batch_size
    assert set(EVAL_DROPPED) >= {"epoch_batches", "drop_last", "augment", "class_weights"}
    with pytest.raises(IndexFormatError, match="no split 'holdout'; the index has test, train, val"):
        ShardDataModule(folder, batch_size=4, predict_split="holdout").predict_dataloader()


def test_a_config_file_and_arguments_over_it(folder, tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(f'[dataset]\ntrain_urls = "{folder}"\nval_urls = "{folder}"\nbatch_size = 8\nnum_workers = 0\n')
    dm = ShardDataModule(config=config, return_keys=True)
    assert [len(b[-1]) for b in dm.train_dataloader()] == [8] * 8
    dm = ShardDataModule(config=config, batch_size=16, return_keys=True)
    assert [len(b[-1]) for b in dm.train_dataloader()] == [16] * 4
    assert [len(b[-1]) for b in dm.val_dataloader()] == [9]


def test_the_loader_takes_the_trainers_epoch_at_its_first_batch(folder):
    """Lightning makes an iterator it never reads (to check the loader is iterable): nothing may start then. At
    the first batch the loader is set to the trainer's epoch: epoch 3's order, as make_loader's set_epoch(3)."""
    dm = ShardDataModule(folder, batch_size=B, num_workers=0, return_keys=True)
    dm.trainer = _trainer()
    loader = dm.train_dataloader()
    assert isinstance(loader, TrainerLoader) and not hasattr(loader, "dataset")
    state = loader.state_dict()
    iter(loader)  # as Lightning's _check_dataloader_iterable does
    assert loader.state_dict() == state and loader.loader.epoch == 0
    dm.trainer.fit_loop.epoch_progress.current.processed = 3
    got = [b[-1] for b in loader]
    ref = make_loader(folder, batch_size=B, train=True, num_workers=0, return_keys=True)
    ref.set_epoch(3)
    assert got == [b[-1] for b in ref]
    assert len(loader) == len(ref) == 16


def test_limit_train_batches_becomes_the_loaders_epoch(folder):
    """Lightning's rule: an int is batches, a float the fraction of the length, rounded down; 1.0 is no limit."""
    for limit, want in ((5, 5), (0.75, 12), (0.5, 8), (1.0, 16), (40, 16)):
        dm = ShardDataModule(folder, batch_size=B, num_workers=0)
        dm.trainer = _trainer(limit_train_batches=limit)
        loader = dm.train_dataloader()
        assert len(loader) == 16 and len(list(loader)) == want, limit  # Lightning applies its limit to the 16
        assert loader.loader.dataset.options.epoch_batches == (want if want < 16 else None)


def test_ranks_that_are_not_the_trainers_are_refused(folder, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dm = ShardDataModule(folder, batch_size=B, num_workers=0)
    dm.trainer = _trainer()
    with pytest.raises(OptionError, match="rank 1 of 2 .* the trainer says rank 0 of 1"):
        dm.train_dataloader()


def test_default_workers_share_the_cores_among_the_trainers_devices(folder, monkeypatch):
    """Under Lightning's own launcher LOCAL_WORLD_SIZE is not set: the default num_workers is half the cores over
    the trainer's devices (16 cores, 2 devices: 4), no more than the rank's batches, as under torchrun."""
    import training_adapter.lightning as module

    monkeypatch.setattr(module, "usable_cpus", lambda: 16)
    monkeypatch.setattr("training_adapter.loader.usable_cpus", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dm = ShardDataModule(folder, batch_size=B)
    dm.trainer = _trainer(devices=2, strategy="ddp")
    assert dm.train_dataloader().loader.num_workers == 4
    assert ShardDataModule(folder, batch_size=B, num_workers=6).train_dataloader().loader.num_workers == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # torchrun's word: make_loader's default stands (8 batches)
    assert dm.train_dataloader().loader.num_workers == 8


def test_device_auto_batches_are_normalised_and_lightning_moves_nothing(folder):
    """device="auto": the trainer's root device (here the CPU), each batch to_device of the plain batch; Lightning's
    transfer_batch_to_device hands the same tensors back."""
    dm = ShardDataModule(folder, batch_size=B, num_workers=0, device="auto")
    dm.trainer = _trainer()
    plain = make_loader(folder, batch_size=B, train=False, num_workers=0)
    module = pl.LightningModule()
    for (x, y), (u, v) in zip(dm.val_dataloader(), plain, strict=True):
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x, to_device(u, "cpu", plain.mean, plain.std)) and torch.equal(y, v)
        moved = module.transfer_batch_to_device((x, y), dm.trainer.strategy.root_device, 0)
        assert moved[0] is x and moved[1] is y


def test_a_state_of_another_limit_is_refused_naming_it(folder):
    dm = ShardDataModule(folder, batch_size=B, num_workers=0)
    dm.trainer = _trainer(limit_train_batches=5)
    cut = dm.train_dataloader()
    it = iter(cut)
    next(it)
    state = cut.state_dict()
    dm.trainer = _trainer()
    with pytest.raises(OptionError, match="epoch_batches=5.*limit_train_batches of the interrupted run"):
        dm.train_dataloader().load_state_dict(state)


# --- in processes of their own ----------------------------------------------------------------------
class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(48, 3))

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0].float() / 255), batch[1])

    def validation_step(self, batch, batch_idx):
        pass

    def test_step(self, batch, batch_idx):
        pass

    def predict_step(self, batch, batch_idx):
        return batch[1]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Seen(pl.Callback):
    """The keys of every batch a stage gets: train [epoch, batch_idx, keys]; val [epoch, step, keys]; test, predict."""

    def __init__(self) -> None:
        self.seen: dict[str, list] = {"train": [], "val": [], "test": [], "predict": []}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.seen["train"].append([trainer.current_epoch, batch_idx, list(batch[-1])])

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.seen["val"].append([trainer.current_epoch, trainer.global_step, list(batch[-1])])

    def on_test_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self.seen["test"].append(list(batch[-1]))

    def on_predict_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self.seen["predict"].append(list(batch[-1]))


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _fit(job: dict, folder: str, world: int, run: str) -> dict:
    """One job: the tiny model's fit (``kind`` "fit") or the guide's recipe's (``kind`` "recipe"), whole or
    resumed from ``resume``, saving a checkpoint after every step where ``save`` says."""
    seen, logged = Seen(), Logged()
    logging.getLogger("training_adapter").addHandler(logged)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if job["kind"] == "recipe":
            ns: dict = {"__name__": "guide_recipe"}
            exec(compile(recipe(GUIDE, "lightning"), f"{GUIDE} recipe", "exec"), ns)
            ns["train"](
                folder,
                f"{run}/{job['name']}",
                resume=job.get("resume"),
                devices=world,
                batch_size=B,
                callbacks=[seen],
                return_keys=True,
                num_workers=job["workers"],
            )
        else:
            saves = [
                pl.callbacks.ModelCheckpoint(f"{run}/{job['name']}", "{step}", every_n_train_steps=1, save_top_k=-1)
            ]
            trainer = pl.Trainer(
                accelerator="cpu",
                devices=world,
                strategy="ddp" if world > 1 else "auto",
                max_epochs=2,
                logger=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                enable_checkpointing=bool(job.get("save")),
                callbacks=[seen, *(saves if job.get("save") else [])],
                default_root_dir=run,
            )
            data = ShardDataModule(folder, batch_size=B, num_workers=job["workers"], return_keys=True)
            model = Tiny()
            trainer.fit(model, datamodule=data, ckpt_path=job.get("resume"))
            if job.get("evaluate"):
                trainer.test(model, datamodule=data, verbose=False)
                trainer.predict(model, datamodule=data, return_predictions=False)
    logging.getLogger("training_adapter").removeHandler(logged)
    return {**seen.seen, "warnings": [str(w.message) for w in caught], "logged": logged.messages}


def _rank_main(rank: int, world: int, run: str, group: str, folder: str, jobs: list[dict]) -> None:
    """The jobs on ``world`` ranks, then (the group ended) each world-1 job in the process its ``on`` names."""
    join_group(rank, world, group)
    for job in jobs:
        if job["world"] == world:
            save(run, job["name"], rank, _fit(job, folder, world, run))
    leave_group()
    for job in jobs:
        if job["world"] == 1 and job["on"] == rank:
            save(run, job["name"], 0, _fit(job, folder, 1, run))


def _ckpt(run: Path, name: str, step: int) -> str:
    (found,) = [p for p in (run / name).glob("*.ckpt") if p.stem.endswith(f"step={step}")]
    return str(found)


def _make_runs(folder: Path, run: Path) -> dict:
    before = [
        dict(name="fit2-w0", kind="fit", world=2, workers=0, save=True, evaluate=True),
        dict(name="fit2-w2", kind="fit", world=2, workers=2, save=True),
        dict(name="recipe2", kind="recipe", world=2, workers=0),
        dict(name="fit1-w0", kind="fit", world=1, on=0, workers=0, save=True),
        dict(name="recipe1", kind="recipe", world=1, on=0, workers=2),
        dict(name="fit1-w2", kind="fit", world=1, on=1, workers=2, save=True),
    ]
    spawn(_rank_main, 2, run, str(folder), before)
    after = []
    for world, on in ((2, None), (1, 0)):
        for w in (0, 2):
            for k in STOPS[world]:
                src = f"fit{world}-w{w}"
                after.append(
                    dict(
                        name=f"resume{world}-w{w}-{k}",
                        kind="fit",
                        world=world,
                        on=on,
                        workers=w,
                        resume=_ckpt(run, src, k),
                    )
                )
    after[-3:] = [dict(j, on=1) for j in after[-3:]]  # world-1 resumes with 2 workers: in the other process
    after += [
        dict(name="elastic21", kind="fit", world=1, on=0, workers=0, resume=_ckpt(run, "fit2-w0", 3)),
        dict(name="elastic12", kind="fit", world=2, workers=0, resume=_ckpt(run, "fit1-w0", 7)),
        dict(name="recipe2-1", kind="recipe", world=2, workers=0, resume=_ckpt(run, "recipe2", 1)),
        dict(name="recipe1-3", kind="recipe", world=1, on=1, workers=2, resume=_ckpt(run, "recipe1", 3)),
        dict(name="recipe1-6", kind="recipe", world=1, on=0, workers=2, resume=_ckpt(run, "recipe1", 6)),
    ]
    spawn(_rank_main, 2, run, str(folder), after)
    jobs = before + after
    return {j["name"]: load(run, j["name"], j["world"]) for j in jobs} | {"jobs": jobs}


@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory) -> dict:
    """Every spawned run of the tests below, made once per test run (conftest.once_per_run)."""
    return once_per_run(tmp_path_factory, "test_lightning-runs", lambda tmp: _make_runs(folder, tmp))


def _train_keys(seen: dict, epoch: int | None = None) -> list[list[str]]:
    return [keys for e, _, keys in seen["train"] if epoch is None or e == epoch]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact_in_a_fresh_process(runs, world, workers):
    """Resumed after the first batch, mid-epoch and after the epoch's last batch: every rank's batches from
    there on (the rest of epoch 0, then epoch 1) are the uninterrupted run's, key for key."""
    full = runs[f"fit{world}-w{workers}"]
    per_epoch = 16 // world
    for k in STOPS[world]:
        resumed = runs[f"resume{world}-w{workers}-{k}"]
        for r in range(world):
            assert len(_train_keys(full[r])) == 2 * per_epoch
            assert _train_keys(resumed[r]) == _train_keys(full[r])[k:], f"rank {r}, resumed after batch {k}"
            # Lightning's own count goes on where the checkpoint was: batch k of epoch 0 (or epoch 1's first)
            assert resumed[r]["train"][0][:2] == ([0, k] if k < per_epoch else [1, 0])


def test_each_sample_once_per_epoch_across_ranks(runs, folder):
    want = tar_keys(folder, "train")
    for name, world in (("fit1-w0", 1), ("fit1-w2", 1), ("fit2-w0", 2), ("fit2-w2", 2)):
        for epoch in (0, 1):
            keys = [k for r in range(world) for b in _train_keys(runs[name][r], epoch) for k in b]
            assert once_each(keys, want) is None, f"{name} epoch {epoch}: {once_each(keys, want)}"
        assert _train_keys(runs[name][0], 0) != _train_keys(runs[name][0], 1), "each epoch its own order"


def _validations(seen_by_rank: list[dict]) -> dict[tuple, list[str]]:
    """Each validation run's keys over the ranks, by (epoch, step)."""
    out: dict[tuple, list[str]] = {}
    for seen in seen_by_rank:
        for epoch, step, keys in seen["val"]:
            out.setdefault((epoch, step), []).extend(keys)
    return out


def test_validation_test_and_predict_cover_their_split_once(runs, folder):
    val = tar_keys(folder, "val")
    for job in runs["jobs"]:
        runs_of_job = _validations(runs[job["name"]])
        assert runs_of_job, job["name"]
        for when, keys in runs_of_job.items():
            assert once_each(keys, val) is None, f"{job['name']} validation at {when}: {once_each(keys, val)}"
    full = runs["fit2-w0"]
    assert [len(b) for e, s, b in full[0]["val"]] == [4, 1] * 2 and [len(b) for e, s, b in full[1]["val"]] == [4] * 2
    for stage in ("test", "predict"):
        keys = [k for r in range(2) for b in full[r][stage] for k in b]
        assert once_each(keys, tar_keys(folder, "test")) is None, stage


def test_a_two_rank_checkpoint_resumed_on_one_rank_loses_and_repeats_nothing(runs, folder):
    """Stopped after 3 batches on each of 2 ranks (24 samples), resumed on 1: the other 40 of epoch 0, each once;
    epoch 1 is the one-rank run's own. Lightning, counting in the 2-rank batches, skips that epoch's end
    validation, which the warning says."""
    full, resumed = runs["fit2-w0"], runs["elastic21"][0]
    before = [k for r in range(2) for b in _train_keys(full[r], 0)[:3] for k in b]
    after = [k for b in _train_keys(resumed, 0) for k in b]
    assert len(before) == 24 and len(after) == 40
    assert once_each(before + after, tar_keys(folder, "train")) is None, once_each(before + after, [])
    assert _train_keys(resumed, 1) == _train_keys(runs["fit1-w0"][0], 1)
    assert [e for e, _, _ in resumed["val"]] == [1, 1, 1], "epoch 0's end validation skipped by Lightning"
    assert any("on fewer ranks it ends the epoch when the loader runs out" in m for m in resumed["logged"])


def test_a_one_rank_checkpoint_resumed_on_two_ranks_is_cut_at_lightnings_count(runs, folder):
    """The documented limit the other way: after 7 of 16 batches on 1 rank, 2 ranks have 36 samples left (4 full
    batches each, 2 samples each left out), but Lightning ends the epoch at its count of 8, after one batch each: the rest
    is not trained on. Nothing is repeated, and the warning says so; epoch 1 is whole."""
    full, resumed = runs["fit1-w0"][0], runs["elastic12"]
    before = [k for b in _train_keys(full, 0)[:7] for k in b]
    after = [k for r in range(2) for b in _train_keys(resumed[r], 0) for k in b]
    assert len(before) == 28 and [len(_train_keys(resumed[r], 0)) for r in range(2)] == [1, 1]
    assert not set(before) & set(after) and len(set(after)) == len(after) == 8
    assert any("on more ranks it ends the epoch at its own count" in m for m in resumed[0]["logged"])
    keys = [k for r in range(2) for b in _train_keys(resumed[r], 1) for k in b]
    assert once_each(keys, tar_keys(folder, "train")) is None


def test_the_guide_recipe_resumes_exactly(runs, folder):
    """The page's recipe (accumulate 2, 3/4 of each epoch, validation mid-epoch and at the end, a checkpoint
    after each validation): 12 of 16 batches an epoch on 1 rank, validated after batches 6 and 12 (optimizer
    steps 3 and 6); 6 of 8 on 2 ranks, validated after batches 3 (step 1: mid-accumulation) and 6. Resumed from
    the checkpoint of each epoch-0 validation, the batches are the uninterrupted run's."""
    one, two = runs["recipe1"][0], runs["recipe2"]
    assert [len(_train_keys(one, e)) for e in (0, 1)] == [12, 12]
    assert [len(_train_keys(two[r], e)) for r in range(2) for e in (0, 1)] == [6] * 4
    assert sorted({(e, s) for e, s, _ in one["val"]}) == [(0, 3), (0, 6), (1, 9), (1, 12)], "mid-epoch and end"
    assert sorted({(e, s) for e, s, _ in two[0]["val"]}) == [(0, 1), (0, 3), (1, 4), (1, 6)]
    assert _train_keys(runs["recipe1-3"][0]) == _train_keys(one)[6:]
    assert _train_keys(runs["recipe1-6"][0]) == _train_keys(one)[12:]
    for r in range(2):
        assert _train_keys(runs["recipe2-1"][r]) == _train_keys(two[r])[3:]
    # no validation is repeated after a resume: the resumed runs validate where the uninterrupted one did next
    assert sorted({(e, s) for e, s, _ in runs["recipe1-3"][0]["val"]}) == [(0, 6), (1, 9), (1, 12)]
    # the state after the cut epoch's last batch names epoch 1 (the loader's epoch_batches is Lightning's limit):
    # nothing is dropped when Lightning starts epoch 1
    assert not [m for m in runs["recipe1-6"][0]["logged"] if "drops the loaded state" in m]
    cut = [k for r in range(2) for b in _train_keys(two[r], 0) for k in b]
    assert len(set(cut)) == len(cut) == 48, "3/4 of the epoch, no sample twice"


def test_no_lightning_warning_about_the_loaders(runs):
    """Lightning warns about an IterableDataset with __len__, loaders that cannot resume, DataLoader workers and
    samplers; none of it applies to the data module's loaders."""
    for job in runs["jobs"]:
        for r, seen in enumerate(runs[job["name"]]):
            about = [
                w
                for w in seen["warnings"]
                if any(
                    s in w
                    for s in ("IterableDataset", "__len__", "not resumable", "num_workers", "sampler", "dataloader")
                )
            ]
            assert not about, f"{job['name']} rank {r}: {about}"
