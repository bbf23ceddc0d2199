"""Is the GPU ever waiting on data? ResNet training fed by each loader, against the model's own ceiling.

The method of GPU.md (docs/guide/figures.md, GPU): ResNet-50 and ResNet-18 at 224 px, batch 256,
bf16 autocast, channels-last, SGD, eager, on about 8,000 ImageNet-sized JPEGs (400-640 x 300-480)
converted with ``wds_tools.convert`` at 224 px. Each feed is timed for ``--seconds`` after 5 warm-up
steps, synchronising every 5 steps; images/s, the ratio to the ceiling (one fixed batch already on the
GPU) and the training process's CPU per batch (``time.process_time()``: every thread of it):

- ceiling: one fixed batch on the GPU;
- pinned cache: 32 uint8 batches kept in page-locked memory, copied and normalised (``to_device``) each
  step in the training stream;
- make_loader defaults + to_device: what a user gets without ``device=``;
- make_loader(device=...): copied and normalised on a side stream, two batches ahead;
- both with ``persistent_workers=True`` (8,000 images make 31 batches of 256 per epoch: the defaults start
  their workers again each epoch);
- device_augment + augment_batch in the training stream, and device_augment with ``device=``;
- torchvision ImageFolder + RandomResizedCrop + RandomHorizontalFlip + DataLoader on the same JPEGs
  (channels-last on the device, as every other feed).

Then the loaders alone (no model: samples/s and the training process's CPU per batch) with
``pin_memory`` off and on, and with ``device=``. Every figure is printed, and appended to
``results.md`` and ``results.jsonl`` (in ``--results``, else ``--work``), as soon as it is measured,
so a run cut short still shows what it measured. On a GPU machine (``scripts/gpu_check.sh`` runs
these and the CUDA tests):

    python3 scripts/bench_gpu.py --make-corpus 8000 --work /tmp/gpu-bench   # the JPEGs and the 224 px shards
    python3 scripts/bench_gpu.py --work /tmp/gpu-bench --results out/        # the figures

It runs without CUDA (on the CPU, the same code at any size) and without torchvision (its models
and the ImageFolder row then need ``--model tiny`` and are left out): ``--tiny`` makes a 64-JPEG
corpus and times each feed for a fraction of a second with a small CNN, as tests/test_bench_gpu.py does.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training_adapter import AugmentConfig, augment_batch, make_loader, to_device  # noqa: E402
from wds_tools.cpus import usable_cpus  # noqa: E402

CLASSES = 10


# --- the corpus ----------------------------------------------------------------------------------
def _write_jpegs(args: tuple[Path, int, int, tuple[int, int], tuple[int, int]]) -> list[str]:
    from wds_tools.synth import jpeg_bytes, photo_like

    root, start, stop, widths, heights = args
    rows = []
    for i in range(start, stop):
        rng = np.random.default_rng(i)
        w, h = int(rng.integers(widths[0], widths[1] + 1)), int(rng.integers(heights[0], heights[1] + 1))
        rel = f"jpeg/c{i % CLASSES}/{i:06d}.jpg"
        (root / rel).write_bytes(jpeg_bytes(photo_like(w, h, seed=i), quality=90))
        rows.append(rel)
    return rows


def make_corpus(work: Path, n: int, *, size: int, widths: tuple[int, int], heights: tuple[int, int]) -> Path:
    """``n`` JPEGs in an ImageFolder layout (``work/jpeg/c<k>/``) and their shards at ``size`` px."""
    from wds_tools.convert import convert

    shards = work / "shards" / "v1" / str(size)
    if (shards / "index.json").exists():
        print(f"corpus: {shards} exists", flush=True)
        return shards
    t0 = time.perf_counter()
    for k in range(CLASSES):
        (work / "jpeg" / f"c{k}").mkdir(parents=True, exist_ok=True)
    cores = usable_cpus()
    step = -(-n // cores)
    parts = [(work, a, min(n, a + step), widths, heights) for a in range(0, n, step)]
    with get_context("fork" if sys.platform == "linux" else "spawn").Pool(cores) as pool:
        rels = [r for part in pool.map(_write_jpegs, parts) for r in part]
    with open(work / "manifest.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label", "split"])
        for rel in rels:
            w.writerow([Path(rel).stem, rel, Path(rel).parent.name, "train"])
    t1 = time.perf_counter()
    convert(work / "manifest.csv", version="v1", size=size, out=work / "shards", workers=cores, progress=False)
    print(
        f"corpus: {n} JPEGs ({widths[0]}-{widths[1]} x {heights[0]}-{heights[1]}) in {t1 - t0:.0f} s, "
        f"converted at {size} px in {time.perf_counter() - t1:.0f} s: {shards}",
        flush=True,
    )
    return shards


# --- reporting ------------------------------------------------------------------------------------
class Report:
    """Prints each figure and appends it to results.md / results.jsonl at once."""

    def __init__(self, work: Path) -> None:
        self.md, self.jsonl = work / "results.md", work / "results.jsonl"

    def line(self, text: str, **fields: Any) -> None:
        print(text, flush=True)
        with open(self.md, "a") as f:
            f.write(text + "\n")
        if fields:
            with open(self.jsonl, "a") as f:
                f.write(json.dumps(fields) + "\n")


def environment() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = ""
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA (CPU)"
    return (
        f"{time.strftime('%Y-%m-%d %H:%M')}, {dev}, {usable_cpus()} cores, torch {torch.__version__}, "
        f"commit {commit or 'unknown'}, load {os.getloadavg()[0]:.1f}"
    )


# --- models and timing ------------------------------------------------------------------------------
class TinyNet(torch.nn.Module):
    """A small CNN for the CPU run (no torchvision needed)."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def build_model(name: str, dev: torch.device) -> torch.nn.Module:
    if name == "tiny":
        model: torch.nn.Module = TinyNet()
    else:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, num_classes=CLASSES)
    return model.to(dev, memory_format=torch.channels_last)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def train_rate(
    model: torch.nn.Module,
    feed: Iterator[tuple[torch.Tensor, torch.Tensor]],
    dev: torch.device,
    B: int,
    seconds: float,
    warmup: int = 5,
    every: int = 5,
) -> tuple[float, float, bool]:
    """(images/s, ms of this process's CPU per step, whether the first batch was channels-last) of SGD
    steps on ``feed``'s batches."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    x, y = next(feed)
    channels_last = x.is_contiguous(memory_format=torch.channels_last)
    step(x, y)
    del x, y
    for _ in range(warmup - 1):
        step(*next(feed))
    sync(dev)
    t0, cpu0, n = time.perf_counter(), time.process_time(), 0
    while True:
        step(*next(feed))
        n += 1
        if n % every == 0:
            sync(dev)
            if time.perf_counter() - t0 >= seconds:
                break
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return n * B / wall, cpu / n * 1e3, channels_last


def epochs(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    e = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(e)
        yield from loader
        e += 1


# --- the feeds ------------------------------------------------------------------------------------
def feeds(shards: Path, jpegs: Path, dev: torch.device, B: int, dtype: torch.dtype, tv_workers: int) -> dict:
    """name -> a function making an iterator of (images, labels) ready for the model on ``dev``."""
    probe = make_loader(shards, batch_size=B, train=True, num_workers=0)
    mean, std = probe.mean, probe.std
    cfg = AugmentConfig()

    def moved(batches: Iterator[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for b in batches:  # channels-last as the model (ImageFolder's batches are contiguous NCHW)
            x = to_device(b[0], dev, mean, std, dtype=dtype).contiguous(memory_format=torch.channels_last)
            yield x, b[1].to(dev, non_blocking=True)

    def ceiling() -> Iterator[Any]:
        x, y = next(moved(iter(probe)))
        while True:
            yield x, y

    def pinned_cache() -> Iterator[Any]:
        cache = []
        for b in epochs(probe):
            x, y = b[0].clone(), b[1].clone()
            if dev.type == "cuda":
                x, y = x.pin_memory(), y.pin_memory()
            cache.append((x, y))
            if len(cache) == 32:
                break
        i = 0
        while True:
            x, y = cache[i % len(cache)]
            i += 1
            yield to_device(x, dev, mean, std, dtype=dtype), y.to(dev, non_blocking=True)

    def defaults() -> Iterator[Any]:
        return moved(epochs(make_loader(shards, batch_size=B, train=True)))

    def device_path() -> Iterator[Any]:
        return epochs(make_loader(shards, batch_size=B, train=True, device=dev, dtype=dtype))

    def defaults_persistent() -> Iterator[Any]:
        return moved(epochs(make_loader(shards, batch_size=B, train=True, persistent_workers=True)))

    def device_persistent() -> Iterator[Any]:
        loader = make_loader(shards, batch_size=B, train=True, device=dev, dtype=dtype, persistent_workers=True)
        return epochs(loader)

    def device_augment_manual() -> Iterator[Any]:
        for images, labels, params in epochs(make_loader(shards, batch_size=B, train=True, device_augment=True)):
            x = augment_batch(images.to(dev, non_blocking=True), params, config=cfg, mean=mean, std=std)
            yield x.to(dtype).contiguous(memory_format=torch.channels_last), labels.to(dev, non_blocking=True)

    def device_augment_feed() -> Iterator[Any]:
        return epochs(make_loader(shards, batch_size=B, train=True, device_augment=True, device=dev, dtype=dtype))

    def imagefolder() -> Iterator[Any]:
        from torchvision import datasets, transforms

        size = probe.dataset.shards.size
        tf = transforms.Compose(
            [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
        )
        ds = datasets.ImageFolder(str(jpegs), transform=tf)
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=B,
            shuffle=True,
            num_workers=tv_workers,
            pin_memory=dev.type == "cuda",
            persistent_workers=tv_workers > 0,
            drop_last=True,
        )
        return moved(epochs(dl))

    out = {
        "ceiling: one fixed batch on the device": ceiling,
        "pinned cache, copied and normalised each step (to_device)": pinned_cache,
        "make_loader defaults + to_device": defaults,
        "make_loader(device=...)": device_path,
        "make_loader(device_augment=True) + augment_batch": device_augment_manual,
        "make_loader(device_augment=True, device=...)": device_augment_feed,
        "make_loader(persistent_workers=True) + to_device": defaults_persistent,
        "make_loader(device=..., persistent_workers=True)": device_persistent,
    }
    try:
        import torchvision  # noqa: F401

        out[f"torchvision ImageFolder + RandomResizedCrop, {tv_workers} workers"] = imagefolder
    except ImportError:
        print("skipped: torchvision ImageFolder (torchvision is not installed)", flush=True)
    return out


def loader_alone(
    make: Callable[[], Any], dev: torch.device, B: int, seconds: float, warmup: int = 3
) -> tuple[float, float]:
    """(samples/s, ms of this process's CPU per batch) of a loader whose batches are only dropped."""
    it = epochs(make())
    for _ in range(warmup):
        next(it)
    sync(dev)
    t0, cpu0, n = time.perf_counter(), time.process_time(), 0
    while True:
        b = next(it)
        del b
        n += 1
        if n % 5 == 0 and time.perf_counter() - t0 >= seconds:
            break
    sync(dev)
    return n * B / (time.perf_counter() - t0), (time.process_time() - cpu0) / n * 1e3


def run(args: argparse.Namespace, shards: Path) -> None:
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    torch.backends.cudnn.benchmark = True
    B = args.batch
    report = Report(args.results or args.work)
    report.line(f"\n## bench_gpu: {environment()}\n", env=environment())
    report.line(
        f"batch {B}, {args.dtype} inputs, bf16 autocast, channels-last, SGD; {args.seconds:g} s per feed after "
        f"{args.warmup} warm-up steps, synchronised every 5 steps; make_loader's default num_workers here: "
        f"{make_loader(shards, batch_size=B, train=True).num_workers}\n"
    )
    table = feeds(shards, args.work / "jpeg", dev, B, dtype, args.tv_workers)
    chosen = [n for n in table if not args.feeds or any(f in n for f in args.feeds)]
    for name in args.models:
        model = build_model(name, dev)
        report.line(f"| {name} | images/s | / ceiling | training process CPU, ms/step |")
        report.line("|---|---|---|---|")
        ceiling = None
        for feed in chosen:
            try:
                rate, cpu, channels_last = train_rate(model, table[feed](), dev, B, args.seconds, warmup=args.warmup)
            except Exception as e:  # one feed failing (a missing extra, out of memory) does not end the run
                report.line(f"| {feed} | failed: {type(e).__name__}: {e} | | |", model=name, feed=feed, error=str(e))
                continue
            if ceiling is None:
                ceiling = rate
            report.line(
                f"| {feed} | {rate:,.0f} | {rate / ceiling:.3f} | {cpu:.2f} |",
                model=name,
                feed=feed,
                images_per_s=rate,
                ratio=rate / ceiling,
                cpu_ms=cpu,
                channels_last=channels_last,
            )
        report.line("")
        del model
    report.line("| loader alone (train, no model) | samples/s | training process CPU, ms/batch |")
    report.line("|---|---|---|")
    alone = {
        "make_loader defaults, pin_memory=False": lambda: make_loader(
            shards, batch_size=B, train=True, pin_memory=False
        ),
        "make_loader defaults, pin_memory=True": lambda: make_loader(shards, batch_size=B, train=True, pin_memory=True),
        "make_loader defaults, persistent_workers=True": lambda: make_loader(
            shards, batch_size=B, train=True, persistent_workers=True
        ),
        "make_loader(device=...)": lambda: make_loader(shards, batch_size=B, train=True, device=dev, dtype=dtype),
        "make_loader(device=..., persistent_workers=True)": lambda: make_loader(
            shards, batch_size=B, train=True, device=dev, dtype=dtype, persistent_workers=True
        ),
        "make_loader(device_augment=True, device=...)": lambda: make_loader(
            shards, batch_size=B, train=True, device_augment=True, device=dev, dtype=dtype
        ),
    }
    for name, make in alone.items():
        rate, cpu = loader_alone(make, dev, B, args.seconds)
        report.line(f"| {name} | {rate:,.0f} | {cpu:.2f} |", loader=name, samples_per_s=rate, cpu_ms=cpu)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="the corpus and shards go here, and the results")
    ap.add_argument("--results", type=Path, help="results.md and results.jsonl go here instead of --work")
    ap.add_argument("--make-corpus", type=int, metavar="N", help="write N JPEGs and their shards, then stop")
    ap.add_argument("--tiny", action="store_true", help="a 64-JPEG corpus at 32 px, a small CNN, short timings")
    ap.add_argument("--models", default=None, help="comma-separated: resnet50,resnet18 (torchvision) or tiny")
    ap.add_argument("--feeds", default=None, help="comma-separated parts of feed names to run (default: all)")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per feed (default 10; --tiny 0.3)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=None, help="default 256 (--tiny: 8)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default=None, help="default: cuda where available, else cpu")
    ap.add_argument("--tv-workers", type=int, default=None, help="ImageFolder's workers (default: cores - 1)")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.results:
        args.results.mkdir(parents=True, exist_ok=True)
    size = 32 if args.tiny else 224
    widths, heights = ((40, 64), (30, 48)) if args.tiny else ((400, 640), (300, 480))
    if args.make_corpus:
        make_corpus(args.work, args.make_corpus, size=size, widths=widths, heights=heights)
        return
    shards = args.work / "shards" / "v1" / str(size)
    if args.tiny and not (shards / "index.json").exists():
        make_corpus(args.work, 64, size=size, widths=widths, heights=heights)
    if not (shards / "index.json").exists():
        raise SystemExit(f"no shards in {shards}: run with --make-corpus 8000 first")
    args.models = (args.models or ("tiny" if args.tiny else "resnet50,resnet18")).split(",")
    args.feeds = args.feeds.split(",") if args.feeds else None
    args.seconds = args.seconds if args.seconds is not None else (0.3 if args.tiny else 10.0)
    args.batch = args.batch or (8 if args.tiny else 256)
    args.warmup = 2 if args.tiny and args.warmup == 5 else args.warmup
    args.tv_workers = args.tv_workers if args.tv_workers is not None else max(1, usable_cpus() - 1)
    run(args, shards)


if __name__ == "__main__":
    main()
