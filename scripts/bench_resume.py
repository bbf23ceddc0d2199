"""Resume: time from ``load_state_dict`` to the first batch, with an index of 1,000,000 samples.

Builds real shards of a few thousand samples (tests/shardkit.py: real tars, no conversion), then an
index whose samples.npz lists 1,000,000 rows: the real rows repeated under new keys (every row
points at a real .npy and .cls, so the reader reads and checks them as usual). A loader reads a few
batches and saves its state at --at of the epoch; a fresh loader (made beforehand: reading
samples.npz is make_loader's work) then times ``load_state_dict`` + the first batch. The baseline,
in the same rounds: the same fresh loader's first batch of a fresh epoch (``iter`` + ``next``).
Median of --rounds, interleaved; num_workers 0 and 2.

    .venv/bin/python scripts/bench_resume.py [--samples 1000000] [--rounds 5] [--work /tmp/wds-bench-resume]

``--reader stream``: the streaming reader, which resumes by replaying each worker's stream up to where
it stopped (resume.py). Real shards of --stream-samples samples of 32 px (shardkit), the default
1000-sample shuffle buffer, the state saved at --at of the epoch; timed in the same rounds: a fresh
epoch's first batch, the uninterrupted epoch's first ``stop + 1`` batches (what the replay reads
again, and collates), and ``load_state_dict`` + the first batch of the rest.

    .venv/bin/python scripts/bench_resume.py --reader stream [--stream-samples 16000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from shardkit import build_dataset  # noqa: E402

from training_adapter import make_loader  # noqa: E402
from wds_tools.format.index import load_index, write_index  # noqa: E402
from wds_tools.format.names import url_pattern  # noqa: E402
from wds_tools.format.packed import pack_strings  # noqa: E402


def build(work: Path, samples: int) -> Path:
    """Real shards of 4 x 1,000 samples of 32 px, hard-linked under as many shard names as it takes for
    ``samples`` rows: each name's rows repeat its file's real rows, no more than a shard of its size
    can hold (the readers refuse an index claiming more samples than 1 per KiB of shard)."""
    dest = work / f"resume-{samples}-linked"
    if (dest / "index.json").exists():
        return dest
    build_dataset(dest, {"train": [[(i + j) % 3 for i in range(1000)] for j in range(4)]}, size=32)
    index = load_index(dest)
    meta, cols = index.meta, index.samples.columns
    n = len(cols["key"])
    real = meta["shards"]
    rows_of = [np.flatnonzero(cols["shard"] == k) for k in range(len(real))]
    per_name = min(int(s["bytes"]) // 1024 for s in real)
    names = -(-samples // per_name)
    shards, take, shard_col = [], [], []
    for j in range(names):
        k = j % len(real)
        entry = dict(real[k])
        if j >= len(real):  # another name for the same bytes
            entry["name"] = f"train-{j:06d}.tar"
            os.link(dest / real[k]["name"], dest / entry["name"])
        count = min(per_name, samples - j * per_name)
        entry["samples"] = count
        shards.append(entry)
        take.append(rows_of[k][np.arange(count) % len(rows_of[k])])
        shard_col.append(np.full(count, j))
    take_all = np.concatenate(take)
    out = {}
    for name, col in cols.items():
        if name in ("path_offsets", "path_data"):
            continue
        out[name] = col[take_all] if len(col) == n else col
    out["shard"] = np.concatenate(shard_col).astype(cols["shard"].dtype)
    out["key"] = np.array([f"r{i:07d}".encode() for i in range(samples)], dtype="S")
    out["path_offsets"], out["path_data"] = pack_strings([f"img/r{i:07d}.jpg" for i in range(samples)])
    meta["shards"] = shards
    meta["samples"] = meta["splits"]["train"]["samples"] = samples
    meta["splits"]["train"]["shards"] = names
    meta["splits"]["train"]["urls"] = url_pattern("train", names)
    meta["class_counts"] = meta["splits"]["train"]["class_counts"] = np.bincount(out["label"], minlength=3).tolist()
    write_index(dest, meta, out)
    return dest


def stream(work: Path, samples: int, batch: int, at: float, rounds: int) -> None:
    """The streaming reader's resume (see the module docstring)."""
    per = 500
    dest = work / f"stream-{samples}"
    if not (dest / "index.json").exists():
        build_dataset(dest, {"train": [[(i + j) % 3 for i in range(per)] for j in range(-(-samples // per))]}, size=32)
    kw = dict(train=True, batch_size=batch, reader="stream")
    print(f"{samples:,} samples of 32 px in shards of {per}, shuffle buffer 1000, batch {batch}")
    print(
        f"{'workers':>8} {'fresh epoch, first batch':>26} {'first stop + 1 batches':>24} "
        f"{'load_state_dict + first batch':>31} {'/ fresh':>8} {'/ stop + 1':>11}"
    )
    for workers in (0, 2):
        ld = make_loader(dest, num_workers=workers, **kw)
        stop = int(at * len(ld))
        it = iter(ld)
        for _ in range(stop):
            next(it)
        state = ld.state_dict()
        del it, ld
        fresh_t, head_t, resume_t = [], [], []
        for _ in range(rounds):
            a = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            next(iter(a))
            fresh_t.append(time.perf_counter() - t0)
            h = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            it = iter(h)
            for _ in range(stop + 1):
                next(it)
            head_t.append(time.perf_counter() - t0)
            del it
            b = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            b.load_state_dict(state)
            next(iter(b))
            resume_t.append(time.perf_counter() - t0)
            del a, b, h
        f, hd, r = (statistics.median(x) for x in (fresh_t, head_t, resume_t))
        print(
            f"{workers:>8} {f * 1000:>23.0f} ms {hd * 1000:>21.0f} ms {r * 1000:>28.0f} ms {r / f:>8.1f} "
            f"{r / hd:>11.2f}   (stop after {stop} of {len(make_loader(dest, num_workers=workers, **kw))})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reader", choices=("index", "stream"), default="index")
    ap.add_argument("--stream-samples", type=int, default=16_000)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--at", type=float, default=0.9, help="where in the epoch the state is saved (fraction)")
    ap.add_argument("--work", default="/tmp/wds-bench-resume")
    args = ap.parse_args()
    if args.reader == "stream":
        return stream(Path(args.work), args.stream_samples, args.batch, args.at, args.rounds)
    t = time.perf_counter()
    dest = build(Path(args.work), args.samples)
    print(f"index of {args.samples:,} samples in {dest} ({time.perf_counter() - t:.1f} s to build or find)")
    kw = dict(train=True, batch_size=args.batch)
    ld = make_loader(dest, num_workers=0, **kw)
    stop = int(args.at * len(ld))
    ld.load_state_dict({**ld.state_dict(), "position": stop * args.batch, "end": ld.dataset.epoch_span(1).end})
    next(iter(ld))  # one batch after the position: the state a run saves after batch stop + 1
    state = ld.state_dict()
    print(f"state after batch {stop + 1} of {len(ld)}: position {state['position']:,}")
    print(f"{'workers':>8} {'fresh epoch, first batch':>26} {'load_state_dict + first batch':>31} {'ratio':>6}")
    for workers in (0, 2):
        fresh_t, resume_t = [], []
        for _ in range(args.rounds):
            a = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            next(iter(a))
            fresh_t.append(time.perf_counter() - t0)
            b = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            b.load_state_dict(state)
            next(iter(b))
            resume_t.append(time.perf_counter() - t0)
            del a, b
        f, r = statistics.median(fresh_t), statistics.median(resume_t)
        print(f"{workers:>8} {f * 1000:>23.0f} ms {r * 1000:>28.0f} ms {r / f:>6.2f}")


if __name__ == "__main__":
    main()
