"""Benchmark incremental re-sharding: a new version decodes only what changed.

In one run: generate (or reuse) 12 MP JPEGs (4032x3024, quality 92; shared with
bench_convert.py), convert v1, derive v2 (2% added, 1% removed, 1% replaced by a new photo under
the same key, 1% relabeled), then time
  full         v2 converted with --no-reuse (every image decoded), and
  incremental  v2 converted with v1 as its base (the default),
into separate folders, and check that both hold identical shards. Target: incremental <= 10% of
full, and ``decoded`` equal to added + replaced.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import CLASSES, ensure_corpus, machine  # noqa: E402

from wds_tools.convert import convert  # noqa: E402

RATIO_TARGET = 0.10


def write_rows(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label"])
        w.writerows(rows)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=600, help="v1 images (default 600)")
    ap.add_argument("--data", default="bench-data/convert", help="corpus folder (shared with bench_convert.py)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()

    n = args.count
    added, removed, replaced, relabeled = round(0.02 * n), round(0.01 * n), round(0.01 * n), round(0.01 * n)
    data = Path(args.data)
    _, paths = ensure_corpus(data, n + added + replaced)
    rel = [str(p.relative_to(data)) for p in paths]
    v1 = [(f"img_{i:05d}", rel[i], CLASSES[i % len(CLASSES)]) for i in range(n)]
    v2 = list(v1[removed:])
    for j in range(replaced):  # same key, a new photo
        key, _, label = v2[j]
        v2[j] = (key, rel[n + added + j], label)
    for j in range(replaced, replaced + relabeled):
        key, path, label = v2[j]
        v2[j] = (key, path, CLASSES[(CLASSES.index(label) + 1) % len(CLASSES)])
    v2 += [(f"img_{i:05d}", rel[i], CLASSES[i % len(CLASSES)]) for i in range(n, n + added)]
    m1, m2 = write_rows(data / "v1.csv", v1), write_rows(data / "v2.csv", v2)

    out, fresh_out = Path("bench-data/incremental-out"), Path("bench-data/incremental-fresh")
    for d in (out, fresh_out):
        shutil.rmtree(d, ignore_errors=True)
    # enough shards for every worker to stay busy (the default ~256 MB shards would make this
    # corpus two shards, and the full conversion mostly single-core)
    common = dict(size=args.size, workers=args.workers, progress=False, val_fraction=0.1,
                  shard_size=max(1, n // (4 * args.workers)))
    t = time.perf_counter()
    r1 = convert(m1, version="v1", out=out, **common)
    print(f"v1: {r1.samples_written} samples in {time.perf_counter() - t:.1f} s", flush=True)

    t = time.perf_counter()
    full = convert(m2, version="v2", out=fresh_out, reuse=False, **common)
    t_full = time.perf_counter() - t
    t = time.perf_counter()
    inc = convert(m2, version="v2", out=out, **common)
    t_inc = time.perf_counter() - t

    same = all((out / "v2" / str(args.size) / s).read_bytes() == (fresh_out / "v2" / str(args.size) / s).read_bytes()
               for s in os.listdir(fresh_out / "v2" / str(args.size)) if s.endswith((".tar", ".npz")))
    ratio = t_inc / t_full
    ok_ratio, ok_decoded = ratio <= RATIO_TARGET, inc.decoded == added + replaced
    m = machine()
    print(f"\nMachine: {m['cores usable (affinity)']} cores, {m['CPU']}, Python {m['Python']}, Pillow {m['Pillow']}")
    print(f"v1 {n} images; v2 {len(v2)} rows: {added} added, {removed} removed, {replaced} replaced, "
          f"{relabeled} relabeled; size {args.size}, {args.workers} workers, {inc.shards} shards\n")
    print("| run | seconds | decoded | reused | relabeled | removed |\n|---|---|---|---|---|---|")
    print(f"| full v2 (--no-reuse) | {t_full:.2f} | {full.decoded} | {full.reused} | {full.relabeled} | - |")
    print(f"| incremental v2 (base v1) | {t_inc:.2f} | {inc.decoded} | {inc.reused} | {inc.relabeled} | {inc.removed} |")
    print(f"\nincremental / full = {ratio:.3f} (target <= {RATIO_TARGET}): {'PASS' if ok_ratio else 'FAIL'}")
    print(f"decoded = {inc.decoded}, added + replaced = {added + replaced}: {'PASS' if ok_decoded else 'FAIL'}")
    print(f"shards and samples.npz identical to the full conversion: {'PASS' if same else 'FAIL'}")
    if args.check and not (ok_ratio and ok_decoded and same):
        sys.exit(1)


if __name__ == "__main__":
    main()
