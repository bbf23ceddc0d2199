"""Lightning's data module against the plain loop: an epoch through ``Trainer.fit`` with a no-op model.

Builds shards of random pixels with tests/shardkit (real tars and their index; cached in --work), then
times, in the same interleaved rounds (each round one epoch of every row, in turn, so that they share
the machine's noise), a training epoch of:

- ``plain``: ``for batch in make_loader(...)``, the loop of the training guide;
- ``data module``: the same loop over ``ShardDataModule(...).train_dataloader()`` (no trainer): the
  wrapper Lightning is given, alone;
- ``Trainer.fit``: ``Trainer(max_epochs=1).fit(model, datamodule=ShardDataModule(...))`` with a model
  whose ``training_step`` only reads the batch and returns no loss (Lightning then skips the backward
  and the optimizer step); no progress bar, logger or checkpoint.

Every row reads each batch's images once (copied into a reused buffer, as a copy to the GPU would)
and is timed from its epoch's first batch to its last (worker start-up and Lightning's set-up
excluded), a fresh loader each round: samples/s of wall time, and the CPU time of this (the
training) process per 1,000 samples (``time.process_time``, all its threads), medians of --rounds and
their ratios to ``plain``. The CPU time is what other load on a shared machine disturbs least: with
``--workers 0`` it is all the work (reading, augmenting, batching, Lightning's loop), with workers it
is the training process's share (Lightning's loop, the hand-over). Same options everywhere: training
(augmentation on the CPU), --batch, --workers.

    .venv/bin/python scripts/bench_lightning.py [--samples 4096] [--batch 128] [--workers 0 2] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import pytorch_lightning as pl  # noqa: E402
from shardkit import build_dataset  # noqa: E402

from training_adapter import make_loader  # noqa: E402
from training_adapter.lightning import ShardDataModule  # noqa: E402

SIZE = 224
PER_SHARD = 256


def build(work: Path, samples: int) -> Path:
    """``samples`` random 224 px samples in shards of 256, with their index (cached in ``work``)."""
    dest = work / f"lightning-{samples}"
    if not (dest / "index.json").exists():
        shards = [[(j + t) % 7 for t in range(PER_SHARD)] for j in range(-(-samples // PER_SHARD))]
        build_dataset(dest, {"train": shards}, classes=tuple(f"c{i}" for i in range(7)), size=SIZE)
    return dest


class Reader:
    """Reads a batch's images once, into a buffer reused across batches of one shape."""

    def __init__(self) -> None:
        self.staging: dict = {}

    def __call__(self, images: torch.Tensor) -> None:
        key = (images.shape, images.stride())
        buf = self.staging.get(key)
        if buf is None:
            buf = self.staging[key] = torch.empty_like(images)
        buf.copy_(images)


def timed_loop(batches, read: Reader) -> tuple[float, float]:
    """(samples/s, CPU s per 1,000 samples) of one pass over ``batches``, from its first batch."""
    it = iter(batches)
    read(next(it)[0])
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for b in it:
        read(b[0])
        n += len(b[1])
    return n / (time.perf_counter() - t0), 1000 * (time.process_time() - c0) / n


class NoOp(pl.LightningModule):
    """Reads each batch, returns no loss: Lightning skips the backward and the optimizer step."""

    def __init__(self, read: Reader) -> None:
        super().__init__()
        self.read = read
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.t0, self.c0, self.n = 0.0, 0.0, 0

    def training_step(self, batch, batch_idx):
        self.read(batch[0])
        if batch_idx == 0:
            self.t0, self.c0, self.n = time.perf_counter(), time.process_time(), 0
        else:
            self.n += len(batch[1])
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_epoch(data: ShardDataModule, read: Reader) -> tuple[float, float]:
    """(samples/s, CPU s per 1,000 samples) of one ``Trainer.fit`` epoch, from its first batch to the end of its
    last training step."""
    model = NoOp(read)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    done = []

    class End(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            done[:] = [time.perf_counter(), time.process_time()]

    trainer.callbacks.append(End())
    trainer.fit(model, datamodule=data)
    return model.n / (done[0] - model.t0), 1000 * (done[1] - model.c0) / model.n


def compare(shards: Path, batch: int, workers: int, rounds: int) -> None:
    """The table of one configuration: every row an epoch per round, interleaved (every other round reversed)."""
    opts = dict(batch_size=batch, num_workers=workers)
    read = Reader()
    rows = {
        "plain make_loader": lambda: timed_loop(make_loader(shards, train=True, **opts), read),
        "data module (its loader alone)": lambda: timed_loop(ShardDataModule(shards, **opts).train_dataloader(), read),
        "Trainer.fit, no-op model": lambda: fit_epoch(ShardDataModule(shards, **opts), read),
    }
    load = os.getloadavg()
    for row in rows.values():  # one untimed epoch each: page cache, imports, first-use costs
        row()
    walls: dict[str, list[float]] = {name: [] for name in rows}
    cpus: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(rounds):
        for name, row in rows.items() if r % 2 == 0 else reversed(rows.items()):
            wall, cpu = row()
            walls[name].append(wall)
            cpus[name].append(cpu)
    wall0, cpu0 = statistics.median(walls["plain make_loader"]), statistics.median(cpus["plain make_loader"])
    print(
        f"\n{workers} workers, batch {batch}, training (CPU augmentation), {rounds} interleaved rounds; "
        f"load {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"| {'loop':<30} | samples/s | ratio | min-max | CPU s / 1,000 samples | ratio |")
    print(f"|{'-' * 32}|---|---|---|---|---|")
    for name in rows:
        w, c = statistics.median(walls[name]), statistics.median(cpus[name])
        spread = f"{min(walls[name]):,.0f}-{max(walls[name]):,.0f}"
        print(f"| {name:<30} | {w:,.0f} | {w / wall0:.3f} | {spread} | {c:.3f} | {c / cpu0:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--work", type=Path, default=Path("/tmp/wds-bench-lightning"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # one thread of ours: with workers 0 the rate of one process
    shards = build(args.work, args.samples)
    print(f"{args.samples} samples of {SIZE} px (tests/shardkit, random pixels), pytorch-lightning {pl.__version__}")
    for workers in args.workers:
        compare(shards, args.batch, workers, args.rounds)


if __name__ == "__main__":
    main()
