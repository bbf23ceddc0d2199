"""Time loading a large sample index: wds-tools' samples.npz against a JSON-lines baseline.

Builds a synthetic index of --samples rows in --shards shards (index.json + samples.npz, the real
format; no tars) and, as the baseline, the same rows as one JSON object per line. Loading means
reading every column and decoding every key to a Python str. Target: 1M entries in under 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from wds_tools.format.index import load_index, write_index
from wds_tools.format.packed import pack_strings


def make_index(dest: Path, n: int, n_shards: int) -> None:
    rng = np.random.default_rng(0)
    keys = [f"{i:08x}-{rng.integers(0, 2**32):08x}-derm" for i in range(n)]
    paths = [f"images/batch{i % 97:03d}/IMG_{i:07d}.jpg" for i in range(n)]
    per = -(-n // n_shards)
    cols = {
        "key": np.array([k.encode() for k in keys], dtype="S"),
        "label": rng.integers(0, 7, n).astype("<i4"),
        "shard": (np.arange(n) // per).astype("<u4"),
        "fingerprint": rng.integers(0, 256, (n, 16)).astype("u1"),
        "width": np.full(n, 4032, "<u4"),
        "height": np.full(n, 3024, "<u4"),
        "src_size": rng.integers(2e6, 5e6, n).astype("<u8"),
        "src_mtime_ns": rng.integers(0, 2**62, n).astype("<i8"),
        "npy_xxh3": rng.integers(0, 2**63, n).astype("<u8"),
    }
    pos = np.arange(n) % per
    for j, member in enumerate(("cls", "json", "npy")):
        cols[f"{member}_offset"] = (pos * 154112 + 512 + j * 1024).astype("<u8")
        cols[f"{member}_length"] = np.full(n, (1, 200, 150656)[j], "<u8")
    cols["path_offsets"], cols["path_data"] = pack_strings(paths)
    rows = np.bincount(cols["shard"], minlength=n_shards)  # the last shard holds the remainder
    shards = [
        {
            "name": f"train-{s:06d}.tar",
            "split": "train",
            "samples": int(k),
            "bytes": int(k) * 154112,
            "sha256": "0" * 64,
        }
        for s, k in enumerate(rows)
    ]
    # the golden version-1 index.json (every field the format requires), with this index's shards and counts
    meta = json.loads((Path(__file__).resolve().parents[1] / "tests/golden/format-v1/index.json").read_text())
    classes = [f"c{i}" for i in range(7)]
    counts = [int(k) for k in np.bincount(cols["label"], minlength=7)]
    stats = {"mean": meta["mean"], "std": meta["std"]}
    meta.update(
        dataset_version="bench",  # version 1's columns (still read)
        size=224,
        classes=classes,
        class_counts=counts,
        samples=n,
        shards=shards,
        splits={
            "train": {
                "samples": n,
                "shards": n_shards,
                "urls": f"train-{{000000..{n_shards - 1:06d}}}.tar",
                "class_counts": counts,
                **stats,
            }
        },
        stats_split="train",
    )
    meta["sample"]["npy_shape"] = [224, 224, 3]
    dest.mkdir(parents=True, exist_ok=True)
    write_index(dest, meta, cols)
    with open(dest / "baseline.jsonl", "w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "key": keys[i],
                        "label": int(cols["label"][i]),
                        "shard": int(cols["shard"][i]),
                        "fingerprint": cols["fingerprint"][i].tobytes().hex(),
                        "path": paths[i],
                        **{
                            c: int(cols[c][i])
                            for c in (
                                "width",
                                "height",
                                "src_size",
                                "src_mtime_ns",
                                "npy_xxh3",
                                "cls_offset",
                                "cls_length",
                                "json_offset",
                                "json_length",
                                "npy_offset",
                                "npy_length",
                            )
                        },
                    }
                )
                + "\n"
            )


def load_ours(dest: Path) -> int:
    idx = load_index(dest)
    s = idx.samples
    keys = s.keys  # every key as a str
    return len(keys) + int(s["npy_offset"][-1] > 0)


def load_baseline(dest: Path) -> int:
    with open(dest / "baseline.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=2000)
    ap.add_argument("--data", default="bench-data/index")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dest = Path(args.data) / f"{args.samples}"
    if not (dest / "index.json").exists():
        t = time.perf_counter()
        make_index(dest, args.samples, args.shards)
        print(f"built a {args.samples:,}-sample index in {time.perf_counter() - t:.1f} s at {dest}")
    results = {}
    for name, fn in (("wds-tools index.json + samples.npz", load_ours), ("baseline: JSON lines", load_baseline)):
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn(dest)
            times.append(time.perf_counter() - t)
        results[name] = statistics.median(times)
    npz = (dest / "samples.npz").stat().st_size / 1e6
    print(
        f"\nmachine: {os.cpu_count()} cores; {args.samples:,} samples, {args.shards} shards; samples.npz {npz:.0f} MB"
    )
    print("| loader | median load s |\n|---|---|")
    for name, t in results.items():
        print(f"| {name} | {t:.3f} |")
    ours, base = results["wds-tools index.json + samples.npz"], results["baseline: JSON lines"]
    print(f"\nratio baseline/ours: {base / ours:.1f}x; target < 2 s for 1M: {'PASS' if ours < 2 else 'FAIL'}")


if __name__ == "__main__":
    main()
