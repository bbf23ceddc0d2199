"""Benchmark the converter on 12 MP JPEGs and print a Markdown table with PASS/FAIL.

What is measured, in one run:

1. Corpus: ``--count`` distinct photo-like 4032x3024 JPEGs (quality 92, one seed each) under
   ``--data`` plus ``manifest.csv`` (key,path,label). Files already there are reused.
2. Per-image decode cost, median ms over all files (file bytes in the page cache; a warm-up
   pass comes first):
     naive      ``Image.open(p).convert("RGB").resize((S, S))``  (full 12 MP decode)
     converter  ``wds_tools.convert.decode.decode_file(p, S, "center-crop")``  (JPEG draft mode)
   The two are interleaved per file, alternating which goes first. Target: converter/naive <= 0.3.
3. End-to-end ``wds_tools.convert.convert`` with workers=1 and workers=os.cpu_count(), into a
   fresh temporary folder each time; configurations alternate and each runs ``--repeats``
   times; medians are reported. Rates:
     phase      ``ConvertResult.images_per_second`` (decode+write phase only)
     result     samples / ``ConvertResult.seconds`` (scan, plan, write, index; no pool shutdown)
     call       samples / wall time of the whole ``convert()`` call (incl. pool start and shutdown)
   Scaling = rate(all workers) / (cores x rate(1 worker)). Target (phase rate): >= 0.85.
   The end-to-end scalings are shown for information. Each run also records its own CPU
   time (main process + reaped workers) and the CPU other processes used meanwhile
   (/proc/stat busy, steal included, minus our own), since a busy neighbour skews scaling.

4. Issue 12, the first ``--few`` photos (default 60) at the default shard size (here one train
   and one val shard): the whole ``convert()`` call with workers=1 and workers=cores, alternating,
   ``--repeats`` times; target: rate(cores) >= 0.9 x cores x rate(1) (1.8x on 2 cores).
5. Issue 12, several sizes: ``convert(size="224,384")`` against two separate runs (224, then
   384), all with workers=cores, alternating, ``--repeats`` times; target: multi-size time <=
   0.6 x the sum of the separate runs. The same for 384,512 (for information: both draft to
   the same JPEG scale on these photos, so one decode serves both). Each multi-size folder must be byte-identical to its
   separate run. Beside it, per image on one core (median over the few photos): decode_image at
   each size; decode_sizes (what the converter does: one decode per JPEG draft scale, exact);
   and, for information only, "one decode at the largest size's draft scale, every size resized
   from it" (not what the converter does: its smaller sizes differ from a separate run; the
   difference is printed).

Exit status is 0 unless ``--check`` is given and a target is missed.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

from wds_tools.convert import convert
from wds_tools.convert.decode import decode_file, decode_image, decode_sizes
from wds_tools.format.cpus import usable_cpus
from wds_tools.synth import jpeg_bytes, photo_like

WIDTH, HEIGHT, QUALITY = 4032, 3024, 92
CLASSES = ("a", "b", "c")
DECODE_RATIO_TARGET = 0.3
SCALING_TARGET = 0.85
FEW_SCALING_TARGET = 0.9  # x cores: 1.8x on 2 cores (issue 12)
MULTI_SIZES = (224, 384)
MULTI_TARGET = 0.6  # multi-size time / sum of separate runs (issue 12)
SHARED_SIZES = (384, 512)  # on 12 MP photos both draft to 1/4: one decode serves both
REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cores (os.cpu_count)": str(os.cpu_count()),
        "cores usable (affinity)": str(usable_cpus()),
        "CPU": cpu,
        "Python": platform.python_version(),
        "Pillow": PIL.__version__,
        "platform": platform.platform(),
    }


def _make_jpeg(i: int, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(jpeg_bytes(photo_like(WIDTH, HEIGHT, seed=1000 + i), quality=QUALITY))
    tmp.replace(path)


def ensure_corpus(data: Path, count: int) -> tuple[Path, list[Path]]:
    """Write missing JPEGs (seed = index, so every file differs, on all cores) and the manifest."""
    img_dir = data / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    rows, paths = [], []
    t0 = time.perf_counter()
    for i in range(count):
        rel = f"images/img_{i:05d}.jpg"
        rows.append((f"img_{i:05d}", rel, CLASSES[i % len(CLASSES)]))
        paths.append(data / rel)
    missing = [(i, p) for i, p in enumerate(paths) if not _is_valid(p)]
    if missing:
        with ProcessPoolExecutor() as pool:
            list(pool.map(_make_jpeg, *zip(*missing)))
    manifest = data / "manifest.csv"
    with open(manifest, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label"])
        w.writerows(rows)
    print(
        f"corpus: {count} JPEGs in {data} ({len(missing)} generated, {count - len(missing)} reused, "
        f"{time.perf_counter() - t0:.1f} s)",
        flush=True,
    )
    return manifest, paths


def _is_valid(path: Path) -> bool:
    try:
        with Image.open(path) as im:
            return im.format == "JPEG" and im.size == (WIDTH, HEIGHT)
    except Exception:
        return False


def bench_decode(paths: list[Path], size: int) -> tuple[float, float]:
    """Median ms per image of (naive, converter), interleaved per file."""

    def naive(p: Path) -> None:
        Image.open(p).convert("RGB").resize((size, size))

    def converter(p: Path) -> None:
        decode_file(str(p), size, "center-crop")

    def timed(fn, p: Path) -> float:
        t = time.perf_counter()
        fn(p)
        return (time.perf_counter() - t) * 1000

    for p in paths:  # warm-up: page cache, lazy imports, allocator
        p.read_bytes()
    naive(paths[0])
    converter(paths[0])
    t_naive, t_conv = [], []
    for i, p in enumerate(paths):
        if i % 2 == 0:
            t_naive.append(timed(naive, p))
            t_conv.append(timed(converter, p))
        else:
            t_conv.append(timed(converter, p))
            t_naive.append(timed(naive, p))
    return statistics.median(t_naive), statistics.median(t_conv)


def _busy_seconds() -> float | None:
    """CPU seconds all processes (and the hypervisor, as steal) used so far, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()  # children count once reaped: the pool's workers are joined by convert()
    return t.user + t.system + t.children_user + t.children_system


def run_convert(
    manifest: Path, size, workers: int, shard_size: int | None, keep: Path | None = None
) -> dict[str, float]:
    """One conversion into a fresh folder (``keep``: into that folder, left in place)."""
    out = str(keep) if keep is not None else tempfile.mkdtemp(prefix="bench-convert-")
    try:
        busy0, own0, t = _busy_seconds(), _own_seconds(), time.perf_counter()
        res = convert(
            manifest, version="bench", size=size, out=out, workers=workers, shard_size=shard_size, progress=False
        )
        call = time.perf_counter() - t
        busy1, own = _busy_seconds(), _own_seconds() - own0
    finally:
        if keep is None:
            shutil.rmtree(out, ignore_errors=True)
    res = getattr(res, "results", [res])[0]  # several sizes: the first (largest) one's counts
    others = max(0.0, (busy1 - busy0 - own) / call) if busy0 is not None else float("nan")
    return {
        "phase": res.images_per_second,
        "result": res.samples_written / res.seconds,
        "call": res.samples_written / call,
        "seconds": call,
        "shards": res.shards,
        "decoded": res.decoded,
        "cpu_per_img_ms": 1000 * own / res.samples_written,
        "others": others,
    }


def bench_convert(
    manifest: Path, size: int, worker_counts: list[int], shard_size: int, repeats: int
) -> dict[int, dict[str, float]]:
    """Median rates per worker count; configurations alternate within each repeat."""
    runs: dict[int, list[dict]] = {w: [] for w in worker_counts}
    for r in range(repeats):
        for w in worker_counts if r % 2 == 0 else worker_counts[::-1]:
            m = run_convert(manifest, size, w, shard_size)
            runs[w].append(m)
            print(
                f"  repeat {r + 1}/{repeats} workers={w}: phase {m['phase']:.1f} img/s, "
                f"result {m['result']:.1f} img/s, call {m['call']:.1f} img/s, "
                f"{m['shards']} shards, own CPU {m['cpu_per_img_ms']:.1f} ms/img, "
                f"other processes {m['others']:.2f} cores",
                flush=True,
            )
    return {w: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for w, ms in runs.items()}


def subset_manifest(data: Path, count: int) -> Path:
    """A manifest of the first ``count`` photos of the corpus (written by ensure_corpus)."""
    rows = [(f"img_{i:05d}", f"images/img_{i:05d}.jpg", CLASSES[i % len(CLASSES)]) for i in range(count)]
    path = data / f"manifest-{count}.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label"])
        w.writerows(rows)
    return path


def bench_few(manifest: Path, size: int, cores: int, repeats: int) -> dict[int, dict[str, float]]:
    """The few photos at the default shard size, workers 1 and ``cores``, alternating; medians."""
    runs: dict[int, list[dict]] = {1: [], cores: []}
    for r in range(repeats):
        for w in (1, cores) if r % 2 == 0 else (cores, 1):
            m = run_convert(manifest, size, w, None)
            runs[w].append(m)
            print(
                f"  repeat {r + 1}/{repeats} workers={w}: {m['seconds']:.2f} s, call {m['call']:.1f} img/s, "
                f"{m['shards']} shards, other processes {m['others']:.2f} cores",
                flush=True,
            )
    return {w: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for w, ms in runs.items()}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def bench_multi(manifest: Path, workers: int, repeats: int, sizes: tuple[int, ...] = MULTI_SIZES) -> dict[str, float]:
    """Median seconds of separate runs per size and of one multi-size run; checks byte identity."""
    label = ",".join(map(str, sizes))
    runs: dict[str, list[float]] = {str(s): [] for s in sizes} | {label: [], "others": []}
    identical = True
    for r in range(repeats):
        order = [label, *map(str, sizes)]
        for what in order if r % 2 == 0 else order[::-1]:
            keep = Path(tempfile.mkdtemp(prefix="bench-multi-")) if r == 0 else None
            m = run_convert(manifest, what, workers, None, keep=keep)
            runs[what].append(m["seconds"])
            runs["others"].append(m["others"])
            print(
                f"  repeat {r + 1}/{repeats} --size {what}: {m['seconds']:.2f} s, "
                f"other processes {m['others']:.2f} cores",
                flush=True,
            )
            if keep is not None:
                runs.setdefault("_dirs", []).append((what, keep))
    dirs = dict(runs.pop("_dirs"))
    for s in sizes:
        same = _files(dirs[label] / "bench" / str(s)) == _files(dirs[str(s)] / "bench" / str(s))
        identical = identical and same
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["identical"] = identical
    return out


def _one_decode_for_all(data: bytes, sizes: tuple[int, ...]) -> dict[int, np.ndarray]:
    """Option B (not the converter's): decode once at the largest size's draft, resize every size from it."""
    from wds_tools.convert import decode as d

    settings = d.DecodeSettings()
    im, orientation, w, h = d._open_checked(data, settings)
    big = max(sizes)
    sx, sy = d._resize_scale(w, h, big, "center-crop")
    need = (max(1, int(np.ceil(w * sx))), max(1, int(np.ceil(h * sy))))
    swap = orientation in d._TRANSPOSED_ORIENTATIONS
    im.draft(im.mode, (need[1], need[0]) if swap else need)
    im.load()
    if orientation != 1:
        im = d.ImageOps.exif_transpose(im)
    im = d._to_rgb(im, settings)
    return {s: d._resize(im, s, "center-crop", settings) for s in sizes}


def bench_multi_decode(paths: list[Path]) -> dict[str, float]:
    """Per image, one core, median ms: each size alone, decode_sizes (exact), option B; B's pixel error."""
    times: dict[str, list[float]] = {str(s): [] for s in MULTI_SIZES + SHARED_SIZES} | {
        "exact": [],
        "one_decode": [],
        "shared": [],
    }
    diffs, differing, decodes = [], [], []
    for p in paths:
        data = p.read_bytes()
        for s in sorted(set(MULTI_SIZES + SHARED_SIZES)):
            t = time.perf_counter()
            decode_image(data, s)
            times[str(s)].append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        decode_sizes(data, SHARED_SIZES)
        times["shared"].append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        got, n = decode_sizes(data, MULTI_SIZES)
        times["exact"].append(1000 * (time.perf_counter() - t))
        decodes.append(n)
        t = time.perf_counter()
        shared = _one_decode_for_all(data, MULTI_SIZES)
        times["one_decode"].append(1000 * (time.perf_counter() - t))
        for s in MULTI_SIZES:
            ref = decode_image(data, s).pixels
            if not np.array_equal(got[s].pixels, ref):
                raise SystemExit(f"decode_sizes differs from decode_image at {s} for {p}")
            delta = np.abs(shared[s].astype(np.int16) - ref.astype(np.int16))
            diffs.append(int(delta.max()))
            differing.append(float((delta > 0).mean()))
    out = {k: statistics.median(v) for k, v in times.items()}
    out.update(max_diff=max(diffs), differing=max(differing), decodes=statistics.median(decodes))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=96, help="number of 12 MP JPEGs (default 96)")
    ap.add_argument(
        "--data", default=str(REPO / "bench-data" / "convert"), help="corpus folder (default <repo>/bench-data/convert)"
    )
    ap.add_argument("--size", type=int, default=224, help="output side in pixels (default 224)")
    ap.add_argument("--repeats", type=int, default=3, help="convert runs per configuration (default 3)")
    ap.add_argument(
        "--few", type=int, default=60, help="photos of the default-shard-size and multi-size runs (default 60)"
    )
    ap.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument(
        "--skip-small-shards",
        action="store_true",
        help="skip part 3 (scaling with small shards), e.g. to rerun issue 12's parts alone",
    )
    args = ap.parse_args()

    cores = os.cpu_count() or 1
    info = machine()
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    manifest, paths = ensure_corpus(Path(args.data), max(args.count, args.few))
    if args.few > args.count:
        manifest, paths = subset_manifest(Path(args.data), args.count), paths[: args.count]

    # issue 12's end-to-end figures first: on a shared machine they get the quietest minutes
    few_manifest = subset_manifest(Path(args.data), args.few)
    print(f"issue 12: {args.few} photos, default shard size, workers 1 and {cores} ...", flush=True)
    few = bench_few(few_manifest, args.size, cores, args.repeats)
    print(f"issue 12: --size {','.join(map(str, MULTI_SIZES))} vs separate runs, workers {cores} ...", flush=True)
    multi = bench_multi(few_manifest, cores, args.repeats)
    print(f"  and --size {','.join(map(str, SHARED_SIZES))} (one decode serves both) ...", flush=True)
    shared = bench_multi(few_manifest, cores, args.repeats, SHARED_SIZES)
    print("decode: naive vs converter, interleaved ...", flush=True)
    naive_ms, conv_ms = bench_decode(paths, args.size)
    ratio = conv_ms / naive_ms

    shard_size = max(1, args.count // (4 * cores))
    worker_counts = sorted({1, cores})
    if args.skip_small_shards:
        rates, scaling = {}, {}
    else:
        print(f"convert: workers {worker_counts}, shard_size {shard_size}, {args.repeats} repeats ...", flush=True)
        rates = bench_convert(manifest, args.size, worker_counts, shard_size, args.repeats)
        one, full = rates[1], rates[cores]
        scaling = {k: full[k] / (cores * one[k]) for k in ("phase", "result", "call")} if cores > 1 else {}

    print("issue 12: per-image decode for several sizes ...", flush=True)
    mdec = bench_multi_decode(paths[: args.few])

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    rows = [
        ("naive decode+resize (median)", f"{naive_ms:.1f} ms/img", "", ""),
        ("converter decode_file (median)", f"{conv_ms:.1f} ms/img", "", ""),
        ("converter / naive", f"{ratio:.3f}", f"<= {DECODE_RATIO_TARGET}", verdict(ratio <= DECODE_RATIO_TARGET)),
    ]
    for w in worker_counts if rates else ():
        r = rates[w]
        rows += [
            (f"convert workers={w}: decode+write phase", f"{r['phase']:.1f} img/s", "", ""),
            (f"convert workers={w}: end-to-end (ConvertResult.seconds)", f"{r['result']:.1f} img/s", "", ""),
            (f"convert workers={w}: whole convert() call", f"{r['call']:.1f} img/s", "", ""),
            (f"convert workers={w}: own CPU (main + workers)", f"{r['cpu_per_img_ms']:.1f} ms/img", "", ""),
            (
                f"convert workers={w}: CPU used by other processes",
                f"{r['others']:.2f} cores",
                "~0 for a valid run",
                "NOISY" if r["others"] >= 0.2 else "",
            ),
        ]
    ok = ratio <= DECODE_RATIO_TARGET
    if scaling:
        ok = ok and scaling["phase"] >= SCALING_TARGET
        rows += [
            (
                f"scaling {cores} workers, decode+write phase",
                f"{scaling['phase']:.3f}",
                f">= {SCALING_TARGET}",
                verdict(scaling["phase"] >= SCALING_TARGET),
            ),
            (
                f"scaling {cores} workers, end-to-end (ConvertResult.seconds)",
                f"{scaling['result']:.3f}",
                f"(>= {SCALING_TARGET})",
                "info",
            ),
            (
                f"scaling {cores} workers, whole convert() call",
                f"{scaling['call']:.3f}",
                f"(>= {SCALING_TARGET})",
                "info",
            ),
        ]
    elif not args.skip_small_shards:
        rows.append(("scaling", "n/a (1 core)", f">= {SCALING_TARGET}", "skipped"))

    label = ",".join(map(str, MULTI_SIZES))
    few_ratio = few[cores]["call"] / few[1]["call"]
    few_target = FEW_SCALING_TARGET * cores
    sep = sum(multi[str(s)] for s in MULTI_SIZES)
    multi_ratio = multi[label] / sep
    ok = ok and (cores == 1 or few_ratio >= few_target) and multi_ratio <= MULTI_TARGET and multi["identical"]
    rows += [
        (
            f"{args.few} photos, default shards ({int(few[1]['shards'])}): workers=1, whole convert() call",
            f"{few[1]['call']:.1f} img/s ({few[1]['seconds']:.2f} s)",
            "",
            "",
        ),
        (
            f"{args.few} photos, default shards: workers={cores}, whole convert() call",
            f"{few[cores]['call']:.1f} img/s ({few[cores]['seconds']:.2f} s)",
            "",
            "",
        ),
        (
            f"{args.few} photos: workers={cores} / workers=1, end-to-end rate",
            f"{few_ratio:.2f}x",
            f">= {few_target:.1f}x",
            verdict(few_ratio >= few_target) if cores > 1 else "skipped",
        ),
        (
            f"{args.few} photos: the same on ConvertResult.seconds",
            f"{few[cores]['result'] / few[1]['result']:.2f}x",
            "",
            "info",
        ),
    ]
    rows += [(f"--size {s} alone, workers={cores}", f"{multi[str(s)]:.2f} s", "", "") for s in MULTI_SIZES]
    rows += [
        (f"--size {label}, workers={cores}", f"{multi[label]:.2f} s", "", ""),
        (
            f"--size {label} / separate runs",
            f"{multi_ratio:.3f}",
            f"<= {MULTI_TARGET}",
            verdict(multi_ratio <= MULTI_TARGET),
        ),
        (
            "each multi-size folder byte-identical to its separate run",
            str(multi["identical"]),
            "True",
            verdict(multi["identical"]),
        ),
    ]
    shared_label = ",".join(map(str, SHARED_SIZES))
    shared_ratio = shared[shared_label] / sum(shared[str(s)] for s in SHARED_SIZES)
    ok = ok and shared["identical"]
    rows += [
        (f"--size {shared_label} (one decode serves both), workers={cores}", f"{shared[shared_label]:.2f} s", "", ""),
        (
            f"--size {shared_label} / separate runs ({' + '.join(f'{shared[str(s)]:.2f}' for s in SHARED_SIZES)} s)",
            f"{shared_ratio:.3f}",
            "",
            "info",
        ),
        (
            f"each --size {shared_label} folder byte-identical to its separate run",
            str(shared["identical"]),
            "True",
            verdict(shared["identical"]),
        ),
    ]
    rows += [
        (f"decode_image {s} (one core, median)", f"{mdec[str(s)]:.1f} ms/img", "", "")
        for s in sorted(set(MULTI_SIZES + SHARED_SIZES))
    ]
    rows += [
        (
            f"decode_sizes {label}: exact, one decode per JPEG draft scale (median {mdec['decodes']:.0f})",
            f"{mdec['exact']:.1f} ms/img",
            "",
            f"{mdec['exact'] / sum(mdec[str(s)] for s in MULTI_SIZES):.2f} of separate",
        ),
        (
            f"option B, not used: one decode at {max(MULTI_SIZES)}'s draft for all sizes",
            f"{mdec['one_decode']:.1f} ms/img",
            "",
            f"{mdec['one_decode'] / sum(mdec[str(s)] for s in MULTI_SIZES):.2f} of separate",
        ),
        (
            f"decode_sizes {','.join(map(str, SHARED_SIZES))}: exact, both draft to the same scale: one decode",
            f"{mdec['shared']:.1f} ms/img",
            "",
            f"{mdec['shared'] / sum(mdec[str(s)] for s in SHARED_SIZES):.2f} of separate",
        ),
        (
            "option B's pixels vs a separate run",
            f"max diff {mdec['max_diff']}, up to {100 * mdec['differing']:.0f}% of values differ",
            "identical",
            "not identical" if mdec["max_diff"] else "identical",
        ),
    ]

    print()
    print(
        f"Machine: {cores} cores ({info['cores usable (affinity)']} usable), {info['CPU']}, "
        f"Python {info['Python']}, Pillow {info['Pillow']}"
    )
    print(
        f"Corpus: {args.count} x {WIDTH}x{HEIGHT} JPEG q{QUALITY}, size {args.size}, "
        f"shard_size {shard_size} ({int(rates[1]['shards']) if rates else '-'} shards), "
        f"{args.repeats} repeats (medians)"
    )
    print()
    print("| metric | value | target | result |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print(f"overall: {'PASS' if ok else 'FAIL'}")
    if (
        any(r["others"] >= 0.2 for r in rates.values())
        or any(r["others"] >= 0.2 for r in few.values())
        or multi["others"] >= 0.2
        or shared["others"] >= 0.2
    ):
        print(
            "warning: other processes used CPU during the convert runs; the scaling figure "
            "understates the converter (rerun on an idle machine)"
        )
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
