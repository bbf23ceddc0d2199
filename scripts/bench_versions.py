"""One loader configuration under two (or more) checkouts of wds-tools, e.g. main and a branch.

Each round runs every checkout once, in turn, in a fresh process (``PYTHONPATH=<checkout>``): a
first untimed epoch, then ``--epochs`` timed ones, every batch consumed as bench_loader.py does
(copied into a reused buffer), one torch thread. Prints each checkout's median samples/s over all
rounds and its ratio to the first checkout. The shards are bench_loader.py's corpus (run it once
first, or pass --shards).

    .venv/bin/python scripts/bench_versions.py --trees /work/main . --config '{"train": true, "num_workers": 0}'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
from training_adapter import make_loader
torch.set_num_threads(1)
shards, config, epochs = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
loader = make_loader(shards, batch_size=config.pop("batch_size", 64), split="train", **config)
staging = {}
def consume(images):
    key = (images.shape, images.stride())
    if key not in staging:
        staging[key] = torch.empty_like(images)
    staging[key].copy_(images)
for b in loader:
    consume(b[0])
rates = []
for _ in range(epochs):
    it = iter(loader)
    consume(next(it)[0])
    t0, n = time.perf_counter(), 0
    for b in it:
        consume(b[0])
        n += len(b[1])
    rates.append(n / (time.perf_counter() - t0))
print(json.dumps(rates))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", required=True, help="checkouts to compare; the first is the reference")
    ap.add_argument("--config", required=True, help="make_loader options as JSON (batch_size defaults to 64)")
    ap.add_argument("--shards", default="/tmp/wds-bench/n8192/shards/v1/224")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per process")
    args = ap.parse_args()
    json.loads(args.config)
    rates: dict[str, list[float]] = {t: [] for t in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
            out = subprocess.run([sys.executable, "-c", CHILD, args.shards, args.config, str(args.epochs)], env=env,
                                 cwd="/", capture_output=True, text=True, check=True).stdout
            rates[tree] += json.loads(out.strip().splitlines()[-1])
    ref = statistics.median(rates[args.trees[0]])
    print(f"{args.config}, {args.rounds} rounds x {args.epochs} epochs, samples/s:")
    for tree, r in rates.items():
        m = statistics.median(r)
        print(f"- {tree}: median {m:,.0f} (min {min(r):,.0f}, max {max(r):,.0f}), {m / ref:.2f} of {args.trees[0]}")


if __name__ == "__main__":
    main()
