"""A minimal trainer on wds-tools shards: config -> loaders -> uint8 batches -> normalise on the device.

    .venv/bin/python scripts/train_example.py --config train.yaml [--epochs 2] [--steps 20]
    .venv/bin/python scripts/train_example.py --shards shards/v1/224 --epochs 8 [--random-labels]
    .venv/bin/python scripts/train_example.py ... --checkpoint ck.pt [--save-every 100] [--resume]

The config's ``dataset:`` block is all the loader needs (see docs/guide/training.md); ``--shards`` stands
for a config whose train and val URLs are that folder. ``--random-labels`` trains on a fixed random
label per sample instead of its own: the held-out accuracy it reaches is what a loader that mixes
up images and labels would give. Runs on CUDA when available, else the CPU; with
``device_augment: true`` the random geometry runs on the device too. Under torchrun it uses DDP
(gloo on CPU, nccl on CUDA).

``--checkpoint`` saves the model, the optimiser and the train loader's ``state_dict()`` (every
``--save-every`` steps and at each epoch's end, atomically, from rank 0: the loader's state is the same
on every rank); ``--resume`` loads them and continues the epoch where it stopped: with the index
reader exactly the batches the uninterrupted run would have trained on (on another number of ranks:
each remaining sample once). ``--stop-after N`` exits after N steps in all, as a preempted job would.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training_adapter import augment_batch, load_config, to_device  # noqa: E402
from training_adapter.config import DatasetConfig  # noqa: E402
from wds_tools.errors import WdsToolsError  # noqa: E402
from wds_tools.exitcodes import for_error  # noqa: E402


def small_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="trainer config (.yaml/.toml) with a dataset: block")
    src.add_argument("--shards", help="a shards folder (train and val splits), e.g. shards/v1/224")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after this many steps (0: whole epoch)")
    ap.add_argument("--batch-size", type=int, default=32, help="with --shards (a config sets its own)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--checkpoint", help="save model, optimiser and loader state here")
    ap.add_argument("--save-every", type=int, default=0, help="with --checkpoint: also every this many steps")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint, mid-epoch")
    ap.add_argument("--stop-after", type=int, default=0, help="exit after this many steps in all (a preemption)")
    ap.add_argument("--log-keys", help="append the keys of every batch trained on to this file, one line a batch")
    ap.add_argument(
        "--random-labels",
        action="store_true",
        help="train on a fixed random label per sample: the accuracy of a loader that mixes up labels",
    )
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")

    if args.config:
        cfg = load_config(args.config).dataset
    else:
        cfg = DatasetConfig(train_urls=args.shards, val_urls=args.shards, loader={"batch_size": args.batch_size})
    # the one line a trainer changes: shards instead of an image folder
    keyed = args.random_labels or bool(args.log_keys)
    train = cfg.train_loader(return_keys=True) if keyed else cfg.train_loader()
    random_label: dict[str, int] = {}
    gen = torch.Generator().manual_seed(1)
    val = cfg.val_loader() if cfg.val_urls else None
    mean, std = train.mean, train.std  # from index.json when the urls lead to one
    if mean is None:
        mean, std = [0.5] * 3, [0.25] * 3
    classes = len(train.dataset.shards.classes or []) or 1 + max(b[1].max().item() for _, b in zip(range(4), train))

    model = small_cnn(classes).to(device).to(memory_format=torch.channels_last)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    if (args.resume or args.save_every) and not args.checkpoint:
        ap.error("--resume and --save-every need --checkpoint")
    plain = model.module if distributed else model
    start = 0
    if args.resume:
        ck = torch.load(args.checkpoint, map_location=device, weights_only=True)
        plain.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        if ck["loader"] is not None:  # stopped mid-epoch: that epoch, less the batches already trained on
            train.load_state_dict(ck["loader"])
        start = train.epoch if ck["loader"] is not None else ck["next_epoch"]
        print(f"resumed from {args.checkpoint}: epoch {start}, {ck['steps']} steps done", flush=True)
    steps = ck["steps"] if args.resume else 0

    def save(next_epoch: int | None = None) -> None:
        """The checkpoint; at an epoch's end (``next_epoch``) without the loader's state (--steps may cut it)."""
        if args.checkpoint and (not distributed or torch.distributed.get_rank() == 0):
            tmp = f"{args.checkpoint}.tmp"
            torch.save(
                {
                    "model": plain.state_dict(),
                    "optimizer": opt.state_dict(),
                    "steps": steps,
                    "loader": train.state_dict() if next_epoch is None else None,
                    "next_epoch": next_epoch,
                },
                tmp,
            )
            os.replace(tmp, args.checkpoint)  # atomic: a preemption while saving keeps the last checkpoint

    for epoch in range(start, args.epochs):
        train.set_epoch(epoch)  # keeps a loaded state of this epoch
        model.train()
        t0, seen = time.perf_counter(), 0
        for step, batch in enumerate(train):
            if keyed:  # keys last
                *batch, keys = batch
                if args.log_keys:
                    with open(args.log_keys, "a") as f:
                        f.write(" ".join(keys) + "\n")
            if args.random_labels:  # one random label per sample for the whole run
                batch[1] = torch.tensor(
                    [random_label.setdefault(k, int(torch.randint(classes, (), generator=gen))) for k in keys]
                )
            if cfg.loader.get("device_augment"):
                images, labels, params = batch  # raw uint8 + per-sample transform params
                x = augment_batch(images.to(device, non_blocking=True), params, config=cfg.augment, mean=mean, std=std)
            elif cfg.loader.get("normalize"):
                images, labels = batch  # already normalised float32
                x = images.to(device, non_blocking=True)
            else:
                images, labels = batch  # augmented uint8
                x = to_device(images, device, mean, std)
            loss = loss_fn(model(x), labels.to(device, non_blocking=True))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += len(labels)
            steps += 1
            if args.save_every and steps % args.save_every == 0:
                save()
            if args.stop_after and steps >= args.stop_after:
                save()
                print(f"stopped after {steps} steps (--stop-after), in epoch {epoch}", flush=True)
                if distributed:
                    torch.distributed.destroy_process_group()
                return
            if args.steps and step + 1 >= args.steps:
                break
        rate = seen / (time.perf_counter() - t0)
        msg = f"epoch {epoch}: loss {loss.item():.3f}, {seen} samples, {rate:,.0f} samples/s"
        msg += " (random labels)" if args.random_labels else ""
        if val is not None:
            model.eval()
            correct = total = 0
            with torch.no_grad():
                for images, labels in val:
                    pred = model(to_device(images, device, mean, std)).argmax(1).cpu()
                    correct += int((pred == labels).sum())
                    total += len(labels)
            msg += f", val accuracy {correct / max(total, 1):.3f} ({total} samples)"
        print(msg, flush=True)
        save(next_epoch=epoch + 1)
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except WdsToolsError as e:  # a mistake in the data or the options: its one line, not a traceback
        print(f"train_example.py: error: {e}", file=sys.stderr)
        sys.exit(int(for_error(e)))
