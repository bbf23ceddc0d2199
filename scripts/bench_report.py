"""Time ``wds-tools report`` on a large synthetic set (target: 1M samples in at most 60 s and 1 GB, the page at
most 10 MB), against the commands whose figures the page holds, run one after the other as before it existed.

Builds two versions of an index of --samples rows in 2,000 shards (index.json + samples.npz, format version 3,
7 classes, every tenth shard val; metadata HAM-like: a lesion id of two rows each, sex, age with gaps, 15 sites):
v0, and v1 built from it (build.base v0: 1% of the keys removed, 1% added, 1% relabelled). The tars hold only the
samples whose pixels the page reads (its thumbnail draw and the changes it shows, and with --dups the samples the
random hashes pair by chance, read for their colour; 224 px lesion photos), as the report reads no other: every
other sample's shard is absent, so a read of one would fail the run.

Each command runs in its own process (imports included), its peak RSS from ``getrusage``: ``wds-tools report
v1`` (near-duplicates left out by default above 200,000 samples: the page says so), and as the baseline
``wds-tools stats v1 --by site --json`` then ``wds-tools diff v0 v1 --json``. --dups also times the report
with ``--dups`` (the search alone takes about a minute per million samples: docs/guide/figures.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from wds_tools.format.index import (
    FORMAT_NAME,
    FORMAT_VERSION,
    SAMPLE_COLUMNS,
    open_index,
    read_sample_table,
    write_index,
)
from wds_tools.format.npy import npy_header
from wds_tools.format.packed import pack_strings
from wds_tools.format.phash import FLAT_RULES
from wds_tools.format.tarwrite import ShardWriter

SIZE = 224
SHARDS = 2000
SITES = ["back", "lower extremity", "trunk", "upper extremity", "abdomen", "face", "chest", "foot", "neck",
         "scalp", "hand", "ear", "genital", "acral", "unknown"]  # fmt: skip


def _columns(keys: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = len(keys)
    per = -(-n // SHARDS)
    cols = {name: np.zeros(n, dtype) for name, dtype in SAMPLE_COLUMNS.items() if name not in ("key", "path_data")}
    cols["key"] = keys
    cols["label"] = labels.astype("<i4")
    cols["shard"] = (np.arange(n) // per).astype("<u4")
    cols["fingerprint"] = np.zeros((n, 16), "u1")
    cols["fingerprint"][:, :8] = np.frombuffer(keys.astype("S16").tobytes(), "u1").reshape(n, 16)[:, :8]
    cols["phash"] = rng.integers(0, 2**63, (n, 7), dtype=np.uint64)
    cols["npy_length"] = np.full(n, 128 + SIZE * SIZE * 3, "<u8")
    cols["path_offsets"], cols["path_data"] = pack_strings([f"images/{k.decode()}.jpg" for k in keys.tolist()])
    lesions = np.arange(n) // 2  # two photos per lesion
    cols["meta0"] = lesions.astype("<i4")
    cols["meta0_offsets"], cols["meta0_data"] = pack_strings([f"HAM_{i:07d}" for i in range((n + 1) // 2)])
    cols["meta1"] = rng.integers(-1, 3, n).astype("<i4")  # sex, missing where -1
    cols["meta1_offsets"], cols["meta1_data"] = pack_strings(["female", "male", "unknown"])
    age = rng.normal(52, 16, n).round()
    age[rng.random(n) < 0.1] = np.nan
    cols["meta2"] = age.astype("<f8")
    cols["meta3"] = rng.integers(0, len(SITES), n).astype("<i4")
    cols["meta3_offsets"], cols["meta3_data"] = pack_strings(sorted(SITES))
    return cols


def _meta(version: str, n: int, cols: dict[str, np.ndarray], base: str | None) -> dict:
    counts = np.bincount(cols["shard"].astype(np.int64), minlength=SHARDS)
    shards = [
        {
            "name": f"{'val' if s % 10 == 0 else 'train'}-{s:06d}.tar",
            "split": "val" if s % 10 == 0 else "train",
            "samples": int(counts[s]),
            "bytes": int(counts[s]) * 152_064,
            "sha256": "0" * 64,
        }
        for s in range(SHARDS)
    ]
    shards.sort(key=lambda sh: (sh["split"], sh["name"]))  # the index's order: splits by name, then number
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "dataset_version": version,
        "size": SIZE,
        "resize": "center-crop",
        "decode": {"colour": "srgb", "filter": "lanczos", "draft": True},
        "classes": [f"c{i}" for i in range(7)],
        "samples": n,
        "shards": shards,
        "splits": {},
        "build": {"base": base, "source": {"kind": "csv", "rows": n}, "shard_size": -(-n // SHARDS)},
        "errors_file": None,
        "phash_flat_rules": FLAT_RULES,
        "metadata": [
            {"name": "lesion_id", "type": "string"},
            {"name": "sex", "type": "string"},
            {"name": "age", "type": "float"},
            {"name": "localization", "type": "string"},
        ],
    }


def _ordered(cols: dict[str, np.ndarray], meta: dict) -> dict[str, np.ndarray]:
    """Rows in the index's order (by the position of their shard in ``meta["shards"]``), shard numbers renumbered."""
    position = {int(sh["name"].split("-")[1][:6]): i for i, sh in enumerate(meta["shards"])}
    new_shard = np.array([position[s] for s in range(SHARDS)], np.int64)[cols["shard"].astype(np.int64)]
    order = np.argsort(new_shard, kind="stable")
    out = {}
    n = len(cols["key"])
    for k, v in cols.items():
        out[k] = v[order] if (v.ndim >= 1 and len(v) == n and not k.endswith(("_offsets", "_data"))) else v
    out["shard"] = new_shard[order].astype("<u4")
    out["path_offsets"], out["path_data"] = pack_strings([f"images/{k.decode()}.jpg" for k in out["key"].tolist()])
    return out


def build(root: Path, n: int) -> tuple[Path, Path]:
    """v0 and v1 (built from v0) under root/shards; tars left to ``write_pixels``."""
    rng = np.random.default_rng(0)
    keys0 = np.array([f"ISIC_{i:08d}".encode() for i in range(n)], dtype="S13")
    labels0 = rng.integers(0, 7, n)
    removed = rng.random(n) < 0.01
    relabelled = ~removed & (rng.random(n) < 0.01)
    added = int(removed.sum())
    keys1 = np.concatenate([keys0[~removed], np.array([f"ISIC_{n + i:08d}".encode() for i in range(added)], "S13")])
    labels1 = np.concatenate([np.where(relabelled, (labels0 + 1) % 7, labels0)[~removed], rng.integers(0, 7, added)])
    folders = []
    for version, keys, labels, base in (("v0", keys0, labels0, None), ("v1", keys1, labels1, "v0")):
        dest = root / "shards" / version / str(SIZE)
        cols = _columns(keys, labels, np.random.default_rng(1))
        meta = _meta(version, len(keys), cols, base)
        cols = _ordered(cols, meta)
        dest.mkdir(parents=True, exist_ok=True)
        write_index(dest, meta, cols, sidecars=False)
        folders.append(dest)
    return folders[0], folders[1]


def write_pixels(folder: Path, rows: np.ndarray) -> None:
    """Tars holding the ``.npy`` of ``rows`` only (lesion photos), their offsets written into samples.npz."""
    from wds_tools.convert.decode import decode_image
    from wds_tools.synth import jpeg_bytes, lesion_photo

    _, info = open_index(folder)
    meta, cols = info.raw, read_sample_table(str(folder), info).columns
    pool = [decode_image(jpeg_bytes(lesion_photo(320, 320, k % 3, 700 + k)), SIZE).pixels for k in range(14)]
    header = npy_header((SIZE, SIZE, 3))
    rows = np.unique(rows)
    for s in np.unique(cols["shard"][rows]).tolist():
        name = info.shards[s].name
        w = ShardWriter(str(folder / name), digest=False)
        for r in rows[cols["shard"][rows] == s].tolist():
            data = header + pool[int(cols["label"][r]) * 2 + r % 2].tobytes()
            cols["npy_offset"][r], cols["npy_length"][r] = w.add(f"{cols['key'][r].decode()}.npy", data)
        w.end()
        os.replace(w.tmp, w.path)
    write_index(folder, {k: v for k, v in meta.items() if k != "samples_file"}, cols, sidecars=False)


def _rows_read(v0: Path, v1: Path) -> tuple[np.ndarray, np.ndarray]:
    """The rows of v0 and v1 whose pixels the page reads: the thumbnail draw of v1 and the changes shown."""
    from wds_tools.inspect.diff import diff_versions
    from wds_tools.inspect.page import GRID_LIMIT, THUMBS_PER_CLASS
    from wds_tools.inspect.page.evidence import MAX_CHANGES
    from wds_tools.inspect.page.thumbs import draw_per_class

    c0 = read_sample_table(*open_index(v0), ("key", "label"))
    c1 = read_sample_table(*open_index(v1), ("key", "label"))
    per = max(1, min(THUMBS_PER_CLASS, GRID_LIMIT // 7))
    grid = np.concatenate(draw_per_class(c1["label"].astype(np.int64), 7, per, 0))
    d = diff_versions(v0, v1)
    shown1 = d.added[:MAX_CHANGES] + d.relabeled[:MAX_CHANGES] + d.changed[:MAX_CHANGES]
    shown0 = d.removed[:MAX_CHANGES] + d.changed[:MAX_CHANGES]
    rows1 = np.flatnonzero(np.isin(c1["key"], np.array([k.encode() for k in shown1], "S13")))
    rows0 = np.flatnonzero(np.isin(c0["key"], np.array([k.encode() for k in shown0], "S13"))) if shown0 else []
    return np.asarray(rows0, np.int64), np.concatenate([grid, rows1]).astype(np.int64)


_TIMED = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
run = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - t0
use = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "cpu": use.ru_utime + use.ru_stime, "rss_mib": use.ru_maxrss / 1024,
                  "rc": run.returncode, "out": run.stdout[-2000:], "err": run.stderr[-2000:]}))
"""


def timed(args: list[str], cwd: Path) -> dict:
    """Wall, CPU and peak RSS of one command in its own process."""
    done = subprocess.run([sys.executable, "-c", _TIMED, *args], capture_output=True, text=True, cwd=cwd, check=True)
    out = json.loads(done.stdout)
    if out["rc"] != 0:
        raise SystemExit(f"{' '.join(args)} exited {out['rc']}:\n{out['out']}\n{out['err']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each command (medians printed)")
    ap.add_argument("--dups", action="store_true", help="also time the report with --dups")
    ap.add_argument("--keep", metavar="DIR", help="build the set in DIR and keep it (default: a temporary folder)")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        t = time.perf_counter()
        v0, v1 = build(tmp, args.samples)
        rows0, rows1 = _rows_read(v0, v1)
        if args.dups:  # random hashes pair a few samples by chance: the search reads their pixels for their colour
            from wds_tools.similar.near import DEFAULT_THRESHOLD, near_clusters

            found = near_clusters(read_sample_table(*open_index(v1), ("phash",))["phash"], DEFAULT_THRESHOLD)
            rows1 = np.concatenate([rows1, *found.clusters]).astype(np.int64)
        write_pixels(v0, rows0)
        write_pixels(v1, rows1)
        print(f"built v0 and v1 ({args.samples:,} samples each, {len(rows0) + len(rows1)} with pixels) in "
              f"{time.perf_counter() - t:.0f} s at {tmp}")  # fmt: skip
        exe = str(Path(sys.executable).with_name("wds-tools"))
        report = [exe, "report", str(v1), "-o", str(tmp / "report.html"), "-q", "--json", "--loader-workers", "8"]
        baseline = [
            [exe, "stats", str(v1), "--by", "localization", "--json", "--loader-workers", "8"],
            [exe, "diff", str(v0), str(v1), "--json"],
        ]
        runs: dict[str, list[dict]] = {"report": [], "stats + diff": [], "report --dups": []}
        for _ in range(args.rounds):
            load = os.getloadavg()[0]
            r = timed(report, tmp)
            r["load"] = load
            r["page"] = json.loads(r["out"])
            runs["report"].append(r)
            b = [timed(cmd, tmp) for cmd in baseline]
            runs["stats + diff"].append(
                {
                    "wall": sum(x["wall"] for x in b),
                    "cpu": sum(x["cpu"] for x in b),
                    "rss_mib": max(x["rss_mib"] for x in b),
                    "load": load,
                }
            )
            if args.dups:
                d = timed([*report, "--dups"], tmp)
                d["load"] = load
                runs["report --dups"].append(d)
        page = runs["report"][-1]["page"]
        print(
            f"\nmachine: {os.cpu_count()} cores; {args.samples:,} samples; the page {page['bytes'] / 1e6:.2f} MB, "
            f"{page['thumbnails']} thumbnails ({page['thumbnails_left_out']} left out), near-duplicates: "
            f"{page['duplicates'][:60]}...; compared with {page['compared_with']}\n"
        )
        print("| command (own process) | median wall s | median CPU s | peak RSS MiB | load (1 min) |")
        print("|---|---|---|---|---|")
        for name, rs in runs.items():
            if rs:
                print(
                    f"| {name} | {statistics.median(x['wall'] for x in rs):.1f} | "
                    f"{statistics.median(x['cpu'] for x in rs):.1f} | {max(x['rss_mib'] for x in rs):.0f} | "
                    f"{', '.join(format(x['load'], '.1f') for x in rs)} |"
                )
        ours = statistics.median(x["wall"] for x in runs["report"])
        base = statistics.median(x["wall"] for x in runs["stats + diff"])
        rss = max(x["rss_mib"] for x in runs["report"])
        print(
            f"\nratio report / (stats + diff): {ours / base:.2f}; targets: at most 60 s "
            f"({'PASS' if ours <= 60 else 'FAIL'}), 1 GB ({'PASS' if rss <= 1024 else 'FAIL'}), a page of at most "
            f"10 MB ({'PASS' if page['bytes'] <= 10_000_000 else 'FAIL'})"
        )
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
