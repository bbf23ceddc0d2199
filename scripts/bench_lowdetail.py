"""Benchmark the too-flat-to-hash rule on pictures with little detail (issue 32, point 4): false pairs
among random low-detail pictures, before and after, and what the rule costs the quality set.

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

For each family: how many pictures are too flat to hash and how many pairs ``find_pairs`` finds at
thresholds 5 and 8 (every pair is a false pair): with no flat rule (the flag cleared), with the rule
before (main's: fewer than FIRM_BITS firm coefficients; the bits are the same, only the flag differs, so
"before" is that rule applied to this code's hashes) and after (``phash_batch``'s flag: that rule, or
fewer than DETAIL_RANK firm singular values). Then the quality set of scripts/bench_dups.py (recall and
precision over all pairs at 5 and 8, before and after) unless ``--no-quality``.

    python scripts/bench_lowdetail.py                       # 3,000 of each family, seed 1
    python scripts/bench_lowdetail.py --count 5000 --seed 2
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
from wds_tools.format.near import find_pairs  # noqa: E402
from wds_tools.format.phash import DETAIL_RANK, DETAIL_SHARE, FIRM_BITS, FLAT_BIT, firm_bits, is_flat, phash_batch  # noqa: E402
from wds_tools.synth import LOW_DETAIL_KINDS, jpeg_bytes, lesion_photo, low_detail_picture  # noqa: E402

THRESHOLDS = (5, 8)
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
    return np.stack([stored(low_detail_picture(kind, first + k), args.size) for k in range(args.count)]), ""


def false_pairs(args: argparse.Namespace) -> None:
    print(
        f"random low-detail pictures at {args.size} px, seed {args.seed}: pairs found (all false) at thresholds 5 / 8\n"
    )
    print("| family | pictures | too flat before | too flat after | no rule | before | after |")
    print("|---|---|---|---|---|---|---|")
    for kind in (*LOW_DETAIL_KINDS, "blurred", "small lesions"):
        t0 = time.perf_counter()
        px, note = family(kind, args)
        h = phash_batch(px)
        after = is_flat(h)
        before = firm_bits(px) < FIRM_BITS
        i, j, d = find_pairs(bare(h), max(THRESHOLDS))
        cells = []
        for flat in (np.zeros(len(h), bool), before, after):
            ok = ~flat[i] & ~flat[j]
            cells.append(" / ".join(f"{int((ok & (d <= t)).sum()):,}" for t in THRESHOLDS))
        name = kind + (f" ({note})" if note else "")
        print(
            f"| {name} | {len(h):,} | {int(before.sum()):,} | {int(after.sum()):,} | " + " | ".join(cells) + " |",
            flush=True,
        )
        print(f"<!-- {kind}: {time.perf_counter() - t0:.0f} s -->", file=sys.stderr)
    print()


def quality(args: argparse.Namespace) -> None:
    """scripts/bench_dups.py's quality set: recall and precision over all pairs at 5 and 8, before and after."""
    from bench_dups import build_set, curve, pair_distances

    pixels, ids, kinds = build_set(args.synth, args.size)
    h = phash_batch(pixels)
    after = is_flat(h)
    before = firm_bits(pixels) < FIRM_BITS
    dist = pair_distances(h, True, flat_rule=False)
    print(f"quality set (scripts/bench_dups.py): {len(ids):,} images of {len(set(ids.tolist()))} originals\n")
    print("| rule | too flat | threshold | recall | precision | false pairs |")
    print("|---|---|---|---|---|---|")
    for name, flat in (("before", before), ("after", after)):
        d = dist.copy()
        d[flat, :] = 64
        d[:, flat] = 64
        for row in curve(d, ids, kinds, list(THRESHOLDS)):
            print(
                f"| {name} | {int(flat.sum())} | {row['t']} | {row['recall']:.4f} | {row['precision']:.4f} | {row['fp']} |"
            )
    originals = sorted(set(ids[after].tolist()))
    print(f"\ntoo flat after: {int(after.sum())} images, of originals {originals}\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=3000, help="pictures of each synthetic family")
    p.add_argument("--seed", type=int, default=1, help="which pictures: k from seed * 1,000,000; the blur radii")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--synth", type=int, default=150, help="lesion photos among the quality set's originals")
    p.add_argument("--no-quality", action="store_true")
    p.add_argument("--no-families", action="store_true")
    p.add_argument(
        "--share", type=float, help="try another DETAIL_SHARE, e.g. 0.02 (a comparison: not the format's rule)"
    )
    p.add_argument("--rank", type=int, help="try another DETAIL_RANK, e.g. 6 (a comparison: not the format's rule)")
    args = p.parse_args()
    import wds_tools.format.phash as recipe

    for name, value in (("DETAIL_SHARE", args.share), ("DETAIL_RANK", args.rank)):
        if value is not None:
            setattr(recipe, name, value)
            kept = {"DETAIL_SHARE": DETAIL_SHARE, "DETAIL_RANK": DETAIL_RANK}[name]
            print(f"{name} = {value} (a comparison: the format's rule has {kept})\n")
    if not args.no_families:
        false_pairs(args)
    if not args.no_quality:
        quality(args)


if __name__ == "__main__":
    main()
