"""Batch buffers: reused (``buffers.BufferPool``, freed by the reference count) against a fresh one per batch.

Times the index reader with ``num_workers=0`` (every batch made in this process, in a pool buffer), eval
and train defaults, batch 64 at 224 px, each way in its own process, interleaved rounds (every other
one in reverse order); samples/s of process CPU time (``time.process_time``), medians and ratios.
"fresh" replaces ``BufferPool.get`` with a new array per batch: what the loader would do without
telling when a batch the caller holds is gone.

    .venv/bin/python scripts/bench_buffers.py [--samples 8192] [--rounds 7] [--work /tmp/wds-bench]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SERVE = r"""
import math, sys, time, numpy as np, torch, warnings
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
torch.set_num_threads(1)
from training_adapter import make_loader
from training_adapter.buffers import BufferPool
shards, mode, how = sys.argv[1], sys.argv[2], sys.argv[3]
if how == "fresh":
    BufferPool.get = lambda self, shape: torch.from_numpy(np.empty(math.prod(shape), np.uint8)).view(shape)
loader = make_loader(shards, train=mode == "train", batch_size=64, num_workers=0, split="train")
out = None
def consume(x):  # the caller's copy of each batch (as to a device), into one reused buffer
    global out
    out = torch.empty_like(x) if out is None or out.shape != x.shape else out
    out.copy_(x)
for b in loader:
    consume(b[0])
print("ready", flush=True)
for line in sys.stdin:
    t0, n = time.process_time(), 0
    for b in loader:
        consume(b[0])
        n += len(b[1])
    print(n / (time.process_time() - t0), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--work", default="/tmp/wds-bench")
    args = ap.parse_args()
    from bench_loader import build, served_rounds

    shards = build(Path(args.work) / f"n{args.samples}", args.samples)
    servers = {
        (mode, how): ([sys.executable, "-c", SERVE, str(shards), mode, how], None)
        for mode in ("eval", "train")
        for how in ("reused", "fresh")
    }
    rates = {k: [float(line) for line in v] for k, v in served_rounds(servers, args.rounds).items()}
    print(f"{args.rounds} interleaved rounds, batch 64, num_workers 0; samples/s of CPU time, median (min-max)")
    for (mode, how), v in rates.items():
        print(f"  {mode:5s} {how:6s} {statistics.median(v):8.0f}  ({min(v):.0f}-{max(v):.0f})")
    for mode in ("eval", "train"):
        ratio = statistics.median(rates[(mode, "fresh")]) / statistics.median(rates[(mode, "reused")])
        print(f"{mode}: fresh / reused = {ratio:.2f}")


if __name__ == "__main__":
    main()
