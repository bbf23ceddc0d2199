"""One loader configuration under two (or more) checkouts of wds-tools, e.g. main and a branch.

Each round runs every checkout once, in turn, in a fresh process (``PYTHONPATH=<checkout>``): a
first untimed epoch, then ``--epochs`` timed ones, every batch consumed as bench_loader.py does
(copied into a reused buffer), one torch thread. Prints each checkout's median samples/s over all
rounds and its ratio to the first checkout. The shards are bench_loader.py's corpus (run it once
first, or pass --shards).

With ``--convert MANIFEST`` each process instead times one whole ``convert()`` call of that manifest
into a fresh temporary folder (``--config`` holds convert's options, e.g. size and workers) and
reports images/s of the call.

    .venv/bin/python scripts/bench_versions.py --trees /work/main . --config '{"train": true, "num_workers": 0}'
    .venv/bin/python scripts/bench_versions.py --trees /work/main . --convert bench-data/convert/manifest.csv \
        --config '{"size": 224, "workers": 2}'
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

CONVERT_CHILD = r"""
import json, sys, tempfile, time
from wds_tools.convert import convert
manifest, config, epochs = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
rates = []
for _ in range(epochs):
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        result = convert(manifest, version="v1", out=out, **config)
        rates.append(result.samples_written / (time.perf_counter() - t0))
print(json.dumps(rates))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", required=True, help="checkouts to compare; the first is the reference")
    ap.add_argument("--config", required=True, help="make_loader options as JSON (batch_size defaults to 64)")
    ap.add_argument("--shards", default="/tmp/wds-bench/n8192/shards/v1/224")
    ap.add_argument("--convert", metavar="MANIFEST", help="time convert() of this manifest instead of a loader")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per process")
    args = ap.parse_args()
    json.loads(args.config)
    rates: dict[str, list[float]] = {t: [] for t in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
            child, data = (CONVERT_CHILD, str(Path(args.convert).resolve())) if args.convert else (CHILD, args.shards)
            out = subprocess.run(
                [sys.executable, "-c", child, data, args.config, str(args.epochs)],
                env=env,
                cwd="/",
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            rates[tree] += json.loads(out.strip().splitlines()[-1])
    ref = statistics.median(rates[args.trees[0]])
    what = f"convert {args.convert}" if args.convert else "loader"
    print(f"{what} {args.config}, {args.rounds} rounds x {args.epochs} runs, samples/s:")
    for tree, r in rates.items():
        m = statistics.median(r)
        print(f"- {tree}: median {m:,.0f} (min {min(r):,.0f}, max {max(r):,.0f}), {m / ref:.2f} of {args.trees[0]}")


if __name__ == "__main__":
    main()
