"""Time ``wds-tools verify`` against plain large reads of the same shards (target: ≥ 80% of their speed),
and measure its peak memory on a 1M-sample index (target: under ~100 MB).

Speed (default). Converts a synthetic corpus (photo-like JPEGs, --count of them) at 224 px into
~32 MB shards (a few hundred MB in all), then times, in the same run and alternating:

- baseline: ``cat shards/*.tar > /dev/null`` (one process, large plain reads);
- baseline: a Python loop of 16 MiB ``readinto`` over the same files, one thread;
- ``verify`` (the index against itself, sizes, sha256, member tables, .npy headers and XXH3-64,
  labels and sample metadata, mean/std from the pixels), ``verify --no-stats`` (the same but
  mean/std) and ``verify --quick``;
- with ``--against DIR``: ``verify`` of the wds_tools in another checkout DIR (e.g. the main
  branch), in a helper process that times it in-process, so before and after are in the same run.

Warm: the files are in the page cache (read once before). Cold: before each timed run every
shard's cached pages are dropped with ``posix_fadvise(DONTNEED)`` (no root needed), so each
run reads from the disk (on a VM the host may still cache them).

Also printed: the CPU ceiling of any sha256-checking verify, hashing the same bytes already in
memory on one thread per core; when the page cache serves reads faster than that, no verify
that checks sha256 can keep up with cat.

Memory (``--rss``): builds the synthetic index scripts/bench_stats.py times (``bench_index.make_index``:
1M samples in 2,000 shards, index.json + samples.npz, no tars) and a real set of the same size at
2 px (1M samples in 2,000 tars, ~3 GB), and runs ``python -m wds_tools verify PATH --json`` on each
under ``/usr/bin/time -v`` (its "Maximum resident set size"); with ``--against DIR`` also that
checkout's verify; and, as the floor, a process that only imports wds_tools' verify and numpy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_index import make_index  # noqa: E402

from wds_tools.convert import convert  # noqa: E402
from wds_tools.format.index import FORMAT_NAME, write_index  # noqa: E402
from wds_tools.format.names import url_pattern  # noqa: E402
from wds_tools.format.npy import image_header  # noqa: E402
from wds_tools.format.packed import pack_strings  # noqa: E402
from wds_tools.format.tarwrite import ShardWriter  # noqa: E402
from wds_tools.inspect.verify import verify  # noqa: E402
from wds_tools.synth import write_corpus  # noqa: E402

# The helper that times another checkout's verify: one line "<quick 0|1> <path>" in, one line of
# seconds and ok out.
HELPER = """
import sys, time
from wds_tools.inspect.verify import verify
for line in sys.stdin:
    quick, path = line.split(" ", 1)
    t = time.perf_counter()
    r = verify(path.strip(), quick=quick == "1")
    print(f"{time.perf_counter() - t} {int(r.ok)}", flush=True)
"""


def build(root: Path, count: int) -> Path:
    dest = root / "out" / "v1" / "224"
    if (dest / "index.json").exists():
        return dest
    t = time.perf_counter()
    manifest = write_corpus(root / "corpus", count=count, sizes=((320, 240), (240, 320)), bad=False)
    convert(manifest, version="v1", size=224, out=root / "out", shard_size="32MB", val_fraction=0.0, progress=False)
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


def run_no_stats(dest: Path) -> None:
    r = verify(dest, stats=False)
    if not r.ok:
        raise SystemExit(r.to_text())


def run_quick(dest: Path) -> None:
    r = verify(dest, quick=True)
    if not r.ok:
        raise SystemExit(r.to_text())


class Against:
    """``verify`` of another checkout, timed in-process by a helper that stays up for the whole run."""

    def __init__(self, checkout: str, quick: bool = False):
        env = {**os.environ, "PYTHONPATH": checkout}
        self.quick = quick
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HELPER],
            cwd=checkout,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def __call__(self, dest: Path) -> float:
        self.proc.stdin.write(f"{int(self.quick)} {dest}\n")
        self.proc.stdin.flush()
        seconds, ok = self.proc.stdout.readline().split()
        if ok != "1":
            raise SystemExit(f"the other checkout's verify found problems in {dest}")
        return float(seconds)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


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


def speed(args) -> None:
    dest = build(Path(args.data), args.count)
    tars = sorted(dest.glob("*.tar"))
    total = sum(p.stat().st_size for p in tars)
    cat = "baseline: cat shards/*.tar > /dev/null"
    runs = {
        cat: run_cat,
        "baseline: Python 16 MiB readinto loop, 1 thread": run_python_read,
        "wds-tools verify": run_verify,
        "wds-tools verify --no-stats": run_no_stats,
        "wds-tools verify --quick": run_quick,
    }
    other, other_quick = f"wds-tools verify of {args.against}", f"wds-tools verify --quick of {args.against}"
    helpers = [Against(args.against), Against(args.against, quick=True)] if args.against else []
    if helpers:
        runs[other], runs[other_quick] = helpers
    results: dict[str, dict[str, float]] = {"warm": {}, "cold": {}}
    for cache in ("warm", "cold"):
        times: dict[str, list[float]] = {name: [] for name in runs}
        run_cat(dest)
        for _ in range(args.repeats):
            for name, fn in runs.items():  # alternate, so load on a shared machine hits all alike
                if cache == "cold":
                    drop_cache(tars)
                t = time.perf_counter()
                inner = fn(dest)
                times[name].append(inner if isinstance(fn, Against) else time.perf_counter() - t)
        results[cache] = {name: statistics.median(ts) for name, ts in times.items()}
    for helper in helpers:
        helper.close()
    print(f"\nmachine: {os.cpu_count()} cores; {len(tars)} shards, {total / 1e6:,.0f} MB; median of {args.repeats}")
    print("| page cache | what | median s | MB/s | speed vs cat |\n|---|---|---|---|---|")
    for cache, res in results.items():
        base = res[cat]
        for name, t in res.items():
            print(f"| {cache} | {name} | {t:.3f} | {total / t / 1e6:,.0f} | {base / t:.2f} |")
    ceiling = sha256_ceiling(tars, args.repeats)
    print(
        f"| - | ceiling: SHA-256 of the same bytes already in memory, {os.cpu_count()} threads | {ceiling:.3f} | "
        f"{total / ceiling / 1e6:,.0f} | |"
    )
    for cache, res in results.items():
        ratio = res[cat] / res["wds-tools verify"]
        print(
            f"{cache}: verify reads at {ratio:.2f} of cat's speed (target >= 0.80: {'PASS' if ratio >= 0.8 else 'FAIL'}); "
            f"at {ceiling / res['wds-tools verify']:.2f} of the SHA-256 ceiling"
            + (
                f"; {res[other] / res['wds-tools verify']:.2f}x the speed of {args.against}'s verify "
                f"(--quick: {res[other_quick] / res['wds-tools verify --quick']:.2f}x)"
                if helpers
                else ""
            )
        )


# ------------------------------------------------------------------ memory


def make_tiny_set(dest: Path, n: int, n_shards: int, size: int = 2) -> None:
    """A real converted-looking set: ``n`` samples of ``size`` px in ``n_shards`` tars, with its index."""
    if (dest / "index.json").exists():
        return
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    header = image_header(size)
    per = -(-n // n_shards)
    classes = [f"c{i}" for i in range(7)]
    cols: dict[str, list] = {
        c: []
        for c in (
            "key",
            "label",
            "shard",
            "npy_xxh3",
            "cls_offset",
            "cls_length",
            "json_offset",
            "json_length",
            "npy_offset",
            "npy_length",
        )
    }
    shards, paths, hist = [], [], np.zeros((3, 256), np.int64)
    fingerprint = rng.integers(0, 256, (n, 16)).astype("u1")
    for s in range(n_shards):
        name = f"train-{s:06d}.tar"
        w = ShardWriter(str(dest / name))
        rows = range(s * per, min(n, (s + 1) * per))
        pixels = rng.integers(0, 256, (len(rows), size, size, 3), dtype=np.uint8)
        labels = rng.integers(0, len(classes), len(rows))
        for t, i in enumerate(rows):
            key, label = f"{i:08x}-derm", int(labels[t])
            path = f"images/batch{i % 97:03d}/IMG_{i:07d}.jpg"
            meta = {
                "fingerprint": "xxh3_128:" + fingerprint[i].tobytes().hex(),
                "height": 3024,
                "key": key,
                "label": classes[label],
                "source_path": path,
                "width": 4032,
            }
            data = header + pixels[t].tobytes()
            for member, blob in (
                ("cls", str(label).encode()),
                ("json", json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()),
                ("npy", data),
            ):
                off, length = w.add(f"{key}.{member}", blob)
                cols[f"{member}_offset"].append(off)
                cols[f"{member}_length"].append(length)
            cols["key"].append(key.encode())
            cols["label"].append(label)
            cols["shard"].append(s)
            cols["npy_xxh3"].append(xxhash.xxh3_64_intdigest(data))
            paths.append(path)
        for c in range(3):
            hist[c] += np.bincount(pixels[..., c].ravel(), minlength=256)
        nbytes, sha = w.close()
        shards.append({"name": name, "split": "train", "samples": len(rows), "bytes": nbytes, "sha256": sha})
    from wds_tools.format.index import histogram_mean_std

    mean, std = histogram_mean_std(hist)
    columns = {
        "key": np.array(cols["key"], dtype="S"),
        "label": np.array(cols["label"], "<i4"),
        "shard": np.array(cols["shard"], "<u4"),
        "fingerprint": fingerprint,
        "width": np.full(n, 4032, "<u4"),
        "height": np.full(n, 3024, "<u4"),
        "src_size": np.full(n, 3_000_000, "<u8"),
        "src_mtime_ns": np.zeros(n, "<i8"),
        "npy_xxh3": np.array(cols["npy_xxh3"], "<u8"),
    }
    for c in ("cls_offset", "cls_length", "json_offset", "json_length", "npy_offset", "npy_length"):
        columns[c] = np.array(cols[c], "<u8")
    columns["path_offsets"], columns["path_data"] = pack_strings(paths)
    counts = np.bincount(columns["label"], minlength=len(classes)).tolist()
    meta = {
        "format": FORMAT_NAME,
        "format_version": 1,
        "dataset_version": "bench",
        "size": size,  # version 1 (read)
        "resize": "center-crop",
        "sample": {"members": ["cls", "json", "npy"], "npy_dtype": "uint8", "npy_shape": [size, size, 3]},
        "classes": classes,
        "class_counts": counts,
        "samples": n,
        "mean": mean,
        "std": std,
        "stats_split": "train",
        "splits": {
            "train": {
                "samples": n,
                "shards": n_shards,
                "urls": url_pattern("train", n_shards),
                "class_counts": counts,
                "mean": mean,
                "std": std,
            }
        },
        "shards": shards,
        "errors_file": None,
    }
    write_index(dest, meta, columns, sidecars=False)


def peak_rss(argv: list[str], cwd: str | None = None, env: dict | None = None) -> tuple[float, float, int]:
    """(peak RSS in MB, seconds, exit status) of a command, from GNU time's -v report."""
    t = time.perf_counter()
    p = subprocess.run(
        ["/usr/bin/time", "-v", *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seconds = time.perf_counter() - t
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    return kb / 1024, seconds, p.returncode


def memory(args) -> None:
    root = Path(args.data)
    index_only = root / f"index-{args.samples}"
    if not (index_only / "index.json").exists():
        make_index(index_only, args.samples, args.shards)
        (index_only / "baseline.jsonl").unlink()
    tiny = root / f"tiny-{args.samples}"
    t = time.perf_counter()
    make_tiny_set(tiny, args.samples, args.shards)
    print(
        f"sets ready in {time.perf_counter() - t:.1f} s: {index_only} (no tars), {tiny} "
        f"({sum(p.stat().st_size for p in tiny.glob('*.tar')) / 1e9:.2f} GB of tars)"
    )
    here = str(Path(__file__).resolve().parents[1])
    trees = [("this checkout", here)] + ([(args.against, args.against)] if args.against else [])
    rows = []
    floor = [sys.executable, "-c", "import numpy, xxhash, wds_tools.inspect.verify"]
    for label, tree in trees:
        env = {**os.environ, "PYTHONPATH": tree}
        rows.append((f"{label}: import only (the floor)", *peak_rss(floor, cwd=tree, env=env)))
        for name, folder in (("index only, shards missing", index_only), ("1M real tiny samples", tiny)):
            for quick in (False, True):
                cmd = [
                    sys.executable,
                    "-m",
                    "wds_tools",
                    "verify",
                    str(folder),
                    "--json",
                    *(["--quick"] if quick else []),
                ]
                mb, s, code = peak_rss(cmd, cwd=tree, env=env)
                rows.append((f"{label}: verify{' --quick' if quick else ''}, {name}", mb, s, code))
    print(
        f"\nmachine: {os.cpu_count()} cores; {args.samples:,} samples in {args.shards:,} shards; "
        "peak RSS from /usr/bin/time -v"
    )
    print("| what | peak RSS MB | seconds | exit |\n|---|---|---|---|")
    for name, mb, s, code in rows:
        print(f"| {name} | {mb:,.0f} | {s:.1f} | {code} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2600, help="images (about 151 kB of shard each at 224 px)")
    ap.add_argument("--data", default="bench-data/verify")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--against", default=None, help="another checkout whose verify to time in the same run")
    ap.add_argument("--rss", action="store_true", help="measure peak memory at --samples instead of speed")
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=2000)
    args = ap.parse_args()
    if args.against:
        args.against = str(Path(args.against).resolve())
    memory(args) if args.rss else speed(args)


if __name__ == "__main__":
    main()
