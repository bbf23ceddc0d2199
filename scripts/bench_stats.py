"""Time ``wds-tools stats`` on a large synthetic index (target: 1M samples in 2,000 shards under 2 s).

Builds the index with scripts/bench_index.py's ``make_index`` (index.json + samples.npz, the real
format; no tars). Times ``compute_stats`` in-process and the whole CLI (``wds-tools stats PATH
--json`` in a fresh process, imports included); in-process means ``compute_stats`` plus
rendering the report as JSON data and as text. Baseline, in the same run: the same per-shard
class counts the naive way, loading every column with ``load_index().samples`` and counting
(shard, label) pairs with ``collections.Counter``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_index import make_index  # noqa: E402

from wds_tools.format.index import load_index  # noqa: E402
from wds_tools.inspect.stats import compute_stats  # noqa: E402


def naive(dest: Path) -> int:
    s = load_index(dest).samples
    pairs = Counter(zip(s["shard"].tolist(), s["label"].tolist()))
    return len(pairs)


def ours(dest: Path) -> int:
    report = compute_stats(dest, world_size=8, workers=8)
    return len(report.to_text()) + len(report.to_dict())


def cli(dest: Path) -> int:
    exe = Path(sys.executable).with_name("wds-tools")
    subprocess.run(
        [str(exe), "stats", str(dest), "--json", "--world-size", "8", "--loader-workers", "8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return 0


def median_time(fn, dest: Path, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(dest)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=2000)
    ap.add_argument("--data", default="bench-data/stats")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dest = Path(args.data) / f"{args.samples}-{args.shards}"
    if not (dest / "index.json").exists():
        t = time.perf_counter()
        make_index(dest, args.samples, args.shards)
        (dest / "baseline.jsonl").unlink()  # make_index's JSON-lines baseline is not used here
        print(f"built a {args.samples:,}-sample index in {time.perf_counter() - t:.1f} s at {dest}")
    ours(dest)  # warm the page cache and imports
    results = {
        "wds-tools stats (compute_stats + to_dict + to_text, in-process)": median_time(ours, dest, args.repeats),
        "wds-tools stats --json (CLI, fresh process)": median_time(cli, dest, args.repeats),
        "baseline: load every column + Counter over (shard, label)": median_time(naive, dest, args.repeats),
    }
    print(
        f"\nmachine: {os.cpu_count()} cores; {args.samples:,} samples, {args.shards:,} shards; "
        f"--world-size 8 --workers 8; median of {args.repeats}, warm page cache"
    )
    print("| what | median s |\n|---|---|")
    for name, t in results.items():
        print(f"| {name} | {t:.3f} |")
    inproc, whole, base = results.values()
    print(
        f"\nratio baseline/ours (in-process): {base / inproc:.1f}x; "
        f"target < 2 s: {'PASS' if whole < 2 else 'FAIL'} (CLI {whole:.2f} s)"
    )


if __name__ == "__main__":
    main()
