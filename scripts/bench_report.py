"""Time ``wds-tools report`` on a large synthetic set (target: 1M samples in at most 60 s and 1 GB, the page at
most 10 MB), against the commands whose figures the page holds, run one after the other as before it existed.

Builds two versions of an index of --samples rows in about --shards shards (index.json + samples.npz, 7 classes,
one key in ten val; metadata HAM-like: a lesion id of two rows each, sex, age with gaps, 15 sites): v0, and v1
built from it (build.base v0: 1% of the keys removed, 1% added, 1% relabelled). Their index.json is that of a real
conversion of 14 lesion photos (``wds_tools.convert.convert``, so every field is the converter's) scaled up to
these rows, and samples.npz is written by the format's own writers (``write_index``, ``encode_columns``). The tars
hold only the samples whose pixels the page reads (its thumbnail draw and the changes it shows, and with --dups the
samples the random hashes pair by chance, read for their colour; the template's 224 px pixels), as the report reads
no other: every other sample's shard is absent, so a read of one would fail the run.

Each command runs in its own process (imports included), its peak RSS from ``getrusage``: ``wds-tools report
v1`` (near-duplicates left out by default above 200,000 samples: the page says so), and as the baseline
``wds-tools stats v1 --by localization --json`` then ``wds-tools diff v0 v1 --json``. --dups also times the report
with ``--dups`` (the search alone takes about a minute per million samples: docs/guide/figures.md).
"""

from __future__ import annotations

import argparse
import copy
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
import xxhash

from wds_tools.format.index import SAMPLE_COLUMNS, load_index, open_index, read_sample_table, write_index
from wds_tools.format.meta import encode_columns, metadata_columns
from wds_tools.format.names import url_pattern
from wds_tools.format.npy import npy_header
from wds_tools.format.packed import pack_strings
from wds_tools.format.phash import WINDOWS
from wds_tools.format.tarwrite import ShardWriter

SIZE = 224
SHARDS = 2000
SITES = ["back", "lower extremity", "trunk", "upper extremity", "abdomen", "face", "chest", "foot", "neck",
         "scalp", "hand", "ear", "genital", "acral", "unknown"]  # fmt: skip
SEXES = ["female", "male", "unknown"]
POOL = 14  # lesion photos of the template conversion: two of each class


def template(root: Path) -> tuple[dict, list[bytes]]:
    """index.json of a real conversion (``wds_tools.convert.convert`` of POOL lesion photos, 7 classes, the four
    metadata columns) and its samples' .npy bytes, in key order: every field the format asks for, as the
    converter writes it, so that the scaled-up index cannot lose one when the format gains it."""
    from wds_tools.convert import convert
    from wds_tools.synth import jpeg_bytes, lesion_photo

    src = root / "template-source"
    (src / "images").mkdir(parents=True, exist_ok=True)
    lines = ["key,label,path,lesion_id,sex,age,localization"]
    for k in range(POOL):
        (src / "images" / f"t{k:02d}.jpg").write_bytes(jpeg_bytes(lesion_photo(320, 320, k % 3, 700 + k)))
        age = "" if k == 3 else f"{40 + k}.0"  # a gap: the column is a float one with missing values, as HAM's
        lines.append(f"t{k:02d},c{k // 2},images/t{k:02d}.jpg,HAM_{k // 2:07d},{SEXES[k % 3]},{age},{SITES[k]}")
    (src / "manifest.csv").write_text("\n".join(lines) + "\n")
    convert(src / "manifest.csv", version="template", size=SIZE, out=root / "template", workers=1, progress=False)
    folder = root / "template" / "template" / str(SIZE)
    index = load_index(folder)
    cols = index.samples.columns
    pool = []
    for r in np.argsort(cols["key"]).tolist():
        with open(folder / index.shards[int(cols["shard"][r])]["name"], "rb") as f:
            f.seek(int(cols["npy_offset"][r]))
            pool.append(f.read(int(cols["npy_length"][r])))
    return index.meta, pool


def _version(
    tmpl: dict, version: str, base: str | None, numbers: np.ndarray, labels: np.ndarray, attrs: dict, shards: int
) -> tuple[dict, dict[str, np.ndarray]]:
    """index.json and samples.npz of one version: the keys ``ISIC_<numbers>`` with their labels, split as
    the converter writes them (each split's rows in its own shards of at most ceil(n / shards) rows, train
    then val: the index's order); every other field as the template has it."""
    n = len(numbers)
    per = max(1, -(-n // shards))
    val = numbers % 10 == 0  # a key keeps its split from one version to the next, as a split base makes it
    order = np.lexsort((numbers, val))  # train rows, then val rows, each in key order
    numbers, labels, val = numbers[order], labels[order], val[order]
    entries, shard_col, splits = [], np.zeros(n, "<u4"), {}
    for split, rows in (("train", np.flatnonzero(~val)), ("val", np.flatnonzero(val))):
        count = -(-len(rows) // per)
        if not count:
            continue
        class_counts = np.bincount(labels[rows], minlength=7)
        for j in range(count):
            part = rows[j * per : (j + 1) * per]
            shard_col[part] = len(entries)
            entries.append({"name": f"{split}-{j:06d}.tar", "split": split, "samples": len(part),
                            "bytes": 0, "sha256": "0" * 64})  # fmt: skip
        splits[split] = {"samples": len(rows), "shards": count, "urls": url_pattern(split, count),
                         "class_counts": class_counts.tolist(), "mean": tmpl["mean"], "std": tmpl["std"]}  # fmt: skip
    for e in entries:  # as large as the converter's samples make a shard (the tars hold only the pixels read)
        e["bytes"] = e["samples"] * attrs["sample_bytes"]
    keys = np.array([f"ISIC_{i:08d}".encode() for i in numbers.tolist()], dtype="S13")
    cols = {
        name: np.zeros(n, dtype) for name, dtype in SAMPLE_COLUMNS.items() if name not in ("path_offsets", "path_data")
    }
    cols["key"], cols["label"], cols["shard"] = keys, labels.astype("<i4"), shard_col
    cols["fingerprint"] = np.zeros((n, 16), "u1")
    cols["fingerprint"][:, :8] = np.frombuffer(keys.astype("S16").tobytes(), "u1").reshape(n, 16)[:, :8]
    cols["phash"] = attrs["phash"][numbers]
    cols["width"][:], cols["height"][:] = 320, 320
    cols["npy_length"][:] = 128 + SIZE * SIZE * 3
    cols["npy_xxh3"] = attrs["xxh3"][labels * 2 + numbers % 2]  # the pool photo each sample's pixels are
    cols["path_offsets"], cols["path_data"] = pack_strings([f"images/{k.decode()}.jpg" for k in keys.tolist()])
    columns = metadata_columns(tmpl)
    values = {
        "lesion_id": [f"HAM_{i:07d}" for i in (numbers // 2).tolist()],  # two photos per lesion
        "sex": [SEXES[s] if s >= 0 else None for s in attrs["sex"][numbers].tolist()],
        "age": [None if a != a else a for a in attrs["age"][numbers].tolist()],
        "localization": [SITES[s] for s in attrs["site"][numbers].tolist()],
    }
    cols.update(encode_columns(columns, list(zip(*(values[c.name] for c in columns)))))
    meta = {k: v for k, v in copy.deepcopy(tmpl).items() if k != "samples_file"}
    meta.update(dataset_version=version, samples=n, shards=entries, splits=splits,
                class_counts=np.bincount(labels, minlength=7).tolist(), stats_split="train" if "train" in splits else "all")  # fmt: skip
    meta["build"].update(base=base, shard_size=per, source={**meta["build"]["source"], "rows": n})
    return meta, cols


def build(root: Path, n: int, shards: int = SHARDS) -> tuple[Path, Path, list[bytes]]:
    """v0 and v1 (built from v0) under root/shards, from the template conversion; tars left to ``write_pixels``."""
    tmpl, pool = template(root)
    rng = np.random.default_rng(0)
    labels0 = rng.integers(0, 7, n)
    removed = rng.random(n) < 0.01
    relabelled = ~removed & (rng.random(n) < 0.01)
    added = int(removed.sum())
    total = n + added  # every key either version has, and its attributes
    age = rng.normal(52, 16, total).round()
    age[rng.random(total) < 0.1] = np.nan
    attrs = {
        "phash": rng.integers(0, 2**63, (total, WINDOWS), dtype=np.uint64),
        "sex": rng.integers(-1, 3, total),  # missing where -1
        "age": age,
        "site": rng.integers(0, len(SITES), total),
        "xxh3": np.array([xxhash.xxh3_64_intdigest(p) for p in pool], "<u8"),
        "sample_bytes": sum(s["bytes"] for s in tmpl["shards"]) // tmpl["samples"],
    }
    numbers1 = np.concatenate([np.arange(n)[~removed], np.arange(n, total)])
    labels1 = np.concatenate([np.where(relabelled, (labels0 + 1) % 7, labels0)[~removed], rng.integers(0, 7, added)])
    folders = []
    for version, numbers, labels, base in (("v0", np.arange(n), labels0, None), ("v1", numbers1, labels1, "v0")):
        dest = root / "shards" / version / str(SIZE)
        meta, cols = _version(tmpl, version, base, numbers, labels, attrs, shards)
        dest.mkdir(parents=True, exist_ok=True)
        write_index(dest, meta, cols, sidecars=False)
        folders.append(dest)
    return folders[0], folders[1], pool


def write_pixels(folder: Path, rows: np.ndarray, pool: list[bytes]) -> None:
    """Tars holding the ``.npy`` of ``rows`` only (the template's pixels), their offsets written into samples.npz."""
    index = load_index(folder)
    meta, cols = index.meta, index.samples.columns
    rows = np.unique(rows)
    for s in np.unique(cols["shard"][rows]).tolist():
        name = index.shards[s]["name"]
        w = ShardWriter(str(folder / name), digest=False)
        for r in rows[cols["shard"][rows] == s].tolist():
            data = pool[int(cols["label"][r]) * 2 + int(cols["key"][r][5:]) % 2]
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


def _rows_searched(v1: Path, pool: list[bytes]) -> np.ndarray:
    """The rows of v1 whose pixels ``--dups`` reads: those whose looks its near-duplicate search asks for (the
    random hashes pair a few by chance), found by the same search given each row's pool photo's looks."""
    from wds_tools.format.phash import colour_layout
    from wds_tools.similar.match import looks
    from wds_tools.similar.near import DEFAULT_THRESHOLD, near_clusters

    cols = read_sample_table(*open_index(v1), ("key", "label", "phash"))
    skip = len(npy_header((SIZE, SIZE, 3)))
    images = np.stack([np.frombuffer(p[skip:], np.uint8).reshape(SIZE, SIZE, 3) for p in pool])
    layouts, views = colour_layout(images), looks(images)
    photo = cols["label"].astype(np.int64) * 2 + np.array([int(k[5:]) % 2 for k in cols["key"].tolist()])
    asked: list[np.ndarray] = []

    def looks_of(side: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        asked.append(np.asarray(rows, np.int64))
        return layouts[photo[rows]], views[photo[rows]]

    near_clusters(cols["phash"], DEFAULT_THRESHOLD, looks=looks_of)
    return np.concatenate(asked) if asked else np.zeros(0, np.int64)


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
    ap.add_argument("--shards", type=int, default=SHARDS, help="shards of each version (about; default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each command (medians printed)")
    ap.add_argument("--dups", action="store_true", help="also time the report with --dups")
    ap.add_argument("--keep", metavar="DIR", help="build the set in DIR and keep it (default: a temporary folder)")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        t = time.perf_counter()
        v0, v1, pool = build(tmp, args.samples, args.shards)
        rows0, rows1 = _rows_read(v0, v1)
        if args.dups:  # random hashes pair a few samples by chance: the search reads their pixels for their colour
            rows1 = np.concatenate([rows1, _rows_searched(v1, pool)]).astype(np.int64)
        write_pixels(v0, rows0, pool)
        write_pixels(v1, rows1, pool)
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
