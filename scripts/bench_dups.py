"""Benchmark near-duplicate finding (issue 24): quality on known duplicate pairs, and cost at scale.

Quality. A test set built from real photographic content shipped by installed packages (no
internet): windows of scikit-learn's two sample photos (china.jpg, flower.jpg), of scikit-image's
data photos where scikit-image is installed (at most ``--windows`` per photo, evenly spread, so that
the large retina photo does not fill the set), and ``wds_tools.synth`` lesion photos. Two rules keep
the negatives fair: windows are taken on a grid half a window apart, so two of them share at most half
their area (a copy cropped by 10% keeps at least 81% of its original: no negative is a near-crop of
another); and a window more than three quarters of whose pixels are darker than 10% grey is left out
(the retina photo's black frame: its corner windows are a dark field with a sliver of the retina's
edge, mirror images of one another, which no flip-invariant hash can tell apart). Each
*original* is a JPEG (quality 92) and gets six duplicates, one per kind: JPEG recompression
(quality 60-95), rescaling (0.5-2x), a crop of up to 10% of the width and of the height, a flip or
quarter turn, brightness +-10%, slight blur (Gaussian radius 0.6-1.2), each saved as a JPEG
(quality 90) as a copy in the wild would be. Every file becomes stored pixels exactly as
``convert`` makes them (``decode_image`` at ``--size``, center-crop). Positives are every pair of
files of one original (21 per original); negatives every pair of files of different originals, and
the originals are *similar*: overlapping windows (half a window apart) of one photo, lesion photos
of one class.
For each method, precision and recall over all pairs at each threshold, and at its default:

  wds-tools   ``format.phash`` (the whole image's hash and six windows'; docs/FORMAT.md) and its
              distance: either image's whole-image hash, under the 8 flips/turns, against any of the
              other's seven, and colour agreement (``phash.colour_layout`` of the stored pixels,
              ``colour_alike``: a pair whose colours do not agree is not near): FORMAT.md's
              near-duplicate, what ``similar.dups.find_pairs`` finds; and the hashes alone beside it
              (grey only: what colour agreement costs in recall)
  whole only  the whole-image hashes alone (the first column; 8 flips/turns) and colour agreement:
              what the windows add
  imagehash   ``imagehash.phash`` (64-bit median pHash) of the same stored pixels, plain Hamming
              distance (it does not handle flips and turns), where imagehash is installed
  imagededup  ``imagededup``'s PHash, WHash and DHash (64 bits each) of the same stored pixels, its
              Hamming distance (no flips or turns; default threshold 10), where imagededup is
              installed. Only its hashing module is loaded: the package's ``__init__`` files import its
              CNN side (torchvision) and plotter (matplotlib), which hashing does not use
  fastdup     the embeddings ``fastdup.run`` computes (its default CPU model, 576 floats) of the same
              stored pixels written as PNG, cosine similarity over all pairs (fastdup itself reports
              only each image's nearest neighbours above its threshold, default 0.9), and the pairs
              its own output (``similarity.csv``, run with its defaults: 2 neighbours, >= 0.9)
              lists, where fastdup is installed; it runs with ``SENTRY_OPT_OUT`` and
              ``FASTDUP_PRODUCTION`` set, so it neither sends telemetry nor checks PyPI for a newer
              version

Hash cost. Per image, the converter's decode at ``--size`` against ``phash`` of its pixels (the
part of a conversion that hashing adds), on 12 MP and 600x450 photo-like JPEGs, interleaved; and
hashing's share of a whole one-worker ``convert`` of them (the writer's hashing call timed inside it).

Cost. ``find_pairs`` (the search by the hashes; colour agreement is asked after it, of the found pairs'
samples only: scripts/bench_lowdetail.py ``--colour-cost``) on ``--scale`` samples of seven uniformly random 64-bit hashes (top bit 0, as
stored) plus 1% planted near copies (a copy's whole-image hash is one of its original's seven hashes with
1-``threshold`` bits flipped, under a random flip/turn), at the default threshold:
wall seconds, peak RSS (``resource.getrusage``, this process), and the planted pairs found. An
all-pairs scan is O(N^2); this one probes bands of the hash (multi-index hashing).

    python scripts/bench_dups.py                    # quality table + 1,000,000 hashes
    python scripts/bench_dups.py --scale 100000 --synth 100
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wds_tools.convert.decode import decode_image  # noqa: E402
from wds_tools.format.phash import (  # noqa: E402
    COLOUR_GREY,
    WINDOWS,
    colour_alike,
    colour_layout,
    is_flat,
    phash_batch,
    popcount,
    variants_array,
)
from wds_tools.similar.near import (  # noqa: E402
    DEFAULT_THRESHOLD,
    MAX_THRESHOLD,
    clusters_of,
    find_pairs,
    near_clusters,
)
from wds_tools.synth import FLAT_KINDS, flat_picture, jpeg_bytes, lesion_photo  # noqa: E402

KINDS = ("jpeg", "rescale", "crop", "turn", "brightness", "blur")
DARK, MOSTLY_DARK = 26, 0.75  # a window with more than 75% of its pixels below grey 26 (10%) is left out


def photo_windows(window: int = 256, most: int = 12) -> tuple[list[Image.Image], float]:
    """Windows (on a grid of stride window/2) of the real photos the installed packages ship, but those
    mostly dark (the fairness rules above); and the largest share of area two of them have in common."""
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(a) for a in load_sample_images().images]
    try:
        from skimage import data as skdata

        for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "retina"):
            try:
                a = getattr(skdata, name)()
            except Exception:  # a data file that needs a download
                continue
            if a.ndim == 3 and a.shape[2] == 3 and min(a.shape[:2]) >= window:
                photos.append(Image.fromarray(a))
    except ImportError:
        pass
    out, overlap = [], 0.0
    for p in photos:
        w, h = p.size
        boxes = [
            (left, top, left + window, top + window)
            for top in range(0, h - window + 1, window // 2)
            for left in range(0, w - window + 1, window // 2)
        ]
        keep = np.linspace(0, len(boxes) - 1, min(most, len(boxes))).round().astype(int)
        kept = []
        for k in sorted(set(keep.tolist())):
            im = p.crop(boxes[k])
            if (np.asarray(im.convert("L")) < DARK).mean() <= MOSTLY_DARK:
                out.append(im)
                kept.append(boxes[k])
        for a, b in itertools.combinations(kept, 2):
            inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
            overlap = max(overlap, inter / window**2)
    return out, overlap


def copy_of(im: Image.Image, kind: str, rng: np.random.Generator) -> Image.Image:
    """One duplicate of ``im`` made by ``kind``."""
    w, h = im.size
    if kind == "jpeg":
        return Image.open(io.BytesIO(jpeg_bytes(im, int(rng.integers(60, 96))))).convert("RGB")
    if kind == "rescale":
        f = float(rng.uniform(0.5, 2.0))
        return im.resize((max(8, round(w * f)), max(8, round(h * f))), Image.Resampling.BICUBIC)
    if kind == "crop":
        cw, ch = rng.uniform(0, 0.10, 2) * (w, h)  # up to 10% of the width and of the height, split over two sides
        left, top = rng.uniform(0, 1, 2) * (cw, ch)
        return im.crop((round(left), round(top), w - round(cw - left), h - round(ch - top)))
    if kind == "turn":
        ops = [
            Image.Transpose.FLIP_LEFT_RIGHT,
            Image.Transpose.FLIP_TOP_BOTTOM,
            Image.Transpose.ROTATE_90,
            Image.Transpose.ROTATE_180,
            Image.Transpose.ROTATE_270,
            Image.Transpose.TRANSPOSE,
            Image.Transpose.TRANSVERSE,
        ]
        return im.transpose(ops[int(rng.integers(len(ops)))])
    if kind == "brightness":
        return ImageEnhance.Brightness(im).enhance(float(rng.uniform(0.9, 1.1)))
    if kind == "blur":
        return im.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.6, 1.2))))
    raise ValueError(kind)


def squeeze(im: Image.Image, contrast: float) -> Image.Image:
    """``im`` with its colours pulled towards their mean by ``contrast`` (1: unchanged), rounded."""
    a = np.asarray(im.convert("RGB")).astype(np.float64)
    m = a.mean(axis=(0, 1), keepdims=True)
    return Image.fromarray(np.clip(np.round(m + contrast * (a - m)), 0, 255).astype(np.uint8))


def build_set(
    synth: int, size: int, windows: int = 12, seed: int = 0, contrast: float = 1.0
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(stored pixels [N, S, S, 3], original id [N], kind [N]: "original" or the copy's kind); with
    ``contrast`` < 1, every original squeezed towards its mean colour first (``squeeze``)."""
    rng = np.random.default_rng(seed)
    originals = photo_windows(most=windows)[0] + [lesion_photo(320, 320, 1, 1000 + i) for i in range(synth)]
    if contrast != 1.0:
        originals = [squeeze(im, contrast) for im in originals]
    pixels, ids, kinds = [], [], []
    for i, im in enumerate(originals):
        for kind in ("original", *KINDS):
            pic = im if kind == "original" else copy_of(im, kind, rng)
            data = jpeg_bytes(pic.convert("RGB"), 92 if kind == "original" else 90)
            pixels.append(decode_image(data, size).pixels)
            ids.append(i)
            kinds.append(kind)
    return np.stack(pixels), np.array(ids), kinds


def colour_apart(layouts: np.ndarray, chunk: int = 200_000) -> np.ndarray:
    """[N, N] True where two samples' colour layouts (``phash.colour_layout``, [N, 2, 2, 2]) do not agree
    (``phash.colour_alike``, FORMAT.md's Colour agreement), over all pairs i < j in chunks, mirrored."""
    n = len(layouts)
    iu, ju = np.triu_indices(n, 1)
    apart = np.zeros((n, n), bool)
    for lo in range(0, len(iu), chunk):
        i, j = iu[lo : lo + chunk], ju[lo : lo + chunk]
        apart[i, j] = ~colour_alike(layouts[i], layouts[j])
    return apart | apart.T


def colours_of(layouts: np.ndarray) -> Callable[[int, np.ndarray], np.ndarray]:
    """``near.find_pairs``' and ``near_clusters``' ``colours`` for one set whose layouts are known."""
    return lambda _side, rows: layouts[rows]


def pair_distances(
    hashes: np.ndarray, flips: bool, flat_rule: bool = True, layouts: np.ndarray | None = None
) -> np.ndarray:
    """[N, N] distances: plain Hamming distances of [N] hashes; with ``flips``, of [N, K] hashes per
    sample (K = 1: whole-image only), FORMAT.md's distance: the least over the 8 variants of either's
    first hash against any of the other's K, and 64 (never near) for a sample too flat to hash unless
    ``flat_rule`` is off (the distance of its bits as they are, the flat flag cleared). With ``layouts``
    (the samples' ``colour_layout``), 64 too for a pair whose colours do not agree: FORMAT.md's
    near-duplicate, what ``dups`` finds; without, the hashes alone."""
    if not flips:
        return popcount(hashes[:, None] ^ hashes[None, :])
    flat = is_flat(hashes.reshape(len(hashes), -1))
    hashes = hashes.copy()
    hashes.reshape(len(hashes), -1)[:, 0] &= np.uint64((1 << 63) - 1)
    hashes = hashes.reshape(len(hashes), -1)
    var = variants_array(hashes[:, 0])  # [N, 8]
    d = np.full((len(hashes), len(hashes)), 64, np.int64)
    for v in range(8):
        for k in range(hashes.shape[1]):
            d = np.minimum(d, popcount(var[:, v][:, None] ^ hashes[None, :, k]))
    d = np.minimum(d, d.T)
    if flat_rule:
        d[flat, :] = 64
        d[:, flat] = 64
    if layouts is not None:
        d[colour_apart(layouts)] = 64
    return d


def imagededup_hashes(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """imagededup's PHash, WHash and DHash of each image as uint64. Its hashing module alone: the
    packages ``imagededup.methods`` and ``imagededup.utils`` are entered in ``sys.modules`` as bare
    packages, so their ``__init__`` files (which import torchvision and matplotlib for the CNN and the
    plots) do not run. Raises ImportError where imagededup (or its PyWavelets, scipy) is missing."""
    import importlib
    import importlib.util
    import types

    spec = importlib.util.find_spec("imagededup")
    if spec is None or spec.origin is None:
        raise ImportError("imagededup is not installed")
    root = Path(spec.origin).parent
    for sub in ("methods", "utils"):
        name = f"imagededup.{sub}"
        if name not in sys.modules:
            shell = types.ModuleType(name)
            shell.__path__ = [str(root / sub)]
            sys.modules[name] = shell
    hashing = importlib.import_module("imagededup.methods.hashing")
    out = {}
    for method in ("PHash", "WHash", "DHash"):
        encoder = getattr(hashing, method)(verbose=False)
        out[method] = np.array([int(encoder.encode_image(image_array=p), 16) for p in pixels], dtype=np.uint64)
    return out


def fastdup_similarity(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[N, N] cosine similarity of the embeddings ``fastdup.run`` computes for the images (written as
    PNG, lossless, so it reads the stored pixels), on 2 threads, offline; and [N, N] True where its
    ``similarity.csv`` lists the pair (either way). Raises ImportError where fastdup is missing,
    RuntimeError where its run fails."""
    import csv
    import os

    os.environ.setdefault("SENTRY_OPT_OUT", "1")  # no telemetry
    os.environ.setdefault("FASTDUP_PRODUCTION", "1")  # no version check on PyPI
    import fastdup

    with tempfile.TemporaryDirectory() as tmp:
        img = Path(tmp) / "img"
        img.mkdir()
        for k, p in enumerate(pixels):
            Image.fromarray(p).save(img / f"{k:05d}.png")
        log = Path(tmp) / "fastdup.log"
        sys.stdout.flush()
        saved = os.dup(1)
        with open(log, "w") as f:  # its progress bars are written by the C++ library to fd 1
            os.dup2(f.fileno(), 1)
            try:
                rc = fastdup.run(str(img), work_dir=str(Path(tmp) / "work"), num_threads=2, verbose=False)
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
                os.close(saved)
        if rc != 0:
            raise RuntimeError(f"fastdup.run returned {rc}: {log.read_text()[-2000:]}")
        names, feats = fastdup.load_binary_feature(str(Path(tmp) / "work" / "atrain_features.dat"))
        listed = np.zeros((len(pixels), len(pixels)), bool)
        with open(Path(tmp) / "work" / "similarity.csv", newline="") as f:
            for row in csv.DictReader(f):
                a, b = int(Path(row["from"]).stem), int(Path(row["to"]).stem)
                listed[a, b] = listed[b, a] = True
    if len(names) != len(pixels):
        raise RuntimeError(f"fastdup embedded {len(names)} of {len(pixels)} images")
    order = np.argsort([int(Path(n).stem) for n in names])
    f = np.asarray(feats, np.float64)[order]
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    return f @ f.T, listed


def curve(dist: np.ndarray, ids: np.ndarray, kinds: list[str], thresholds: list[float] | range) -> list[dict]:
    """Precision and recall over all pairs i < j at each threshold; recall per kind of copy."""
    iu, ju = np.triu_indices(len(ids), 1)
    d = dist[iu, ju]
    same = ids[iu] == ids[ju]
    # a positive is an original with one of its copies (copies of one original are duplicates too)
    kind_arr = np.array(kinds)
    rows = []
    for t in thresholds:
        found = d <= t
        tp = int((found & same).sum())
        fp = int((found & ~same).sum())
        row = {"t": t, "recall": tp / max(1, int(same.sum())), "precision": tp / max(1, tp + fp), "fp": fp}
        for k in KINDS:  # original <-> its copy of kind k
            sel = same & (
                ((kind_arr[iu] == "original") & (kind_arr[ju] == k))
                | ((kind_arr[ju] == "original") & (kind_arr[iu] == k))
            )
            row[k] = float((found & sel).sum() / max(1, sel.sum()))
        rows.append(row)
    return rows


def quality(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    pixels, ids, kinds = build_set(args.synth, args.size, args.windows, args.seed)
    n_orig = len(set(ids.tolist()))
    print(
        f"photo windows: the largest share of area two of them have in common is {photo_windows(most=args.windows)[1]:.0%}"
    )
    print(
        f"test set: {n_orig} originals x {1 + len(KINDS)} files = {len(ids)} images at {args.size} px "
        f"({int((ids[:, None] == ids[None, :]).sum() - len(ids)) // 2} duplicate pairs, "
        f"{len(ids) * (len(ids) - 1) // 2 - int((ids[:, None] == ids[None, :]).sum() - len(ids)) // 2} "
        f"negative pairs; built in {time.perf_counter() - t0:.0f} s)\n"
    )
    hashes = phash_batch(pixels)
    layouts = colour_layout(pixels)
    grey = int((np.abs(layouts).reshape(len(layouts), -1).max(axis=1) < COLOUR_GREY).sum())
    print(
        f"too flat to hash (docs/FORMAT.md): {int(is_flat(hashes).sum())} of {len(hashes)} images; "
        f"no colour (every layout value within {COLOUR_GREY} of 0: agrees with any): {grey}\n"
    )
    table(
        "wds-tools near_clusters (what dups finds: candidates by the hashes, each checked on its stored pixels, "
        "similar.match; a pair found when both are in one cluster)",
        cluster_curve(pixels, hashes, layouts, ids, kinds, range(3, 9)),
        DEFAULT_THRESHOLD,
    )
    methods = [
        (
            "wds-tools phash (whole image + 6 windows, 8 flips/turns) and colour agreement: the candidates' pairs",
            pair_distances(hashes, True, layouts=layouts),
            DEFAULT_THRESHOLD,
        ),
        (
            "wds-tools phash (whole image + 6 windows, 8 flips/turns), hashes alone (no colour agreement)",
            pair_distances(hashes, True),
            DEFAULT_THRESHOLD,
        ),
        (
            "whole-image hash only (8 flips/turns) and colour agreement",
            pair_distances(hashes[:, :1], True, layouts=layouts),
            3,
        ),
    ]
    try:
        import imagehash

        ih = np.array([int(str(imagehash.phash(Image.fromarray(p))), 16) for p in pixels], dtype=np.uint64)
        methods.append((f"imagehash {imagehash.__version__} phash", pair_distances(ih, False), 10))
    except ImportError:
        print("imagehash not installed: its rows are left out (pip install imagehash)\n")
    try:
        from importlib.metadata import version

        for method, h in imagededup_hashes(pixels).items():
            methods.append((f"imagededup {version('imagededup')} {method}", pair_distances(h, False), 10))
    except ImportError as e:
        print(f"imagededup rows left out: {e} (pip install --no-deps imagededup PyWavelets scipy)\n")
    fastdup_sim = fastdup_listed = None
    try:
        t1 = time.perf_counter()
        fastdup_sim, fastdup_listed = fastdup_similarity(pixels)
        from importlib.metadata import version

        fastdup_name = f"fastdup {version('fastdup')} embeddings, cosine similarity ({time.perf_counter() - t1:.0f} s)"
    except (ImportError, OSError, RuntimeError) as e:
        print(f"fastdup rows left out: {e}\n")
    for name, dist, default in methods:
        table(
            name,
            curve(
                dist, ids, kinds, [*range(13), 14, 16, 18, 20] if args.all else range(max(0, default - 4), default + 5)
            ),
            default,
        )
    if fastdup_sim is not None and fastdup_listed is not None:
        # as a distance 1 - similarity, so that curve's "found: distance <= t" holds; printed as similarity
        sims = [0.8, 0.85, 0.9, 0.93, 0.95, 0.96, 0.97, 0.98, 0.99]
        rows = curve(1.0 - fastdup_sim, ids, kinds, [1.0 - s + 1e-9 for s in sims])
        for r, s in zip(rows, sims):
            r["t"] = s
        table(fastdup_name + ", similarity >=", rows, 0.9)
        table(
            "fastdup's own output (similarity.csv, defaults: 2 nearest neighbours, >= 0.9)",
            curve(np.where(fastdup_listed, 0, 1), ids, kinds, [0]),
            0,
        )


def cluster_curve(
    pixels: np.ndarray, hashes: np.ndarray, layouts: np.ndarray, ids: np.ndarray, kinds: list[str], thresholds
) -> list[dict]:
    """``curve``'s rows for near_clusters at each threshold: a pair is found when both are in one cluster."""
    from wds_tools.similar.match import looks

    lk = looks(pixels)
    iu, ju = np.triu_indices(len(ids), 1)
    same = ids[iu] == ids[ju]
    kind_arr = np.array(kinds)
    rows = []
    for t in thresholds:
        found = near_clusters(hashes, t, looks=lambda _side, r: (layouts[r], lk[r]))
        cluster_of = np.full(len(ids), -1)
        for c, members in enumerate(found.clusters):
            cluster_of[members] = c
        together = (cluster_of[iu] == cluster_of[ju]) & (cluster_of[iu] >= 0)
        tp, fp = int((together & same).sum()), int((together & ~same).sum())
        row = {"t": t, "recall": tp / max(1, int(same.sum())), "precision": tp / max(1, tp + fp), "fp": fp}
        for k in KINDS:
            sel = same & (
                ((kind_arr[iu] == "original") & (kind_arr[ju] == k))
                | ((kind_arr[ju] == "original") & (kind_arr[iu] == k))
            )
            row[k] = float((together & sel).sum() / max(1, sel.sum()))
        rows.append(row)
    return rows


def table(name: str, rows: list[dict], default: float) -> None:
    print(f"### {name}\n")
    print("| threshold | precision | recall | false pairs | " + " | ".join(KINDS) + " |")
    print("|---|---|---|---|" + "---|" * len(KINDS))
    for r in rows:
        mark = " **(default)**" if r["t"] == default else ""
        print(
            f"| {r['t']}{mark} | {r['precision']:.4f} | {r['recall']:.4f} | {r['fp']} | "
            + " | ".join(f"{r[k]:.3f}" for k in KINDS)
            + " |"
        )
    print()


def cost(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(1)
    n = args.scale
    hashes = rng.integers(0, 2**63, (n, WINDOWS), dtype=np.uint64)
    planted = n // 100
    src = rng.choice(n, planted, replace=False)
    dst = rng.choice(np.setdiff1d(np.arange(n), src), planted, replace=False)
    for s, d in zip(src, dst):
        h = int(hashes[s, int(rng.integers(WINDOWS))])
        for b in rng.choice(63, int(rng.integers(1, DEFAULT_THRESHOLD + 1)), replace=False):
            h ^= 1 << int(b)
        hashes[d, 0] = variants_array(np.array([h], np.uint64))[0, int(rng.integers(8))]
    t0 = time.perf_counter()
    i, j, dist = find_pairs(hashes, DEFAULT_THRESHOLD)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    want = {(min(a, b), max(a, b)) for a, b in zip(src.tolist(), dst.tolist())}
    got = set(zip(i.tolist(), j.tolist()))
    print(
        f"cost: find_pairs on {n:,} samples of {WINDOWS} random hashes + {planted:,} planted copies at threshold "
        f"{DEFAULT_THRESHOLD}: {wall:.1f} s, peak RSS {rss:.0f} MiB (this process), "
        f"{len(want & got):,}/{len(want):,} planted pairs found, {len(got):,} pairs in all"
    )


def hash_cost(args: argparse.Namespace) -> None:
    """Per image: the converter's decode (``decode_image`` at ``--size``, JPEG draft mode) against
    ``phash`` of its pixels, interleaved, medians; for 12 MP photos (4032x3024, the converter
    benchmark's) and 600x450 ones (HAM10000's size)."""
    from wds_tools.format.phash import phash
    from wds_tools.synth import photo_like

    print(
        f"hash cost at {args.size} px (median ms per image over {args.hash_images} images x 3 rounds, interleaved):\n"
    )
    print("| source | decode_image | phash | phash / decode |")
    print("|---|---|---|---|")
    for w, h in ((4032, 3024), (600, 450)):
        files = [jpeg_bytes(photo_like(w, h, 70 + k), 92) for k in range(args.hash_images)]
        dec, hsh = [], []
        for _ in range(3):
            for data in files:
                t0 = time.perf_counter()
                px = decode_image(data, args.size).pixels
                t1 = time.perf_counter()
                phash(px)
                t2 = time.perf_counter()
                dec.append(t1 - t0)
                hsh.append(t2 - t1)
        d, p = float(np.median(dec)) * 1e3, float(np.median(hsh)) * 1e3
        print(f"| {w}x{h} JPEG | {d:.2f} ms | {p:.3f} ms | {p / d:.1%} |")
    print()


def hash_against(args: argparse.Namespace) -> None:
    """CPU time of ``phash_batch`` (batches of 16, as the writer hashes) and of a lone ``phash`` per stored
    224 px image, against the ``format/phash.py`` of another checkout (``--against DIR``, e.g. a git
    worktree of main), interleaved, 7 rounds, medians and the ratio. Run with OPENBLAS_NUM_THREADS=1:
    process time then counts one thread."""
    import importlib.util

    from wds_tools.format.phash import phash
    from wds_tools.synth import photo_like

    spec = importlib.util.spec_from_file_location("other_phash", Path(args.against) / "wds_tools/format/phash.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against {args.against}: no wds_tools/format/phash.py there")
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    ims = [decode_image(jpeg_bytes(photo_like(600, 450, 70 + k), 92), args.size).pixels for k in range(16)]
    times: dict[str, list[float]] = {}
    for _ in range(7):
        for name, batch, one in (("other", other.phash_batch, other.phash), ("this", phash_batch, phash)):
            t0 = time.process_time()
            for _ in range(20):
                batch(ims)
            times.setdefault(f"{name} batch", []).append((time.process_time() - t0) / (20 * len(ims)) * 1e3)
            t0 = time.process_time()
            for _ in range(2):
                for im in ims:
                    one(im)
            times.setdefault(f"{name} one", []).append((time.process_time() - t0) / (2 * len(ims)) * 1e3)
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(f"phash CPU ms per image at {args.size} px, this checkout against {args.against} (medians of 7):\n")
    print("| call | other | this | this / other |")
    print("|---|---|---|---|")
    for call in ("batch", "one"):
        a, b = med[f"other {call}"], med[f"this {call}"]
        print(f"| {'phash_batch of 16' if call == 'batch' else 'phash, one image'} | {a:.4f} | {b:.4f} | {b / a:.3f} |")
    print()


def convert_share(args: argparse.Namespace) -> None:
    """The share of a conversion's time spent hashing: ``convert`` (one worker: in this process) of
    ``--hash-images`` photo-like JPEGs per source size at ``--size``, the writer's hashing call wrapped
    by a timer; 3 runs into fresh folders, the median share."""
    import csv

    import wds_tools.convert.write as write
    from wds_tools.convert import convert
    from wds_tools.synth import photo_like

    spent = [0.0]
    plain = write._phashes

    def timed(pixels: list[np.ndarray]) -> list[tuple[int, ...]]:
        t0 = time.perf_counter()
        try:
            return plain(pixels)
        finally:
            spent[0] += time.perf_counter() - t0

    write._phashes = timed
    print(f"hashing share of convert --size {args.size} --workers 1 ({args.hash_images} JPEGs per size, 3 runs):\n")
    print("| source | conversion | of which phash | share |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for w, h in ((4032, 3024), (600, 450)):
            src = Path(tmp) / f"{w}x{h}"
            src.mkdir()
            with open(src / "m.csv", "w", newline="") as f:
                out = csv.writer(f)
                out.writerow(["key", "path", "label"])
                for k in range(args.hash_images):
                    (src / f"{k}.jpg").write_bytes(jpeg_bytes(photo_like(w, h, 70 + k), 92))
                    out.writerow([f"s{k}", f"{k}.jpg", "ab"[k % 2]])
            rows = []
            for r in range(3):
                spent[0] = 0.0
                t0 = time.perf_counter()
                convert(src / "m.csv", version="v1", size=args.size, out=src / f"out{r}", workers=1, progress=False)
                rows.append((time.perf_counter() - t0, spent[0]))
            total, hashing = sorted(rows, key=lambda x: x[1] / x[0])[1]
            n = args.hash_images
            print(
                f"| {w}x{h} JPEG | {total / n * 1e3:.2f} ms/image | {hashing / n * 1e3:.3f} ms/image | "
                f"{hashing / total:.1%} |"
            )
    write._phashes = plain
    print()


def write_hash_index(
    dest: str | Path,
    hashes: np.ndarray,
    seed: int = 2,
    with_pixels: np.ndarray | None = None,
    pixels_of: Callable[[int], np.ndarray] | None = None,
) -> None:
    """An index of ``len(hashes)`` samples holding these hashes (samples.npz ``phash``), random labels,
    two splits (every tenth of 2,000 shards in val): what ``find_dups`` reads. Tars only for the samples
    ``with_pixels``: each one's ``.npy`` member holds ``pixels_of(sample)`` (224 px; equal pixels within a
    shard are one member, as their equal ``npy_xxh3`` says), as ``find_dups`` reads them for the colour
    layouts of the samples the hashes put in clusters; every other sample must be in none."""
    import xxhash

    from wds_tools.format.index import FORMAT_NAME, FORMAT_VERSION, SAMPLE_COLUMNS, write_index
    from wds_tools.format.names import shard_name, url_pattern
    from wds_tools.format.npy import npy_header
    from wds_tools.format.packed import pack_strings
    from wds_tools.format.phash import FLAT_RULES
    from wds_tools.format.sample import MEMBERS, classes_digest
    from wds_tools.format.tarwrite import ShardWriter

    n = len(hashes)
    n_shards = min(2000, n)
    rng = np.random.default_rng(seed)
    per = -(-n // n_shards)
    cols = {name: np.zeros(n, dtype) for name, dtype in SAMPLE_COLUMNS.items() if name not in ("key", "path_data")}
    cols["key"] = np.array([f"s{i:08d}".encode() for i in range(n)], dtype="S")
    cols["label"] = rng.integers(0, 7, n).astype("<i4")
    cols["shard"] = (np.arange(n) // per).astype("<u4")
    cols["fingerprint"] = np.zeros((n, 16), "u1")
    cols["phash"] = hashes
    cols["path_offsets"], cols["path_data"] = pack_strings([f"img/{i}.jpg" for i in range(n)])
    Path(dest).mkdir(parents=True, exist_ok=True)
    # every tenth shard in val; each split's shards numbered from 000000 in order (format.model checks it)
    split_of = ["train" if s % 10 else "val" for s in range(n_shards)]
    names = [shard_name(sp, sum(x == sp for x in split_of[:s])) for s, sp in enumerate(split_of)]
    if with_pixels is not None and pixels_of is not None:
        header = npy_header((224, 224, 3))
        rows = np.unique(np.asarray(with_pixels, np.int64))
        for s in np.unique(cols["shard"][rows]).tolist():
            w = ShardWriter(str(Path(dest) / names[s]), digest=False)
            members: dict[int, tuple[int, int]] = {}  # xxh3 -> (offset, length): equal pixels, one member
            for r in rows[cols["shard"][rows] == s].tolist():
                data = header + np.ascontiguousarray(pixels_of(r), np.uint8).tobytes()
                x = xxhash.xxh3_64_intdigest(data)
                if x not in members:
                    members[x] = w.add(f"s{r:08d}.npy", data)
                cols["npy_offset"][r], cols["npy_length"][r] = members[x]
                cols["npy_xxh3"][r] = x
            w.end()
            os.replace(w.tmp, w.path)
    counts = np.bincount(cols["shard"], minlength=n_shards).tolist()
    shards = [
        {
            "name": names[s],
            "split": split_of[s],
            "samples": counts[s],
            "bytes": 160_000 * counts[s],  # as if each sample's members were there (the index's checks)
            "sha256": "0" * 64,
        }
        for s in range(n_shards)
    ]
    classes = [f"c{i}" for i in range(7)]
    grey = [0.5, 0.5, 0.5]
    splits = {}
    for sp in ("train", "val"):
        mine = np.isin(cols["shard"], [s for s in range(n_shards) if split_of[s] == sp])
        k = split_of.count(sp)
        splits[sp] = {
            "samples": int(mine.sum()),
            "shards": k,
            "urls": url_pattern(sp, k),
            "class_counts": np.bincount(cols["label"][mine], minlength=7).tolist(),
            "mean": grey,
            "std": grey,
        }
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "dataset_version": "bench",
        "size": 224,
        "sample": {"members": list(MEMBERS), "npy_dtype": "uint8", "npy_shape": [224, 224, 3]},
        "classes": classes,
        "classes_digest": classes_digest(classes),
        "class_counts": np.bincount(cols["label"], minlength=7).tolist(),
        "mean": grey,
        "std": grey,
        "stats_split": "train",
        "errors_file": None,
        "samples": n,
        "shards": shards,
        "splits": splits,
        "phash_flat_rules": FLAT_RULES,  # the hashes as given (no pixels to hash them again from)
    }
    write_index(str(dest), meta, cols, sidecars=False)


def command_cost(args: argparse.Namespace) -> None:
    """``find_dups`` (what ``wds-tools dups PATH`` runs) on an index of ``--index-scale`` samples: random
    hashes with 1% planted copies, two splits, in 2,000 shards (the hashes in samples.npz; tars holding
    the pixels of the samples the hashes put in clusters only: ``clustered_pixels``)."""

    from wds_tools.similar.dups import find_dups

    n = args.index_scale
    rng = np.random.default_rng(2)
    hashes = rng.integers(0, 2**63, (n, WINDOWS), dtype=np.uint64)
    per = -(-n // min(2000, n))
    src = np.arange(0, n - per - 1, 100)
    hashes[src + per + 1, 0] = hashes[src, 1] ^ np.uint64(3)  # 1% copies of a centre window, 2 bits apart, next shard
    with_pixels, pixels_of = clustered_pixels(hashes)
    if args.keep_index:
        write_hash_index(args.keep_index, hashes, with_pixels=with_pixels, pixels_of=pixels_of)
        print(
            f"index of {n:,} samples written to {args.keep_index} (time the command: wds-tools dups {args.keep_index})"
        )
        return
    if args.against:  # each in its own process, this checkout's code and the other's, alternating
        import os

        with tempfile.TemporaryDirectory() as tmp:
            write_hash_index(tmp, hashes, with_pixels=with_pixels, pixels_of=pixels_of)
            print(f"find_dups on an index of {n:,} samples, own process, this checkout against {args.against}:\n")
            print("| round | code | wall s | CPU s | peak RSS MiB | clusters | load |")
            print("|---|---|---|---|---|---|---|")
            for r in range(args.rounds):
                for name, path in (("other", args.against), ("this", str(Path(__file__).resolve().parents[1]))):
                    load = os.getloadavg()[0]
                    t = timed_dups(tmp, DEFAULT_THRESHOLD, args.timeout, pythonpath=path)
                    print(
                        f"| {r + 1} | {name} | {t.get('wall', float('nan')):.1f} | {t.get('cpu', float('nan')):.1f} | "
                        f"{t.get('rss_mib', float('nan')):.0f} | {t.get('clusters') or t.get('error')} | {load:.1f} |"
                    )
        print()
        return
    import wds_tools.similar.dups as dups

    plain = dups._Dataset.looks
    spent, asked = [0.0, 0.0], [0]

    def timed(self: dups._Dataset, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return plain(self, rows)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += time.process_time() - c0
            asked[0] += len(rows)

    with tempfile.TemporaryDirectory() as tmp:
        write_hash_index(tmp, hashes, with_pixels=with_pixels, pixels_of=pixels_of)
        dups._Dataset.looks = timed  # type: ignore[method-assign]
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            res = find_dups(tmp)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            dups._Dataset.looks = plain  # type: ignore[method-assign]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    c = res.counts()
    print(
        f"find_dups on an index of {n:,} samples: {wall:.1f} s (CPU {cpu:.1f} s), peak RSS {rss:.0f} MiB (this "
        f"process, index building included), {c['clusters']:,} clusters, {c['cross_split']:,} cross splits, "
        f"{res.checked:,} candidate pairs checked, {res.passed:,} passed; of which the colour layouts and looks of "
        f"{asked[0]:,} candidate samples (their pixels read from the tars, which this process has just written): "
        f"{spent[0]:.1f} s (CPU {spent[1]:.1f} s)"
    )


def clustered_pixels(hashes: np.ndarray) -> tuple[np.ndarray, Callable[[int], np.ndarray]]:
    """The samples of the candidate pairs at the default threshold (``near._candidates``, run here once), and
    pixels for each: per component of those pairs a picture of its own (one of 16 stored lesion photos averaged
    with a smooth random pattern drawn from the component's number: pictures of two components fail the check,
    as different photos do, and are not each other's look neighbours' copies), with its top-left pixel set
    from the sample's number, so that every sample is a ``.npy`` of its own (read on its own, as distinct files
    are) and the samples the hashes join are copies of one picture (the planted copies pass the check; a
    chance pair of random hashes whose components meet does too)."""
    from wds_tools.similar.near import HASH_NEAREST, _candidates, _distinct, clusters_of

    d = _distinct(hashes, keep_flat=True)
    p, q, _ = _candidates(d, DEFAULT_THRESHOLD, None, HASH_NEAREST, lambda: None)
    comps = clusters_of(len(d.rows), p, q)
    pool = [decode_image(jpeg_bytes(lesion_photo(320, 320, k % 3, 500 + k)), 224).pixels for k in range(16)]
    comp_of_row = {r: c for c, rows in enumerate(comps) for r in rows}
    comp = {s: comp_of_row[int(r)] for s, r in enumerate(d.of.tolist()) if int(r) in comp_of_row}

    def picture(c: int) -> np.ndarray:
        small = np.random.default_rng([c, 37]).integers(0, 256, (5, 5, 3), dtype=np.uint8)
        pattern = np.asarray(Image.fromarray(small).resize((224, 224), Image.Resampling.BICUBIC), np.uint16)
        return ((pool[c % len(pool)].astype(np.uint16) + pattern) // 2).astype(np.uint8)

    last: dict[int, np.ndarray] = {}  # the last component's picture (samples are asked for shard by shard)

    def pixels_of(sample: int) -> np.ndarray:
        c = comp[sample]
        if c not in last:
            last.clear()
            last[c] = picture(c)
        px = last[c].copy()
        px[0, 0] = (sample & 255, (sample >> 8) & 255, (sample >> 16) & 255)
        return px

    return np.array(sorted(comp), np.int64), pixels_of


_TIMED = """
import json, resource, sys, time
from wds_tools.similar.dups import find_dups
t0, c0 = time.perf_counter(), time.process_time()
try:
    res = find_dups(sys.argv[1], threshold=int(sys.argv[2]))
    found = res.counts()["clusters"], max((len(c.members) for c in res.clusters), default=0)
    error = None
except Exception as e:  # a MemoryError, a refusal: the figure is what happened
    found, error = (None, None), f"{type(e).__name__}: {str(e)[:200]}"
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "clusters": found[0],
                  "largest": found[1], "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "error": error}))
"""


def timed_dups(folder: str, threshold: int, timeout: float, pythonpath: str | None = None) -> dict:
    """``find_dups`` of ``folder`` in a fresh Python process (its own peak RSS): wall and CPU seconds,
    clusters, the largest's size, peak RSS; or how it ended (an error, the ``timeout``). ``pythonpath``:
    the checkout whose ``wds_tools`` that process imports (default: the one it finds)."""
    import json
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TIMED, folder, str(threshold)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=tempfile.gettempdir() if pythonpath else None,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout:.0f} s"}
    if done.returncode:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def copies_cost(args: argparse.Namespace) -> None:
    """One JPEG under N keys: ``find_dups`` of an index whose N samples hold the hashes and the pixels (one
    ``.npy`` member per shard, one ``npy_xxh3``) of one stored image (a lesion photo as ``convert`` stores it
    at 224 px), plus 1,000 random hashes, each N of ``--copies`` in its own process; the time and memory
    should follow the distinct hashes and pixels, not N."""

    from wds_tools.format.phash import phash_batch as hash_images

    pixels = decode_image(jpeg_bytes(lesion_photo(320, 320, 1, 7)), 224).pixels
    one = hash_images([pixels])[0]
    rng = np.random.default_rng(3)
    others = rng.integers(0, 2**63, (1000, WINDOWS), dtype=np.uint64)
    print(f"one JPEG under N keys (+1,000 random others), find_dups at threshold {DEFAULT_THRESHOLD}, own process:\n")
    print("| copies | wall s | CPU s | peak RSS MiB | clusters | largest |")
    print("|---|---|---|---|---|---|")
    for n in args.copies:
        with tempfile.TemporaryDirectory() as tmp:
            write_hash_index(
                tmp,
                np.concatenate([np.tile(one, (n, 1)), others]),
                with_pixels=np.arange(n),
                pixels_of=lambda _: pixels,
            )
            r = timed_dups(tmp, DEFAULT_THRESHOLD, args.timeout)
        if r.get("error"):
            print(
                f"| {n:,} | {r.get('wall', float('nan')):.1f} | - | {r.get('rss_mib', float('nan')):.0f} | {r['error']} | |"
            )
        else:
            print(
                f"| {n:,} | {r['wall']:.2f} | {r['cpu']:.2f} | {r['rss_mib']:.0f} | {r['clusters']:,} | {r['largest']:,} |"
            )
    print()


def coefficient_noise(args: argparse.Namespace) -> None:
    """How far a copy moves the whole image's 63 low DCT coefficients (``phash.whole_dct``, grey levels):
    |copy - original| over the quality set's originals (stored at ``--size``) and copies made by one
    recompression at JPEG quality 60, 75 and 90, a rescale by 0.5 and by 2 and a blur (radius 1), each
    stored as ``convert`` stores it: median, 90th and 99th percentile. A coefficient below these is at
    the mercy of a copy: FIRM_LEVEL (docs/FORMAT.md, Too flat to hash). (A brightness change scales
    every coefficient alike: it moves large ones most and flips no sign, so it is left out.)"""
    from wds_tools.format.phash import FIRM_LEVEL, whole_dct

    originals = photo_windows(most=args.windows)[0] + [lesion_photo(320, 320, 1, 1000 + i) for i in range(args.synth)]
    copies = {
        "JPEG q60": lambda im: Image.open(io.BytesIO(jpeg_bytes(im, 60))).convert("RGB"),
        "JPEG q75": lambda im: Image.open(io.BytesIO(jpeg_bytes(im, 75))).convert("RGB"),
        "JPEG q90": lambda im: Image.open(io.BytesIO(jpeg_bytes(im, 90))).convert("RGB"),
        "rescale 0.5": lambda im: im.resize((im.width // 2, im.height // 2), Image.Resampling.BICUBIC),
        "rescale 2": lambda im: im.resize((im.width * 2, im.height * 2), Image.Resampling.BICUBIC),
        "blur 1": lambda im: im.filter(ImageFilter.GaussianBlur(1.0)),
    }

    def stored(im: Image.Image) -> np.ndarray:
        return decode_image(jpeg_bytes(im.convert("RGB"), 92), args.size).pixels

    base = whole_dct([stored(im) for im in originals]).reshape(len(originals), -1)[:, 1:]
    print(
        f"how far a copy moves the whole image's 63 low DCT coefficients (grey levels; {len(originals)} originals "
        f"at {args.size} px; firm: >= {FIRM_LEVEL}):\n"
    )
    print("| copy | median | 90th percentile | 99th percentile |")
    print("|---|---|---|---|")
    for name, make in copies.items():
        moved = whole_dct([stored(make(im)) for im in originals]).reshape(len(originals), -1)[:, 1:]
        q = np.percentile(np.abs(moved - base), [50, 90, 99])
        print(f"| {name} | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} |")
    print()


def contrast_sweep(args: argparse.Namespace) -> None:
    """The quality set with every original squeezed to a fraction of its contrast (``--contrast``): how
    many images are too flat to hash, and recall and false pairs at the default threshold with the flat
    rule and without it (a flat image's bits compared as they are), both with colour agreement (what
    ``dups`` finds), and recall by the hashes alone with the rule."""
    print(f"low contrast: the quality set squeezed, threshold {DEFAULT_THRESHOLD}:\n")
    print(
        "| contrast | too flat | recall | false pairs | recall, no flat rule | false pairs, no flat rule "
        "| recall, hashes alone |"
    )
    print("|---|---|---|---|---|---|---|")
    for c in args.contrast:
        pixels, ids, kinds = build_set(args.synth, args.size, args.windows, args.seed, contrast=c)
        hashes = phash_batch(pixels)
        layouts = colour_layout(pixels)
        cells = []
        for rule in (True, False):
            row = curve(pair_distances(hashes, True, rule, layouts), ids, kinds, [DEFAULT_THRESHOLD])[0]
            cells += [f"{row['recall']:.3f}", f"{row['fp']:,}"]
        cells.append(f"{curve(pair_distances(hashes, True), ids, kinds, [DEFAULT_THRESHOLD])[0]['recall']:.3f}")
        print(f"| {c} | {int(is_flat(hashes).sum()):,} of {len(hashes):,} | " + " | ".join(cells) + " |")
    print()


def flat_set(args: argparse.Namespace) -> None:
    """``--flat N`` pictures of each ``synth.flat_picture`` kind, all different (JPEG q90, stored at
    ``--size``): the pairs and clusters ``find_pairs`` made among them before the flat rule (the flag
    cleared, the hashes alone) and with it and colour agreement (what ``dups`` finds), at the default
    threshold and at 8."""
    print(f"pictures with little or no detail ({args.flat:,} of each kind, all different) at {args.size} px:\n")
    print(
        "| kind | too flat | threshold | pairs, no flat rule | clusters (samples), no flat rule | pairs passing the "
        "check | clusters |"
    )
    print("|---|---|---|---|---|---|---|")
    from wds_tools.similar.match import looks

    for kind in FLAT_KINDS:
        pixels = [decode_image(jpeg_bytes(flat_picture(kind, k), 90), args.size).pixels for k in range(args.flat)]
        hashes = phash_batch(pixels)
        layouts, lk = colour_layout(pixels), looks(pixels)
        bare = hashes.copy()
        bare[:, 0] &= np.uint64((1 << 63) - 1)
        for t in (DEFAULT_THRESHOLD, 8):
            i, j, _ = find_pairs(bare, t)
            comps = clusters_of(len(pixels), i, j)
            cells = [f"{len(i):,}", f"{len(comps):,} ({sum(len(c) for c in comps):,})"]
            found = near_clusters(hashes, t, looks=lambda _side, r, la=layouts, lo=lk: (la[r], lo[r]))
            cells += [f"{found.passed:,} of {found.candidates:,} checked", f"{len(found.clusters):,}"]
            print(f"| {kind} | {int(is_flat(hashes).sum()):,} | {t} | " + " | ".join(cells) + " |")
    print()


def threshold_cost(args: argparse.Namespace) -> None:
    """The candidate search of ``near_clusters`` (``near._candidates``) on ``--threshold-scale`` samples of seven
    random hashes (a chain of 1% planted copies, each 2 bits from a window of the next) at each of
    ``--thresholds``: seconds, CPU seconds, peak RSS of this process so far, candidate pairs; a threshold above
    MAX_THRESHOLD (or ``--max-threshold``) is refused at once. The search alone: random hashes have no pixels
    to check."""
    from wds_tools.similar.near import HASH_NEAREST, _candidates, _distinct, check_threshold

    rng = np.random.default_rng(1)
    n = args.threshold_scale
    hashes = rng.integers(0, 2**63, (n, WINDOWS), dtype=np.uint64)
    src = rng.choice(n, n // 100, replace=False)
    hashes[np.roll(src, 1), 0] = hashes[src, 1] ^ np.uint64(5)  # a chain of copies of a window, 2 bits apart
    print(f"search cost by threshold, {n:,} samples of random hashes + 1% planted copies:\n")
    print("| threshold | wall s | CPU s | peak RSS MiB (process so far) | candidate pairs |")
    print("|---|---|---|---|---|")
    for t in args.thresholds:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            check_threshold(t)
            p_, _, _ = _candidates(_distinct(hashes, keep_flat=True), t, None, HASH_NEAREST, lambda: None)
            what = f"{len(p_):,}"
        except Exception as e:  # the refusal above MAX_THRESHOLD
            what = f"{type(e).__name__}: {e}"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"| {t} | {time.perf_counter() - t0:.2f} | {time.process_time() - c0:.2f} | {rss:.0f} | {what} |")
    print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--synth", type=int, default=150, help="lesion photos among the originals")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--windows", type=int, default=12, help="most windows taken from one photo")
    p.add_argument("--seed", type=int, default=0, help="seed of the copies' random parameters")
    p.add_argument("--scale", type=int, default=1_000_000, help="hashes for the cost run (0: skip)")
    p.add_argument("--all", action="store_true", help="print thresholds 0..12, then 14..20 in steps of 2")
    p.add_argument("--no-quality", action="store_true")
    p.add_argument("--index-scale", type=int, default=0, help="samples of an index to run find_dups on (0: skip)")
    p.add_argument(
        "--keep-index",
        metavar="DIR",
        help="with --index-scale: write the index to DIR and stop, to time `wds-tools dups DIR` in its own process",
    )
    p.add_argument("--hash-images", type=int, default=12, help="photos per source size for the hash cost (0: skip)")
    p.add_argument(
        "--copies",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[],
        help="one JPEG under N keys: time find_dups for each N, e.g. 5000,50000 (each in its own process)",
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds before a --copies run is stopped")
    p.add_argument(
        "--against",
        metavar="DIR",
        help="another checkout (e.g. a git worktree of main) to compare with: phash's CPU time, and with "
        "--index-scale find_dups in its own process, alternating",
    )
    p.add_argument("--rounds", type=int, default=2, help="rounds of each code for --index-scale with --against")
    p.add_argument(
        "--contrast",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[],
        help="the quality set squeezed to these fractions of its contrast, e.g. 0.1,0.05,0.025,0.0125",
    )
    p.add_argument("--flat", type=int, default=0, help="pictures of each flat kind (synth.flat_picture) to search")
    p.add_argument(
        "--coefficient-noise", action="store_true", help="how far copies move the low DCT coefficients (FIRM_LEVEL)"
    )
    p.add_argument("--threshold-scale", type=int, default=0, help="samples for the cost by threshold (0: skip)")
    p.add_argument(
        "--thresholds",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[DEFAULT_THRESHOLD, MAX_THRESHOLD, MAX_THRESHOLD + 1, 20],
        help="thresholds for --threshold-scale",
    )
    p.add_argument(
        "--max-threshold",
        type=int,
        default=None,
        help="serve thresholds up to this in --threshold-scale (a comparison: dups refuses above MAX_THRESHOLD)",
    )
    p.add_argument(
        "--block-factors",
        type=lambda text: tuple(int(x) for x in text.split(",")),
        default=None,
        help="try other grey blocks than format.phash.BLOCK_FACTORS, e.g. 2 (a comparison: not the format's hash)",
    )
    args = p.parse_args()
    if args.max_threshold is not None:
        import wds_tools.similar.near as search

        search.MAX_THRESHOLD = args.max_threshold
        print(f"thresholds served up to {args.max_threshold} (not what dups allows: {MAX_THRESHOLD})\n")
    if args.block_factors is not None:
        import wds_tools.format.phash as recipe

        recipe.BLOCK_FACTORS = args.block_factors
        print(f"grey blocks: the first of {args.block_factors} that fits (not the format's recipe)\n")
    if args.against and not args.index_scale:
        hash_against(args)
    if args.hash_images:
        hash_cost(args)
        convert_share(args)
    if not args.no_quality:
        quality(args)
    if args.scale:
        cost(args)
    if args.index_scale:
        command_cost(args)
    if args.copies:
        copies_cost(args)
    if args.coefficient_noise:
        coefficient_noise(args)
    if args.contrast:
        contrast_sweep(args)
    if args.flat:
        flat_set(args)
    if args.threshold_scale:
        threshold_cost(args)


if __name__ == "__main__":
    main()
