"""Benchmark incremental re-sharding: a new version reads and decodes only what changed.

In one run:

1. Sources: ``--count`` 12 MP JPEGs (4032x3024, quality 92; shared with bench_convert.py) are
   linked into a folder of this bench (symbolic links, so a source can be changed in place
   without touching the shared corpus); v1 = all of them, converted once.
2. v2, ~5% churn: 2% added, 1% removed, 1% changed in place (the path now holds another photo,
   so its size and mtime change), 1% relabeled.
3. Timed, ``--repeats`` times each (medians), configurations alternating, every source file's
   and every base shard's cached pages dropped first (``posix_fadvise(DONTNEED)``):
     full         v2 with --no-reuse (every image read and decoded),
     incremental  v2 with v1 as base, the default quick check (path, size, mtime),
     --checksum   v2 with v1 as base, every source read and fingerprinted.
   Each run is a fresh folder; shards, samples.npz and DALI indexes of both incremental runs must
   be byte-identical to the full conversion's. Targets: incremental <= 0.08 of full;
   ``decoded`` = added + changed.
4. The per-image costs that feed docs/SCALE.md's cost model, measured here: decode, cold and warm
   reads, XXH3/SHA-256/MD5 throughput, stat, copying a sample from a base, samples.npz bytes
   per sample, and the planning memory per manifest row (tracemalloc, 100,000 rows).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import os
import shutil
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import CLASSES, _busy_seconds, _own_seconds, ensure_corpus, machine  # noqa: E402
from bench_verify import drop_cache  # noqa: E402

from wds_tools.convert import convert  # noqa: E402
from wds_tools.convert.decode import decode_image  # noqa: E402
from wds_tools.convert.sourcecache import CACHE_DIR  # noqa: E402

RATIO_TARGET = 0.08


def write_rows(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label"])
        w.writerows(rows)
    return path


def _outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".tar", ".npz", ".idx")}


def timed_run(
    manifest: Path, out: Path, version: str, sources: list[Path], base_dir: Path | None, **kw
) -> tuple[float, float, object]:
    """(seconds, cores other processes used meanwhile, ConvertResult) of one conversion."""
    shutil.rmtree(out / version, ignore_errors=True)
    drop_cache(sources)
    if base_dir is not None:
        drop_cache(sorted(base_dir.glob("*.tar")))
    busy0, own0, t = _busy_seconds(), _own_seconds(), time.perf_counter()
    res = convert(manifest, version=version, out=out, progress=False, **kw)
    seconds = time.perf_counter() - t
    others = max(0.0, (_busy_seconds() - busy0 - (_own_seconds() - own0)) / seconds)
    return seconds, others, res


def measure_costs(paths: list[Path], base_dir: Path, size: int, work: Path) -> list[tuple[str, str]]:
    """Per-image costs on this machine (one core unless said)."""
    rows: list[tuple[str, str]] = []
    sample = paths[:40]
    mb = statistics.mean(p.stat().st_size for p in sample) / 1e6
    rows.append(("source file size (mean of 40)", f"{mb:.2f} MB"))
    drop_cache(sample)
    t = time.perf_counter()
    datas = [p.read_bytes() for p in sample]
    cold = time.perf_counter() - t
    rows.append(("read, cached pages dropped, one file after another", f"{mb * len(sample) / cold:.0f} MB/s"))
    from concurrent.futures import ThreadPoolExecutor

    threads = os.cpu_count() or 1
    drop_cache(sample)
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(Path.read_bytes, sample))
    rows.append(
        (
            f"read, cached pages dropped, {threads} files at once",
            f"{mb * len(sample) / (time.perf_counter() - t):.0f} MB/s",
        )
    )
    t = time.perf_counter()
    for p in sample:
        p.read_bytes()
    rows.append(("read, page cache", f"{mb * len(sample) / (time.perf_counter() - t):.0f} MB/s"))
    for name, fn in (
        ("xxh3-128", lambda d: xxhash.xxh3_128_digest(d)),
        ("sha256", lambda d: hashlib.sha256(d).digest()),
        ("md5", lambda d: hashlib.md5(d).digest()),
    ):
        t = time.perf_counter()
        for d in datas:
            fn(d)
        rows.append((f"{name} of the bytes in memory", f"{mb * len(sample) / (time.perf_counter() - t):.0f} MB/s"))
    t = time.perf_counter()
    n = 0
    for _ in range(20):
        for p in paths:
            os.stat(p)
            n += 1
    rows.append(("stat of a source (inode cached)", f"{1e6 * (time.perf_counter() - t) / n:.1f} us"))
    ms = []
    for d in datas[:20]:
        t = time.perf_counter()
        decode_image(d, size)
        ms.append(1000 * (time.perf_counter() - t))
    rows.append((f"decode_image to {size} px (bytes in memory), median of 20", f"{statistics.median(ms):.1f} ms"))
    # an unchanged sample end to end, one process: stat, copy from the base (its pages dropped), write
    v1 = base_dir.parent.parent.parent / "src" / "v1.csv"
    drop_cache(sorted(base_dir.glob("*.tar")))
    t = time.perf_counter()
    same = convert(
        v1,
        version="unchanged",
        size=size,
        out=base_dir.parent.parent,
        workers=1,
        base="v1",
        val_fraction=0.1,
        progress=False,
    )
    per = (time.perf_counter() - t) / same.samples_written
    rows.append(
        (f"an unchanged sample, whole run / samples (v1 again, 1 worker, {same.reused} reused)", f"{1000 * per:.2f} ms")
    )
    from wds_tools.format.index import load_index

    idx = load_index(base_dir)
    rows.append(
        (
            "samples.npz per sample (this index)",
            f"{(base_dir / 'samples.npz').stat().st_size / len(idx.samples):.0f} bytes",
        )
    )
    import json

    meta = json.loads((base_dir / "index.json").read_text())
    entry = len(json.dumps(meta["shards"][0], indent=1, sort_keys=True)) + 2  # nested one level deeper, comma
    rows.append(
        (
            "index.json: fixed part, and per shard",
            f"{(base_dir / 'index.json').stat().st_size - entry * len(idx.shards)} bytes + ~{entry} bytes per shard",
        )
    )
    # planning memory per manifest row: read a 100,000-row manifest and plan it (no files are opened)
    big = work / "plan-100k.csv"
    write_rows(big, [(f"k{i:07d}", f"images/{i % 1000:03d}/img_{i:07d}.jpg", CLASSES[i % 3]) for i in range(100_000)])
    from wds_tools.convert.options import ConvertOptions
    from wds_tools.convert.plan import plan_split
    from wds_tools.convert.source import read_source
    from wds_tools.convert.write import SampleTask

    tracemalloc.start()
    src = read_source(big, ConvertOptions(version="plan", size=224))
    labels = src.label_index()
    stats = [(bytes(16), 4_000_000, 1_700_000_000_000_000_000) for _ in src.rows]  # what the scan keeps
    plans = plan_split("train", [(r.key, labels[r.label]) for r in src.rows], shard_size=1700, seed=0)
    tasks = [
        tuple(
            SampleTask(
                r.key,
                r.path,
                r.source_path,
                labels[r.label],
                r.label,
                r.line,
                r.original_key,
                src_nbytes=stats[i][1],
                src_mtime_ns=stats[i][2],
            )
            for i in (plan.members)
            for r in (src.rows[i],)
        )
        for plan in plans
    ]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del plans, src, tasks, stats
    rows.append(
        (
            "planning memory per manifest row (rows, scan results, plan, sample tasks; peak over 100,000 rows)",
            f"{peak / 100_000:.0f} bytes",
        )
    )
    # a base's lookups (reuse.Base: by fingerprint, by source path), the same 100,000 rows
    tracemalloc.start()
    by_fp = {os.urandom(16): i for i in range(100_000)}
    by_path = {f"images/{i % 1000:03d}/img_{i:07d}.jpg": i for i in range(100_000)}
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del by_fp, by_path
    rows.append(
        ("a base's lookups per base row (by fingerprint and by path; 100,000 rows)", f"{peak / 100_000:.0f} bytes")
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=300, help="v1 images (default 300)")
    ap.add_argument("--data", default="bench-data/convert", help="corpus folder (shared with bench_convert.py)")
    ap.add_argument("--work", default="bench-data/incremental", help="this bench's folder (recreated)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()

    n = args.count
    added, removed, changed, relabeled = round(0.02 * n), round(0.01 * n), round(0.01 * n), round(0.01 * n)
    data = Path(args.data).resolve()
    _, corpus = ensure_corpus(data, n + added + changed)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    (src / "images").mkdir(parents=True)
    for p in corpus[: n + added]:
        (src / "images" / p.name).symlink_to(p)
    rel = [f"images/{p.name}" for p in corpus]
    v1 = [(f"img_{i:05d}", rel[i], CLASSES[i % len(CLASSES)]) for i in range(n)]
    m1 = write_rows(src / "v1.csv", v1)
    out = work / "out"
    common = dict(size=args.size, workers=args.workers, val_fraction=0.1)
    t = time.perf_counter()
    r1 = convert(m1, version="v1", out=out, progress=False, **common)
    print(f"v1: {r1.samples_written} samples in {r1.shards} shards, {time.perf_counter() - t:.1f} s", flush=True)

    v2 = list(v1[removed:])
    for j in range(changed):  # changed in place: the same path now holds another photo
        key, path, label = v2[j]
        (src / path).unlink()
        shutil.copyfile(corpus[n + added + j], src / path)
    for j in range(changed, changed + relabeled):
        key, path, label = v2[j]
        v2[j] = (key, path, CLASSES[(CLASSES.index(label) + 1) % len(CLASSES)])
    v2 += [(f"img_{i:05d}", rel[i], CLASSES[i % len(CLASSES)]) for i in range(n, n + added)]
    m2 = write_rows(src / "v2.csv", v2)
    sources = [src / r[1] for r in v2]
    base_dir = out / "v1" / str(args.size)

    configs = {
        "full v2 (--no-reuse)": dict(reuse=False),
        "incremental v2, default": dict(base="v1"),
        "incremental v2, --checksum": dict(base="v1", checksum=True),
    }
    # each run writes version v2 into its own output root holding a copy of v1 (and v1's cache of
    # source stats and hashes): every sample's .json names its dataset version, so outputs can only
    # be compared byte for byte under one version name
    outs: dict[str, Path] = {}
    for i, name in enumerate(configs):
        outs[name] = work / f"out-{i}"
        shutil.copytree(out / "v1", outs[name] / "v1")
        if (out / CACHE_DIR).is_dir():
            shutil.copytree(out / CACHE_DIR, outs[name] / CACHE_DIR)
    times: dict[str, list[float]] = {k: [] for k in configs}
    busy: dict[str, list[float]] = {k: [] for k in configs}
    results: dict[str, object] = {}
    names = list(configs)
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            seconds, others, res = timed_run(
                m2,
                outs[name],
                "v2",
                sources=sources,
                base_dir=outs[name] / "v1" / str(args.size),
                **configs[name],
                **common,
            )
            times[name].append(seconds)
            busy[name].append(others)
            results[name] = res
            print(
                f"  repeat {r + 1}/{args.repeats} {name}: {seconds:.2f} s, other processes {others:.2f} cores",
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in times.items()}
    full_name, inc_name, chk_name = names
    ref = _outputs(outs[full_name] / "v2" / str(args.size))
    same = {name: _outputs(outs[name] / "v2" / str(args.size)) == ref for name in (inc_name, chk_name)}
    ratio, chk_ratio = med[inc_name] / med[full_name], med[chk_name] / med[full_name]
    inc = results[inc_name]
    ok_ratio, ok_decoded = ratio <= RATIO_TARGET, inc.decoded == added + changed

    costs = measure_costs(corpus[:n], base_dir, args.size, work)
    m = machine()
    print(f"\nMachine: {m['cores usable (affinity)']} cores, {m['CPU']}, Python {m['Python']}, Pillow {m['Pillow']}")
    print(
        f"v1 {n} images; v2 {len(v2)} rows: {added} added, {removed} removed, {changed} changed in place, "
        f"{relabeled} relabeled; size {args.size}, {args.workers} workers, {inc.shards} shards (default size); "
        f"sources' and base shards' cached pages dropped before each run; medians of {args.repeats}\n"
    )
    print(
        "| run | seconds | / full | read to compare | unchanged, not read | decoded | reused | relabeled | "
        "identical to full | other processes (cores) |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for name in names:
        res = results[name]
        print(
            f"| {name} | {med[name]:.2f} | {med[name] / med[full_name]:.3f} | {res.sources_read} | "
            f"{res.unchanged_by_stat + res.unchanged_by_hash} | {res.decoded} | {res.reused} | {res.relabeled} | "
            f"{same.get(name, '-')} | {statistics.median(busy[name]):.2f} |"
        )
    print(f"\nincremental (default) / full = {ratio:.3f} (target <= {RATIO_TARGET}): {'PASS' if ok_ratio else 'FAIL'}")
    print(f"incremental --checksum / full = {chk_ratio:.3f} (stated beside it)")
    print(f"decoded = {inc.decoded}, added + changed = {added + changed}: {'PASS' if ok_decoded else 'FAIL'}")
    print(
        f"shards, samples.npz and .idx identical to the full conversion: default {same[inc_name]}, "
        f"--checksum {same[chk_name]}: {'PASS' if all(same.values()) else 'FAIL'}"
    )
    print("\nPer-image costs (this machine; docs/SCALE.md's model uses them)\n\n| cost | measured |\n|---|---|")
    for k, v in costs:
        print(f"| {k} | {v} |")
    if args.check and not (ok_ratio and ok_decoded and all(same.values())):
        sys.exit(1)


if __name__ == "__main__":
    main()
