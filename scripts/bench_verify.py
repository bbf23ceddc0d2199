"""Time ``wds-tools verify`` against plain large reads of the same shards (target: ≥ 80% of their speed).

Converts a synthetic corpus (photo-like JPEGs, --count of them) at 224 px into ~32 MB shards
(a few hundred MB in all), then times, in the same run and alternating:

- baseline: ``cat shards/*.tar > /dev/null`` (one process, large plain reads);
- baseline: a Python loop of 16 MiB ``readinto`` over the same files, one thread;
- ``verify`` (sizes, sha256, member tables, .npy headers, keys) and ``verify --quick``.

Warm: the files are in the page cache (read once before). Cold: before each timed run every
shard's cached pages are dropped with ``posix_fadvise(DONTNEED)`` (no root needed), so each
run reads from the disk (on a VM the host may still cache them).

Also printed: the CPU ceiling of any sha256-checking verify, hashing the same bytes already in
memory on one thread per core; when the page cache serves reads faster than that, no verify
that checks sha256 can keep up with cat.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from wds_tools.convert import convert
from wds_tools.synth import write_corpus
from wds_tools.inspect.verify import verify


def build(root: Path, count: int) -> Path:
    dest = root / "out" / "v1" / "224"
    if (dest / "index.json").exists():
        return dest
    t = time.perf_counter()
    manifest = write_corpus(root / "corpus", count=count, sizes=((320, 240), (240, 320)), bad=False)
    convert(manifest, version="v1", size=224, out=root / "out", shard_size="32MB", val_fraction=0.0,
            progress=False)
    print(f"converted {count:,} images into {dest} in {time.perf_counter() - t:.1f} s")
    return dest


def drop_cache(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_cat(dest: Path) -> None:
    subprocess.run(f"cat {dest}/*.tar > /dev/null", shell=True, check=True)


def run_python_read(dest: Path) -> None:
    buf = bytearray(16 << 20)
    for p in sorted(dest.glob("*.tar")):
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def run_verify(dest: Path) -> None:
    r = verify(dest)
    if not r.ok:
        raise SystemExit(r.to_text())


def run_quick(dest: Path) -> None:
    r = verify(dest, quick=True)
    if not r.ok:
        raise SystemExit(r.to_text())


def sha256_ceiling(tars: list[Path], repeats: int) -> float:
    """Seconds to SHA-256 the shards' bytes already in memory, one thread per core: verify's CPU floor."""
    blobs = [p.read_bytes() for p in tars]
    times = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as ex:
        for _ in range(repeats):
            t = time.perf_counter()
            list(ex.map(lambda b: hashlib.sha256(b).digest(), blobs))
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2600, help="images (about 151 kB of shard each at 224 px)")
    ap.add_argument("--data", default="bench-data/verify")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dest = build(Path(args.data), args.count)
    tars = sorted(dest.glob("*.tar"))
    total = sum(p.stat().st_size for p in tars)
    runs = {"baseline: cat shards/*.tar > /dev/null": run_cat,
            "baseline: Python 16 MiB readinto loop, 1 thread": run_python_read,
            "wds-tools verify": run_verify,
            "wds-tools verify --quick": run_quick}
    results: dict[str, dict[str, float]] = {"warm": {}, "cold": {}}
    for cache in ("warm", "cold"):
        times: dict[str, list[float]] = {name: [] for name in runs}
        run_cat(dest)
        for _ in range(args.repeats):
            for name, fn in runs.items():  # alternate, so load on a shared machine hits all alike
                if cache == "cold":
                    drop_cache(tars)
                t = time.perf_counter()
                fn(dest)
                times[name].append(time.perf_counter() - t)
        results[cache] = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"\nmachine: {os.cpu_count()} cores; {len(tars)} shards, {total / 1e6:,.0f} MB; median of {args.repeats}")
    print("| page cache | what | median s | MB/s | speed vs cat |\n|---|---|---|---|---|")
    for cache, res in results.items():
        base = res["baseline: cat shards/*.tar > /dev/null"]
        for name, t in res.items():
            print(f"| {cache} | {name} | {t:.3f} | {total / t / 1e6:,.0f} | {base / t:.2f} |")
    ceiling = sha256_ceiling(tars, args.repeats)
    print(f"| - | ceiling: SHA-256 of the same bytes already in memory, {os.cpu_count()} threads | {ceiling:.3f} | "
          f"{total / ceiling / 1e6:,.0f} | |")
    for cache, res in results.items():
        ratio = res["baseline: cat shards/*.tar > /dev/null"] / res["wds-tools verify"]
        print(f"{cache}: verify reads at {ratio:.2f} of cat's speed (target >= 0.80: {'PASS' if ratio >= 0.8 else 'FAIL'}); "
              f"at {ceiling / res['wds-tools verify']:.2f} of the SHA-256 ceiling")


if __name__ == "__main__":
    main()
