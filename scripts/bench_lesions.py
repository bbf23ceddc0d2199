"""Benchmark near-duplicates on skin lesion photos (issue 37): false pairs among distinct photos, planted edits
found, and the cost on smooth sets.

Families (``wds_tools.synth.skin_lesion_photo``: 600x450 photos made here, all different; photo k of a family is
``skin_lesion_photo(family, seed * 1,000,000 + k)``): smooth (skin tone with low-frequency shading, one darker
lesion of overlapping ellipses or an irregular blob, blurred), textured (skin furrows and grain, a pigment network),
dermoscopic (textured, in a dermatoscope's round field; hairs on half), hairs (smooth, 4-30 hairs), grey (smooth, in
grey). Each photo is a JPEG (quality 85-95), stored as ``convert`` stores it at ``--size`` (a centre square, 224 px).

Planted edits, of the first ``--edited`` photos of each family, each stored the same way: an exact copy (the same
JPEG), a centre crop to 90% of each side, a recompression at JPEG quality 30, brightness times 0.85-1.15, gamma
0.85-1.15, half size, and a shift by 4% of the stored square's side (18 px of 450) along one axis, the uncovered
strip filled with the edge's pixels.

For each family, ``similar.near.near_clusters`` (what ``dups`` runs: candidates by the hashes, each checked on its
looks, ``similar.match``) over the photos and the edits, at the default threshold: clusters holding more than one
distinct photo, the pairs of distinct photos in one cluster (false pairs), the edits found (in their photo's
cluster) by kind, the candidate pairs checked and the time (the looks are computed first, timed apart: ``dups``
reads them from the stored pixels of the candidates only).

With ``--quality-seeds``: scripts/bench_dups.py's quality set (copies drawn with those seeds) through the same
search: recall and precision over all pairs of files (a pair found when both are in one cluster).

With ``--scale N``: time and peak memory of the search on the first N/10, N/4, N/2 and N photos
(``--scale-divisors``) of each of ``--scale-families`` (the families' photos drawn at ``--scale-size``, 300x225 by default, to
make them in reasonable time; each a JPEG stored at 224 px; only their hashes, colour layouts and looks kept), so
that a smooth set's cost can be set beside a textured one's, and its growth with N seen.

With ``--dedup-cost N``: what ``convert --dedup`` adds to the decode it rides on (``dedup_cost``).

    python scripts/bench_lesions.py --count 5000 --edited 200 --quality-seeds 0,1
    python scripts/bench_lesions.py --count 0 --scale 100000 --scale-families smooth,textured
    python scripts/bench_lesions.py --count 0 --dedup-cost 300
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import tracemalloc
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from wds_tools.convert.decode import decode_image  # noqa: E402
from wds_tools.format.phash import colour_layout, is_flat, phash_batch  # noqa: E402
from wds_tools.similar.match import looks  # noqa: E402
from wds_tools.similar.near import DEFAULT_THRESHOLD, NEAREST, near_clusters  # noqa: E402
from wds_tools.synth import SKIN_FAMILIES, jpeg_bytes, skin_lesion_photo  # noqa: E402

EDITS = ("copy", "crop90", "jpeg30", "brightness", "gamma", "half", "shift4")


def edited(im: Image.Image, kind: str, rng: np.random.Generator) -> Image.Image:
    """One planted edit of a decoded source photo."""
    w, h = im.size
    if kind == "crop90":
        dx, dy = round(w * 0.05), round(h * 0.05)
        return im.crop((dx, dy, w - dx, h - dy))
    if kind == "brightness":
        return ImageEnhance.Brightness(im).enhance(float(rng.uniform(0.85, 1.15)))
    if kind == "gamma":
        g = float(rng.uniform(0.85, 1.15))
        return im.point([round(255 * (v / 255) ** g) for v in range(256)] * 3)
    if kind == "half":
        return im.resize((w // 2, h // 2), Image.Resampling.BICUBIC)
    if kind == "shift4":
        s = round(0.04 * min(w, h))  # 4% of the stored square's side
        dx, dy = (int(rng.choice([-s, s])), 0) if rng.integers(2) else (0, int(rng.choice([-s, s])))
        a = np.pad(np.asarray(im), ((abs(dy), abs(dy)), (abs(dx), abs(dx)), (0, 0)), mode="edge")
        return Image.fromarray(a[abs(dy) + dy : abs(dy) + dy + h, abs(dx) + dx : abs(dx) + dx + w])
    raise ValueError(kind)


def _one(job: tuple[str, int, bool, tuple[int, int], int]) -> np.ndarray:
    """The stored pixels of one photo, and of its edits when asked: uint8 [1 or 1 + len(EDITS), S, S, 3]."""
    family, k, edits, (w, h), size = job
    data = jpeg_bytes(skin_lesion_photo(family, k, w, h), 85 + k % 11)
    out = [decode_image(data, size).pixels]
    if edits:
        rng = np.random.default_rng([k, 5])
        src = Image.open(io.BytesIO(data)).convert("RGB")
        for kind in EDITS:
            if kind == "copy":
                again = data
            elif kind == "jpeg30":
                again = jpeg_bytes(src, 30)
            else:
                again = jpeg_bytes(edited(src, kind, rng), 90)
            out.append(decode_image(again, size).pixels)
    return np.stack(out)


def family_set(
    family: str, count: int, n_edited: int, args: argparse.Namespace, dims: tuple[int, int] = (600, 450)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stored pixels, photo id, edit kind: -1 for the photo itself, else an index into EDITS) of ``count`` photos
    and the edits of the first ``n_edited``; made on ``--workers`` processes, kept in ``--cache`` if given."""
    first = args.seed * 1_000_000
    name = f"{family}-{args.seed}-{count}-{n_edited}-{dims[0]}x{dims[1]}-{args.size}.npz"
    if args.cache and (Path(args.cache) / name).exists():
        with np.load(Path(args.cache) / name) as z:
            return z["pixels"], z["ids"], z["kinds"]
    jobs = [(family, first + k, k < n_edited, dims, args.size) for k in range(count)]
    with Pool(args.workers) as pool:
        made = pool.map(_one, jobs, chunksize=32)
    pixels = np.concatenate(made)
    ids = np.concatenate([np.full(len(m), k) for k, m in enumerate(made)])
    kinds = np.concatenate([np.arange(-1, len(m) - 1) for m in made])
    if args.cache:
        Path(args.cache).mkdir(parents=True, exist_ok=True)
        np.savez(Path(args.cache) / name, pixels=pixels, ids=ids, kinds=kinds)
    return pixels, ids, kinds


def _compact(job: tuple[str, int, bool, tuple[int, int], int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One photo's hashes, colour layout and look (what the search needs), not its pixels."""
    px = _one(job)
    return phash_batch(px), colour_layout(px), looks(px)


def compact_set(family: str, count: int, args: argparse.Namespace, dims: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """(hashes, layouts, looks) of ``count`` photos, made on ``--workers`` processes: about 1.1 kB a photo kept
    (their pixels, 150 kB each, are not), in ``--cache`` if given."""
    first = args.seed * 1_000_000
    name = f"{family}-{args.seed}-{count}-compact-{dims[0]}x{dims[1]}-{args.size}.npz"
    if args.cache and (Path(args.cache) / name).exists():
        with np.load(Path(args.cache) / name) as z:
            return z["hashes"], z["layouts"], z["looks"]
    jobs = [(family, first + k, False, dims, args.size) for k in range(count)]
    parts = []
    with Pool(args.workers) as pool:
        parts = list(pool.imap(_compact, jobs, chunksize=64))
    hashes, layouts, lk = (np.concatenate(x) for x in zip(*parts))
    if args.cache:
        Path(args.cache).mkdir(parents=True, exist_ok=True)
        np.savez(Path(args.cache) / name, hashes=hashes, layouts=layouts, looks=lk)
    return hashes, layouts, lk


def search(pixels: np.ndarray, nearest: int) -> tuple[object, dict]:
    """near_clusters over stored pixels as dups runs it (the looks asked for, from arrays made here): the answer,
    and the times (hashes and looks of all, then the search and checks) and the samples asked for."""
    t0 = time.perf_counter()
    hashes = phash_batch(pixels)
    t1 = time.perf_counter()
    lay, lk = colour_layout(pixels), looks(pixels)
    t2 = time.perf_counter()
    asked = [0]

    def looks_of(_side: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        asked[0] += len(rows)
        return lay[rows], lk[rows]

    found = near_clusters(hashes, DEFAULT_THRESHOLD, looks=looks_of, nearest=nearest)
    t3 = time.perf_counter()
    return found, {
        "hash": t1 - t0,
        "looks": t2 - t1,
        "search": t3 - t2,
        "asked": asked[0],
        "flat": int(is_flat(hashes).sum()),
    }


def families(args: argparse.Namespace) -> None:
    print(
        f"skin lesion photos, {args.count:,} per family (seed {args.seed}), edits of the first {args.edited}, "
        f"stored at {args.size} px, threshold {DEFAULT_THRESHOLD}, {args.nearest} checked per look:\n"
    )
    print(
        "| family | photos | too flat to hash | clusters | clusters of > 2 photos | false pairs | per 1,000 photos | "
        + " | ".join(EDITS)
        + " | pairs checked | passed | search s | looks s |"
    )
    print("|---|---|---|---|---|---|---|" + "---|" * len(EDITS) + "---|---|---|---|")
    for family in args.families.split(","):
        pixels, ids, kinds = family_set(family, args.count, args.edited, args)
        found, t = search(pixels, args.nearest)
        cluster_of = np.full(len(ids), -1)
        false_pairs, big = 0, 0
        for c, members in enumerate(found.clusters):
            cluster_of[members] = c
            photos = np.unique(ids[members])
            false_pairs += len(photos) * (len(photos) - 1) // 2
            big += len(photos) > 2
        originals = {int(i): int(x) for x, i in enumerate(ids.tolist()) if kinds[x] == -1}
        cells = []
        for e in range(len(EDITS)):
            sel = np.flatnonzero(kinds == e)
            mine = np.array([cluster_of[originals[int(ids[x])]] for x in sel])
            got = int(((cluster_of[sel] == mine) & (mine >= 0)).sum())
            cells.append(f"{got}/{len(sel)}")
        print(
            f"| {family} | {args.count:,} | {t['flat']:,} | {len(found.clusters):,} | {big} | {false_pairs} | "
            f"{1000 * false_pairs / max(1, args.count):.2f} | "
            + " | ".join(cells)
            + f" | {found.candidates:,} | {found.passed:,} | {t['search']:.1f} | {t['looks']:.1f} |",
            flush=True,
        )
    print()


def quality(args: argparse.Namespace) -> None:
    from bench_dups import KINDS, build_set

    print("scripts/bench_dups.py's quality set through near_clusters (a pair found when both are in one cluster):\n")
    print("| seed | images | precision | recall | false pairs | " + " | ".join(KINDS) + " | pairs checked |")
    print("|---|---|---|---|---|" + "---|" * len(KINDS) + "---|")
    for seed in (int(x) for x in args.quality_seeds.split(",")):
        pixels, ids, kinds = build_set(args.synth, args.size, seed=seed)
        found, _ = search(pixels, args.nearest)
        cluster_of = np.full(len(ids), -1)
        for c, members in enumerate(found.clusters):
            cluster_of[members] = c
        iu, ju = np.triu_indices(len(ids), 1)
        same = ids[iu] == ids[ju]
        together = (cluster_of[iu] == cluster_of[ju]) & (cluster_of[iu] >= 0)
        tp, fp = int((together & same).sum()), int((together & ~same).sum())
        kind = np.array(kinds)
        cells = []
        for k in KINDS:
            sel = same & (((kind[iu] == "original") & (kind[ju] == k)) | ((kind[ju] == "original") & (kind[iu] == k)))
            cells.append(f"{(together & sel).sum() / max(1, sel.sum()):.3f}")
        print(
            f"| {seed} | {len(ids):,} | {tp / max(1, tp + fp):.4f} | {tp / max(1, int(same.sum())):.4f} | {fp} | "
            + " | ".join(cells)
            + f" | {found.candidates:,} |",
            flush=True,
        )
    print()


def scale(args: argparse.Namespace) -> None:
    w, h = (int(x) for x in args.scale_size.split("x"))
    print(
        f"cost on {args.scale:,} photos per family ({w}x{h} JPEGs stored at {args.size} px), threshold "
        f"{DEFAULT_THRESHOLD}, {args.nearest} checked per look; the hashes, colour layouts and looks of all made "
        "first (dups reads the candidates' pixels from the shards and makes theirs: not timed here):\n"
    )
    print(
        "| family | photos | clusters | pairs checked | passed | search + checks s | peak MiB (search) | "
        "looks asked | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for family in args.scale_families.split(","):
        all_hashes, all_lay, all_lk = compact_set(family, args.scale, args, (w, h))
        fractions = [int(x) for x in args.scale_divisors.split(",")]
        for n in sorted({max(1, args.scale // d) for d in fractions}):  # the first n photos: growth with N
            hashes, lay, lk = all_hashes[:n], all_lay[:n], all_lk[:n]
            asked = [0]

            def looks_of(_side: int, rows: np.ndarray, lay=lay, lk=lk, asked=asked) -> tuple[np.ndarray, np.ndarray]:
                asked[0] += len(rows)
                return lay[rows], lk[rows]

            load = os.getloadavg()[0]
            tracemalloc.start()
            t0, c0 = time.perf_counter(), time.process_time()
            found = near_clusters(hashes, DEFAULT_THRESHOLD, looks=looks_of, nearest=args.nearest)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            print(
                f"| {family} | {n:,} | {len(found.clusters):,} | {found.candidates:,} | {found.passed:,} | "
                f"{wall:.1f} (CPU {cpu:.1f}) | {peak:.0f} | {asked[0]:,} | {load:.1f} |",
                flush=True,
            )
    print("(peak MiB: tracemalloc's peak of the search's own allocations; the looks, 1 kB a photo, were made before)\n")


def dedup_cost(args: argparse.Namespace) -> None:
    """``--dedup-cost N``: what ``convert --dedup`` adds to the decode it rides on. Its pass decodes every source
    once more and keeps the hash, colour layout and look of each (``convert.dedup.near_rows``): per image, the
    converter's decode (``decode_image`` of a 600x450 JPEG at ``--size``) against ``phash``, ``colour_layout`` and
    ``looks`` of its pixels, interleaved, medians of 3 rounds; then whole one-worker conversions of the N photos
    (smooth lesion photos, 10% of them planted copies) with and without ``--dedup``, 3 each, alternating."""
    import csv
    import statistics
    import tempfile

    from wds_tools.convert import convert
    from wds_tools.format.phash import phash

    n = args.dedup_cost
    files = [jpeg_bytes(skin_lesion_photo("smooth", 2_000_000 + k), 90) for k in range(n)]
    times: dict[str, list[float]] = {"decode_image": [], "phash": [], "colour_layout": [], "looks": []}
    for _ in range(3):
        for data in files:
            t0 = time.perf_counter()
            px = decode_image(data, args.size).pixels
            t1 = time.perf_counter()
            phash(px)
            t2 = time.perf_counter()
            colour_layout([px])
            t3 = time.perf_counter()
            looks([px])
            t4 = time.perf_counter()
            for name, t in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times[name].append(t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    added = med["phash"] + med["colour_layout"] + med["looks"]
    print(f"convert --dedup's pass, per 600x450 JPEG at {args.size} px (medians of {3 * n:,}, interleaved):\n")
    print("| step | ms per image | share of the decode |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {v / med['decode_image']:.1%} |")
    print(f"| phash + colour_layout + looks | {added:.3f} | {added / med['decode_image']:.1%} |\n")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "img").mkdir()
        with open(root / "m.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["key", "path", "label"])
            for k, data in enumerate(files):
                (root / "img" / f"{k}.jpg").write_bytes(data)
                w.writerow([f"s{k:05d}", f"img/{k}.jpg", "ab"[k % 2]])
            for k in range(0, n, 10):  # planted copies: the same file under another key
                w.writerow([f"c{k:05d}", f"img/{k}.jpg", "ab"[k % 2]])
        walls: dict[bool, list[float]] = {False: [], True: []}
        for r in range(3):
            for dedup in (False, True):
                t0 = time.perf_counter()
                convert(
                    root / "m.csv",
                    version="v1",
                    size=args.size,
                    out=root / f"out{r}{int(dedup)}",  # a folder each: no earlier version to keep splits of
                    workers=1,
                    progress=False,
                    dedup=dedup,
                )
                walls[dedup].append(time.perf_counter() - t0)
    plain, with_dedup = statistics.median(walls[False]), statistics.median(walls[True])
    rows = n + len(range(0, n, 10))
    print(
        f"one-worker convert of {rows:,} rows ({n:,} files): {plain:.1f} s without --dedup, {with_dedup:.1f} s with "
        f"({with_dedup / plain:.2f}x; medians of 3; load {os.getloadavg()[0]:.1f})\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=5000, help="photos per family (0: skip the families)")
    p.add_argument("--edited", type=int, default=200, help="photos with planted edits, per family")
    p.add_argument("--families", default=",".join(SKIN_FAMILIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--nearest", type=int, default=NEAREST)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes making the photos")
    p.add_argument("--cache", help="keep the stored pixels of each set here (.npz) and read them again")
    p.add_argument("--quality-seeds", default="", help="scripts/bench_dups.py's quality set, e.g. 0,1")
    p.add_argument("--synth", type=int, default=150, help="lesion photos among the quality set's originals")
    p.add_argument("--scale", type=int, default=0, help="photos per family for the cost run (0: skip)")
    p.add_argument("--scale-families", default="smooth,textured")
    p.add_argument("--scale-size", default="300x225", help="the cost run's photos' size, WxH")
    p.add_argument(
        "--scale-divisors", default="10,4,2,1", help="the cost run times the first N/d photos for each d (1: N alone)"
    )
    p.add_argument("--dedup-cost", type=int, default=0, help="photos for convert --dedup's cost (0: skip)")
    args = p.parse_args()
    if args.count:
        families(args)
    if args.quality_seeds:
        quality(args)
    if args.scale:
        scale(args)
    if args.dedup_cost:
        dedup_cost(args)


if __name__ == "__main__":
    main()
