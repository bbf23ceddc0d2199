"""Benchmark the too-flat-to-hash rule and colour agreement on pictures with little detail (issue 32,
point 4): false pairs among random low-detail pictures, before and after, and what they cost the quality
set.

Families (all pictures of a family different from one another; each a JPEG at quality 90, stored as
``convert`` stores it at ``--size``; picture k of a family is ``synth.low_detail_picture(kind, k)``
with k from ``--seed`` * 1,000,000, so another seed gives other pictures):

  grid       2x2 or 3x3 grids of random colours interpolated bilinearly or bicubically
  blobs      two to five Gaussian blobs of random colour, place and width on a random colour
  noise      random colours on a 4x4 to 8x8 grid interpolated bicubically (low-frequency noise)
  vignette   linear gradients between two random colours at random angles, vignetted
  blurred    windows (192 px, half a window apart) of the photos scikit-learn and scikit-image ship
             (colour and grey), and 150 lesion photos (``synth.lesion_photo``, 320 px), each blurred
             with a Gaussian of radius 4-12% of its side (seeded); fair negatives only: a window whose
             sharp picture is within 8 bits of another's (the retina's rim, sky) is left out
  small lesions  ``synth.lesion_photo`` at 160x120 (a 2x2 colour grid and one lesion), the photos the
             near-duplicate tests used: a skin-like family the rule is not made for, measured too
  lesions 224  ``synth.lesion_photo`` at 224x224, the same kind of picture at the stored size
  grey small lesions  the small lesions in grey (PIL's ``convert("L")``, stored as RGB): no colour to
             compare, so colour agreement leaves their pairs; the limit of the rules, measured

For each family: how many pictures are too flat to hash, how many have no colour (every value of their
colour layout within COLOUR_GREY of 0: they agree in colour with any picture), and how many pairs
``find_pairs`` finds at thresholds 5 and 8 (every pair is a false pair): with no flat rule (the flag
cleared), with the rule before (main's: fewer than FIRM_BITS firm coefficients; the bits are the same,
only the flag differs, so "before" is that rule applied to this code's hashes), after (``phash_batch``'s
flag: that rule, or fewer than DETAIL_RANK counted singular values; the hashes alone) and after, with
colour (``find_pairs(..., colours=)``: a pair kept only when the colour layouts of its stored pixels agree,
docs/FORMAT.md's Colour agreement; what ``dups`` finds). Then the quality set of scripts/bench_dups.py
(copies drawn with seed 0; recall and precision over all pairs at 5 and 8, before, after and after with
colour) unless ``--no-quality``.

With ``--colour-cost``: the CPU time of ``colour_layout`` per stored 224 px image against ``phash_batch`` on
the same ``--colour-images`` images (lesion photos as stored), one call each on the whole batch,
interleaved, medians of 5 rounds, in this process. ``dups`` pays it only for the samples the hashes put in
clusters, once per distinct ``.npy`` (and reads their pixels: not timed here).

    python scripts/bench_lowdetail.py --no-families --no-quality --colour-cost

With ``--clusters N``: the issue's own measure, the clusters (and the samples in them) among N different
pictures of each family of ``--families``, for each of ``--cluster-seeds`` (picture k from seed *
1,000,000), by the hashes alone and with colour agreement, at 5 and 8 bits:

    python scripts/bench_lowdetail.py --clusters 300 --families "lesions 224,small lesions" --no-families --no-quality

With ``--sweep``: the trade table of the second rule's settings instead, each family and the quality set
hashed once (the whole image's 7x7 block's singular values kept) and every setting applied to them:
rank R in 3..5, the share of the largest singular value in 1/128..1/32 and the least singular value
(1, 1.5, 2 grey levels), and two variants (a share of the block's Frobenius norm; the distance to the
nearest block of rank R - 1 against that norm); for each, recall at 5 bits on the quality set of each
``--quality-seeds`` seed (precision marked where below 0.99) and false pairs per family at 5 / 8 bits.

    python scripts/bench_lowdetail.py                       # 3,000 of each family, seed 1
    python scripts/bench_lowdetail.py --count 5000 --seed 2
    python scripts/bench_lowdetail.py --count 5000 --sweep --quality-seeds 0,1,2

``--sweep`` and ``--verify`` measure the hashes alone (grey), with no colour agreement.

With ``--verify`` (a measurement, no rule of the format): would a second check on each pair found at 5 bits
separate the small-lesion family's false pairs from the quality set's true pairs? For each pair, the hash
comparison that gave its distance (which sample's whole image, under which flip or turn, against which of
the other's seven windows) picks two grey pictures: that whole image, flipped or turned so, and that
window; each is area-averaged to 32x32 (Pillow's box filter), normalised to mean 0 and standard deviation
1, and the check is their Pearson correlation. Printed: its distribution for the quality set's true pairs
(``--quality-seeds``, by the copy's kind; "copies" for two copies of one original), and for the false
pairs of each family (hashable pictures only, as the format flags them).

    python scripts/bench_lowdetail.py --count 5000 --verify --quality-seeds 0,1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from wds_tools.convert.decode import decode_image  # noqa: E402
from wds_tools.format.phash import (  # noqa: E402
    COLOUR_GREY,
    DETAIL_LEVEL,
    DETAIL_RANK,
    DETAIL_SHARE,
    FIRM_BITS,
    FLAT_BIT,
    colour_layout,
    firm_bits,
    is_flat,
    phash_batch,
)
from wds_tools.similar.near import find_pairs  # noqa: E402
from wds_tools.synth import LOW_DETAIL_KINDS, jpeg_bytes, lesion_photo, low_detail_picture  # noqa: E402

THRESHOLDS = (5, 8)
FAMILIES = (*LOW_DETAIL_KINDS, "blurred", "small lesions", "lesions 224", "grey small lesions")
GREY_PHOTOS = ("camera", "moon", "coins", "clock", "cell", "hubble_deep_field")  # scikit-image's, besides bench_dups'


def stored(im: Image.Image, size: int) -> np.ndarray:
    """``im`` as a JPEG at quality 90, stored as ``convert`` stores it."""
    return decode_image(jpeg_bytes(im.convert("RGB"), 90), size).pixels


def photo_windows(window: int = 192) -> list[Image.Image]:
    """Windows half a window apart of the colour photos bench_dups uses and of scikit-image's grey photos,
    but those mostly dark (bench_dups' fairness rule)."""
    from bench_dups import DARK, MOSTLY_DARK
    from bench_dups import photo_windows as colour_windows

    out = colour_windows(window=window, most=10**6)[0]
    try:
        from skimage import data as skdata
    except ImportError:
        return out
    for name in GREY_PHOTOS:
        try:
            p = Image.fromarray(getattr(skdata, name)()).convert("RGB")
        except Exception:  # a data file that needs a download
            continue
        w, h = p.size
        for top in range(0, h - window + 1, window // 2):
            for left in range(0, w - window + 1, window // 2):
                im = p.crop((left, top, left + window, top + window))
                if (np.asarray(im.convert("L")) < DARK).mean() <= MOSTLY_DARK:
                    out.append(im)
    return out


def bare(h: np.ndarray) -> np.ndarray:
    """The hashes with the flat flag cleared: searched as they are."""
    h = h.copy()
    h[:, 0] &= ~FLAT_BIT
    return h


def blurred(args: argparse.Namespace) -> tuple[np.ndarray, int]:
    """The blurred family's stored pixels, and how many windows were left out as unfair."""
    rng = np.random.default_rng(args.seed)
    originals = photo_windows() + [lesion_photo(320, 320, i % 3, 1000 + i) for i in range(150)]
    sharp = np.stack([stored(im, args.size) for im in originals])
    i, j, _ = find_pairs(bare(phash_batch(sharp)), max(THRESHOLDS))
    unfair = set(i.tolist()) | set(j.tolist())
    keep = [im for k, im in enumerate(originals) if k not in unfair]
    radii = rng.uniform(0.04, 0.12, len(keep)).tolist()
    out = [stored(im.filter(ImageFilter.GaussianBlur(r * min(im.size))), args.size) for im, r in zip(keep, radii)]
    return np.stack(out), len(unfair)


def family(kind: str, args: argparse.Namespace) -> tuple[np.ndarray, str]:
    """(stored pixels, a note) of a family."""
    first = args.seed * 1_000_000
    if kind == "blurred":
        px, unfair = blurred(args)
        return px, f"{unfair} unfair windows left out"
    if kind == "small lesions":
        return np.stack([stored(lesion_photo(160, 120, k % 3, first + k), args.size) for k in range(args.count)]), ""
    if kind == "grey small lesions":
        pictures = (lesion_photo(160, 120, k % 3, first + k).convert("L") for k in range(args.count))
        return np.stack([stored(im, args.size) for im in pictures]), ""
    if kind == "lesions 224":
        return np.stack([stored(lesion_photo(224, 224, k % 3, first + k), args.size) for k in range(args.count)]), ""
    return np.stack([stored(low_detail_picture(kind, first + k), args.size) for k in range(args.count)]), ""


def false_pairs(args: argparse.Namespace) -> None:
    from bench_dups import colours_of

    print(
        f"random low-detail pictures at {args.size} px, seed {args.seed}: pairs found (all false) at thresholds 5 / 8\n"
    )
    print(
        "| family | pictures | too flat before | too flat after | no colour | no rule | before | after "
        "| after, with colour |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in args.families.split(","):
        t0 = time.perf_counter()
        px, note = family(kind, args)
        h = phash_batch(px)
        after = is_flat(h)
        before = firm_bits(px) < FIRM_BITS
        layouts = colour_layout(px)
        grey = int((np.abs(layouts).reshape(len(px), -1).max(axis=1) < COLOUR_GREY).sum())
        i, j, d = find_pairs(bare(h), max(THRESHOLDS))
        cells = []
        for flat in (np.zeros(len(h), bool), before, after):
            ok = ~flat[i] & ~flat[j]
            cells.append(" / ".join(f"{int((ok & (d <= t)).sum()):,}" for t in THRESHOLDS))
        _, _, dc = find_pairs(h, max(THRESHOLDS), colours=colours_of(layouts))
        cells.append(" / ".join(f"{int((dc <= t).sum()):,}" for t in THRESHOLDS))
        name = kind + (f" ({note})" if note else "")
        print(
            f"| {name} | {len(h):,} | {int(before.sum()):,} | {int(after.sum()):,} | {grey:,} | "
            + " | ".join(cells)
            + " |",
            flush=True,
        )
        print(f"<!-- {kind}: {time.perf_counter() - t0:.0f} s -->", file=sys.stderr)
    print()


def quality(args: argparse.Namespace) -> None:
    """scripts/bench_dups.py's quality set: recall and precision over all pairs at 5 and 8, before, after and
    after with colour agreement."""
    from bench_dups import build_set, colour_apart, curve, pair_distances

    pixels, ids, kinds = build_set(args.synth, args.size)
    h = phash_batch(pixels)
    after = is_flat(h)
    before = firm_bits(pixels) < FIRM_BITS
    dist = pair_distances(h, True, flat_rule=False)
    apart = colour_apart(colour_layout(pixels))
    print(f"quality set (scripts/bench_dups.py, seed 0): {len(ids):,} images of {len(set(ids.tolist()))} originals\n")
    print("| rule | too flat | threshold | recall | precision | false pairs |")
    print("|---|---|---|---|---|---|")
    for name, flat in (("before", before), ("after", after), ("after, with colour", after)):
        d = dist.copy()
        d[flat, :] = 64
        d[:, flat] = 64
        if name.endswith("colour"):
            d[apart] = 64
        for row in curve(d, ids, kinds, list(THRESHOLDS)):
            print(
                f"| {name} | {int(flat.sum())} | {row['t']} | {row['recall']:.4f} | {row['precision']:.4f} | {row['fp']} |"
            )
    originals = sorted(set(ids[after].tolist()))
    print(f"\ntoo flat after: {int(after.sum())} images, of originals {originals}\n")


def singular_values(pixels: np.ndarray) -> np.ndarray:
    """The whole image's 7x7 block (u, v >= 1) of orthonormal DCT coefficients' singular values, in grey levels,
    largest first: [N, 7] (numpy's SVD of ``whole_dct``, not the hash's Gram route)."""
    from wds_tools.format.phash import whole_dct

    return np.concatenate(
        [np.linalg.svd(whole_dct(pixels[k : k + 500])[:, 1:, 1:], compute_uv=False) for k in range(0, len(pixels), 500)]
    )


def sweep_rules() -> list[tuple[str, object]]:
    """(name, rule): a rule takes singular values [N, 7] (largest first) and says which are too flat."""

    def largest(r: int, share: float, level: float):
        return lambda sv: ((sv >= level) & (sv >= share * sv[:, :1])).sum(1) < r

    def energy(r: int, share: float, level: float = 1.0):
        return lambda sv: ((sv >= level) & (sv >= share * np.linalg.norm(sv, axis=1, keepdims=True))).sum(1) < r

    def tail(r: int, share: float, level: float = 1.0):
        return lambda sv: np.sqrt((sv[:, r - 1 :] ** 2).sum(1)) < np.maximum(level, share * np.linalg.norm(sv, axis=1))

    rules: list[tuple[str, object]] = [("none (main: firm coefficients only)", lambda sv: np.zeros(len(sv), bool))]
    for level in (1.0, 1.5, 2.0):
        for r in (3, 4, 5):
            for share in (128, 96, 64, 32):
                rules.append((f"largest: R {r}, 1/{share}, {level:g} grey", largest(r, 1 / share, level)))
    for r in (4, 5):
        for share in (128, 64, 32):
            rules.append((f"norm: R {r}, 1/{share}, 1 grey", energy(r, 1 / share)))
            rules.append((f"tail: R {r}, 1/{share}, 1 grey", tail(r, 1 / share)))
    return rules


def sweep(args: argparse.Namespace) -> None:
    """The trade table (``--sweep``)."""
    from bench_dups import build_set, curve, pair_distances

    seeds = [int(x) for x in args.quality_seeds.split(",")]
    quality = {}
    for seed in seeds:
        pixels, ids, kinds = build_set(args.synth, args.size, seed=seed)
        h = phash_batch(pixels)
        quality[seed] = (
            pair_distances(h, True, flat_rule=False),
            ids,
            kinds,
            singular_values(pixels),
            firm_bits(pixels),
        )
    fams = {}
    for kind in FAMILIES:
        px, _ = family(kind, args)
        i, j, d = find_pairs(bare(phash_batch(px)), max(THRESHOLDS))
        fams[kind] = (i, j, d, singular_values(px), firm_bits(px))
    print(
        f"second-rule settings: recall at 5 bits on the quality set (seeds {args.quality_seeds}), too flat there "
        f"(seed {seeds[0]}), false pairs at 5 / 8 bits among {args.count:,} pictures per family (seed {args.seed})\n"
    )
    print("| setting | " + " | ".join(f"recall, seed {s}" for s in seeds) + " | too flat | " + " | ".join(fams) + " |")
    print("|---|" + "---|" * (len(seeds) + 1 + len(fams)))
    for name, rule in sweep_rules():
        cells = []
        for dist, ids, kinds, sv, firm in quality.values():
            flat = rule(sv) | (firm < FIRM_BITS)
            d = dist.copy()
            d[flat, :] = 64
            d[:, flat] = 64
            row = curve(d, ids, kinds, [5])[0]
            cells.append(
                f"{row['recall']:.4f}" + ("" if row["precision"] >= 0.99 else f" (precision {row['precision']:.3f})")
            )
        _, _, _, sv, firm = quality[seeds[0]]
        cells.append(str(int((rule(sv) | (firm < FIRM_BITS)).sum())))
        for i, j, d, sv, firm in fams.values():
            flat = rule(sv) | (firm < FIRM_BITS)
            ok = ~flat[i] & ~flat[j]
            cells.append(" / ".join(f"{int((ok & (d <= t)).sum()):,}" for t in THRESHOLDS))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print()


def _grey(px: np.ndarray) -> np.ndarray:
    return px.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def _thumb(grey: np.ndarray, box: tuple[int, int, int]) -> np.ndarray:
    """A window of a grey picture area-averaged to 32x32, normalised to mean 0, standard deviation 1."""
    top, left, side = box
    im = Image.fromarray(grey[top : top + side, left : left + side].astype(np.float32), mode="F")
    t = np.asarray(im.resize((32, 32), Image.Resampling.BOX), np.float64)
    return (t - t.mean()) / max(t.std(), 1e-9)


def _turned(t: np.ndarray, variant: int) -> np.ndarray:
    """The picture whose whole-image hash is variant ``variant`` of ``variants_array`` (transposed for 4..7,
    then flipped left-right for odd, upside down for 2, 3, 6, 7)."""
    if variant >= 4:
        t = t.T
    if variant % 4 in (1, 3):
        t = t[:, ::-1]
    if variant % 4 in (2, 3):
        t = t[::-1, :]
    return t


def pair_check(pixels: np.ndarray, h: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The second check's correlation for each pair (i, j) of samples (``--verify``): float [P]."""
    from wds_tools.format.phash import popcount, variants_array, window_boxes

    boxes = window_boxes(pixels.shape[1])
    h = bare(h)
    out = np.empty(len(i))
    for n, (a, b) in enumerate(zip(i.tolist(), j.tolist())):
        best = (65, 0, 0, 0, 0)
        for x, y in ((a, b), (b, a)):
            d = popcount(variants_array(h[x, 0])[:, None] ^ h[y][None, :])  # [8 variants, 7 windows]
            v, k = np.unravel_index(int(d.argmin()), d.shape)
            best = min(best, (int(d[v, k]), x, y, int(v), int(k)))
        _, x, y, v, k = best
        gx, gy = _grey(pixels[x]), _grey(pixels[y])
        out[n] = float((_turned(_thumb(gx, boxes[0]), v) * _thumb(gy, boxes[k])).mean())
    return out


def _spread(values: np.ndarray) -> str:
    if not len(values):
        return "| 0 |" + " |" * 7
    q = np.percentile(values, [0, 1, 5, 50, 95, 99, 100])
    return f"| {len(values):,} | " + " | ".join(f"{x:.3f}" for x in q) + " |"


def verify(args: argparse.Namespace) -> None:
    """The second check's distributions (``--verify``)."""
    from bench_dups import build_set

    print("second check on pairs found at 5 bits: Pearson correlation of the matched 32x32 grey thumbnails\n")
    print("| pairs | count | min | 1% | 5% | median | 95% | 99% | max |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in (int(x) for x in args.quality_seeds.split(",")):
        pixels, ids, kinds = build_set(args.synth, args.size, seed=seed)
        h = phash_batch(pixels)
        i, j, d = find_pairs(h, 5)
        r = pair_check(pixels, h, i, j)
        k = np.array(kinds)
        same = ids[i] == ids[j]
        label = np.where(k[i] == "original", k[j], np.where(k[j] == "original", k[i], "copies"))
        for kind in (*sorted(set(label[same].tolist())),):
            print(f"| quality set seed {seed}, true: {kind} " + _spread(r[same & (label == kind)]), flush=True)
        print(f"| quality set seed {seed}, true: all " + _spread(r[same]))
        print(f"| quality set seed {seed}, false " + _spread(r[~same]), flush=True)
    for kind in FAMILIES:
        px, _ = family(kind, args)
        h = phash_batch(px)
        i, j, _ = find_pairs(h, 5)
        print(f"| {kind}, false " + _spread(pair_check(px, h, i, j)), flush=True)
    print()


def clusters(args: argparse.Namespace) -> None:
    """``--clusters N``: the issue's measure, clusters among N different pictures of a family (each of
    ``--cluster-seeds``), by the hashes alone (the components of their pairs) and as dups finds them (each
    candidate pair checked on its pixels, ``near_clusters``), at 5 and 8 bits."""
    from wds_tools.similar.match import looks
    from wds_tools.similar.near import clusters_of, near_clusters

    print(f"clusters among {args.clusters} different pictures (all false), clusters (samples) at thresholds 5 / 8\n")
    print("| family | seed | hashes alone | checked (what dups finds) |")
    print("|---|---|---|---|")
    for kind in args.families.split(","):
        for seed in [int(x) for x in args.cluster_seeds.split(",")]:
            one = argparse.Namespace(**{**vars(args), "count": args.clusters, "seed": seed})
            px, _ = family(kind, one)
            h = phash_batch(px)
            lay, lk = colour_layout(px), looks(px)
            hashed = [clusters_of(len(px), *find_pairs(h, t)[:2]) for t in THRESHOLDS]
            checked = [
                near_clusters(h, t, looks=lambda _side, r, la=lay, lo=lk: (la[r], lo[r])).clusters for t in THRESHOLDS
            ]
            cells = [" / ".join(f"{len(c)} ({sum(len(x) for x in c)})" for c in found) for found in (hashed, checked)]
            print(f"| {kind} | {seed} | " + " | ".join(cells) + " |", flush=True)
    print()


def colour_cost(args: argparse.Namespace) -> None:
    """``--colour-cost``: CPU and wall time per image of ``colour_layout`` against ``phash_batch``."""
    import os

    px = np.stack([stored(lesion_photo(224, 224, k % 3, 9_000_000 + k), 224) for k in range(args.colour_images)])
    times: dict[str, list[tuple[float, float]]] = {"phash_batch": [], "colour_layout": []}
    for _ in range(5):
        for name, fn in (("phash_batch", phash_batch), ("colour_layout", colour_layout)):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(px)
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    n = len(px)
    med = {k: (float(np.median([w for w, _ in v])), float(np.median([c for _, c in v]))) for k, v in times.items()}
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(
        f"colour cost: {n:,} stored 224 px images, one call each, interleaved, medians of 5 "
        f"(OPENBLAS_NUM_THREADS {threads}):\n"
    )
    print("| call | wall µs per image | CPU µs per image |")
    print("|---|---|---|")
    for k, (w, c) in med.items():
        print(f"| {k} | {w / n * 1e6:.1f} | {c / n * 1e6:.1f} |")
    (pw, pc), (cw, cc) = med["phash_batch"], med["colour_layout"]
    print(f"| colour_layout / phash_batch | {cw / pw:.2f} | {cc / pc:.2f} |\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=3000, help="pictures of each synthetic family")
    p.add_argument("--seed", type=int, default=1, help="which pictures: k from seed * 1,000,000; the blur radii")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--synth", type=int, default=150, help="lesion photos among the quality set's originals")
    p.add_argument("--no-quality", action="store_true")
    p.add_argument("--no-families", action="store_true")
    p.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help=f"the families to build, comma-separated (default all: {', '.join(FAMILIES)})",
    )
    p.add_argument("--sweep", action="store_true", help="the trade table of the second rule's settings (see above)")
    p.add_argument("--verify", action="store_true", help="the second check's distributions (see above)")
    p.add_argument(
        "--colour-cost", action="store_true", help="colour_layout's time per image against phash_batch's (see above)"
    )
    p.add_argument("--colour-images", type=int, default=2000, help="stored images for --colour-cost")
    p.add_argument("--clusters", type=int, default=0, help="clusters among this many pictures of each family (0: skip)")
    p.add_argument("--cluster-seeds", default="0,1,2,3", help="the seeds of --clusters, comma-separated")
    p.add_argument(
        "--quality-seeds", default="0,1,2", help="with --sweep or --verify: bench_dups' seeds of the quality set"
    )
    p.add_argument(
        "--share", type=float, help="try another DETAIL_SHARE, e.g. 0.02 (a comparison: not the format's rule)"
    )
    p.add_argument("--rank", type=int, help="try another DETAIL_RANK, e.g. 6 (a comparison: not the format's rule)")
    p.add_argument(
        "--level",
        type=float,
        help="try another DETAIL_LEVEL, e.g. 2 (grey levels; a comparison: not the format's rule)",
    )
    args = p.parse_args()
    unknown = sorted(set(args.families.split(",")) - set(FAMILIES))
    if unknown:
        p.error(f"--families: unknown {', '.join(unknown)} (one of {', '.join(FAMILIES)})")
    import wds_tools.format.phash as recipe

    for name, value in (("DETAIL_SHARE", args.share), ("DETAIL_RANK", args.rank), ("DETAIL_LEVEL", args.level)):
        if value is not None:
            setattr(recipe, name, value)
            recipe._detail_floor.cache_clear()
            kept = {"DETAIL_SHARE": DETAIL_SHARE, "DETAIL_RANK": DETAIL_RANK, "DETAIL_LEVEL": DETAIL_LEVEL}[name]
            print(f"{name} = {value} (a comparison: the format's rule has {kept})\n")
    if args.sweep or args.verify:
        if args.sweep:
            sweep(args)
        if args.verify:
            verify(args)
        return
    if args.clusters:
        clusters(args)
    if not args.no_families:
        false_pairs(args)
    if not args.no_quality:
        quality(args)
    if args.colour_cost:
        colour_cost(args)


if __name__ == "__main__":
    main()
