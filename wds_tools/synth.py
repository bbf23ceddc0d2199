"""Synthetic, photo-like corpora for the demo, the tests and the benchmarks."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageFilter

__all__ = [
    "photo_like",
    "lesion_photo",
    "flat_picture",
    "FLAT_KINDS",
    "low_detail_picture",
    "LOW_DETAIL_KINDS",
    "skin_lesion_photo",
    "SKIN_FAMILIES",
    "jpeg_bytes",
    "write_corpus",
]

# Per class index: (RGB of the lesion, irregularity of its border 0..1, radius as a fraction of the short side)
_LESIONS = (((196, 120, 108), 0.05, 0.18), ((46, 24, 20), 0.45, 0.30), ((122, 72, 42), 0.10, 0.24))


def photo_like(width: int, height: int, seed: int) -> Image.Image:
    """A smooth colour field with blobs and sensor-like noise: compresses like a photo."""
    rng = np.random.default_rng(seed)
    gw, gh = max(2, width // 64), max(2, height // 64)
    coarse = rng.integers(0, 256, (gh, gw, 3), dtype=np.uint8)
    im = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    arr = np.asarray(im).astype(np.int16)
    arr += rng.integers(-10, 11, (height, width, 1), dtype=np.int16)  # luminance noise
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def lesion_photo(width: int, height: int, label: int, seed: int) -> Image.Image:
    """``photo_like`` with a lesion drawn on it whose colour, size and border say its class
    (``label`` modulo 3), so that a model can learn the demo corpus's labels from its pixels."""
    from PIL import ImageDraw

    rng = np.random.default_rng([seed, 17])
    im = photo_like(width, height, seed)
    rgb, rough, radius = _LESIONS[label % len(_LESIONS)]
    r = radius * min(width, height) * rng.uniform(0.8, 1.2)
    cx = width / 2 + rng.uniform(-0.15, 0.15) * width
    cy = height / 2 + rng.uniform(-0.15, 0.15) * height
    angles = np.linspace(0, 2 * np.pi, 48, endpoint=False)
    radii = r * (1 + rough * rng.uniform(-1, 1, len(angles)))
    points = [(float(cx + a * np.cos(t)), float(cy + a * np.sin(t))) for a, t in zip(radii, angles)]
    colour = tuple(int(np.clip(c + rng.integers(-20, 21), 0, 255)) for c in rgb)
    ImageDraw.Draw(im).polygon(points, fill=colour)
    return im


FLAT_KINDS = ("solid", "skin", "ramp")
"""The kinds of ``flat_picture``."""


def flat_picture(kind: str, k: int, side: int = 224) -> Image.Image:
    """Picture ``k`` of a kind with little or no detail, all different, that a perceptual hash must not call
    duplicates: ``"solid"``, a frame of one colour; ``"skin"``, a skin-coloured patch lit from its centre (a
    radial shading of 2 to 30 levels, no texture); ``"ramp"``, two colours blended left to right (odd ``k``)
    or top to bottom."""
    rng = np.random.default_rng([k, FLAT_KINDS.index(kind) + 1])
    if kind == "solid":
        return Image.new("RGB", (side, side), tuple(int(x) for x in rng.integers(0, 256, 3)))
    if kind == "skin":
        base = np.array([215, 160, 135]) + rng.integers(-25, 26, 3)
        y, x = np.mgrid[0:side, 0:side] / (side - 1) - 0.5
        arr = base - rng.uniform(2, 30) * (x**2 + y**2)[..., None]
        return Image.fromarray(np.clip(np.round(arr), 0, 255).astype(np.uint8))
    a, b = rng.integers(0, 256, (2, 3))
    t = np.linspace(0, 1, side)[:, None, None]
    arr = np.broadcast_to(a + (b - a) * t, (side, side, 3))
    return Image.fromarray(np.round(arr.transpose(1, 0, 2) if k % 2 else arr).astype(np.uint8))


LOW_DETAIL_KINDS = ("grid", "blobs", "noise", "vignette")
"""The kinds of ``low_detail_picture``."""


def low_detail_picture(kind: str, k: int, size: tuple[int, int] | None = None) -> Image.Image:
    """Picture ``k`` of a random family with detail at a few points only, all different, that a perceptual
    hash must not call duplicates (docs/FORMAT.md, Too flat to hash): ``"grid"``, a 2x2 or 3x3 grid of random
    colours interpolated bilinearly or bicubically; ``"blobs"``, two to five Gaussian blobs of random colour,
    place and width (8-35% of the short side) on a random colour; ``"noise"``, random colours on a 4x4 to 8x8
    grid interpolated bicubically; ``"vignette"``, a linear gradient between two random colours at a random
    angle, darkened towards the corners (by 20-70% there). ``size``: (width, height), by default random in 224..480."""
    if kind not in LOW_DETAIL_KINDS:
        raise ValueError(f"low_detail_picture: unknown kind {kind!r} (one of {', '.join(LOW_DETAIL_KINDS)})")
    rng = np.random.default_rng([k, LOW_DETAIL_KINDS.index(kind) + 11])
    w, h = size or (int(rng.integers(224, 481)), int(rng.integers(224, 481)))
    if kind in ("grid", "noise"):
        n = int(rng.integers(2, 4)) if kind == "grid" else int(rng.integers(4, 9))
        how = Image.Resampling.BICUBIC if kind == "noise" or rng.integers(2) else Image.Resampling.BILINEAR
        return Image.fromarray(rng.integers(0, 256, (n, n, 3), dtype=np.uint8)).resize((w, h), how)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    if kind == "blobs":
        arr = np.broadcast_to(rng.uniform(0, 255, 3), (h, w, 3))
        for _ in range(int(rng.integers(2, 6))):
            cx, cy, s = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.08, 0.35) * min(w, h)
            a = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * s * s))[..., None]
            arr = arr * (1 - a) + rng.uniform(0, 255, 3) * a
    else:  # vignette
        angle = rng.uniform(0, 2 * np.pi)
        p = x * np.cos(angle) + y * np.sin(angle)
        t = ((p - p.min()) / (p.max() - p.min()))[..., None]
        a, b = rng.uniform(0, 255, (2, 3))
        r2 = ((x - w / 2) / (w / 2)) ** 2 + ((y - h / 2) / (h / 2)) ** 2
        arr = (a + (b - a) * t) * (1 - rng.uniform(0.2, 0.7) * r2 / 2)[..., None]
    return Image.fromarray(np.clip(np.round(arr), 0, 255).astype(np.uint8))


SKIN_FAMILIES = ("smooth", "textured", "dermoscopic", "hairs", "grey")
"""The families of ``skin_lesion_photo``."""
_SKIN_TONES = np.array(
    [(236, 200, 180), (222, 180, 155), (200, 150, 120), (170, 120, 90), (130, 88, 62), (95, 62, 45)], np.float32
)
_PIGMENT_TINTS = np.array([(1.0, 0.88, 0.8), (1.0, 0.85, 0.75), (0.92, 0.9, 1.05), (1.05, 0.85, 0.88)], np.float32)


def _upsampled(a: np.ndarray, w: int, h: int, how: Image.Resampling = Image.Resampling.BICUBIC) -> np.ndarray:
    return np.asarray(Image.fromarray(np.asarray(a, np.float32), "F").resize((w, h), how), np.float32)


def _field(rng: np.random.Generator, h: int, w: int, cells: int) -> np.ndarray:
    """Random values (about N(0, 1)) on a grid about ``cells`` wide, upsampled bicubically to h x w."""
    return _upsampled(rng.standard_normal((max(2, round(cells * h / w)), cells)), w, h)


def _blurred(a: np.ndarray, radius: float) -> np.ndarray:
    """Values 0..1 blurred by Pillow's Gaussian filter (taken as 8-bit grey)."""
    im = Image.fromarray(np.clip(np.round(a * 255), 0, 255).astype(np.uint8))
    return np.asarray(im.filter(ImageFilter.GaussianBlur(radius)), np.float32) / 255


def _lesion_mask(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A soft lesion mask 0..1 [h, w] near the centre: two to four overlapping ellipses, or a radius varying with
    the angle by a few low harmonics (round), many small ones (irregular) or strong ones (lobed); a satellite
    spot one time in three; a border blurred by 1-5% of the short side."""
    s = min(h, w)
    y = np.arange(h, dtype=np.float32)[:, None]
    x = np.arange(w, dtype=np.float32)[None, :]
    cx, cy = w / 2 + rng.uniform(-0.08, 0.08) * w, h / 2 + rng.uniform(-0.08, 0.08) * h
    shape = int(rng.integers(4))
    size = rng.uniform(0.10, 0.30) * s
    if shape == 0:
        m = np.zeros((h, w), bool)
        for _ in range(int(rng.integers(2, 5))):
            ex, ey = cx + rng.normal(0, 0.35) * size, cy + rng.normal(0, 0.35) * size
            a, b = size * rng.uniform(0.45, 1.0), size * rng.uniform(0.3, 0.8)
            t = rng.uniform(0, np.pi)
            c, si = np.float32(np.cos(t)), np.float32(np.sin(t))
            u = ((x - ex) * c + (y - ey) * si) / a
            v = ((y - ey) * c - (x - ex) * si) / b
            m |= u * u + v * v <= 1
    else:
        theta = np.arctan2(y - cy, x - cx)
        radius = np.ones_like(theta)
        for k in range(2, 2 + (3, 8, 5)[shape - 1]):
            amp = rng.uniform(0, (0.25, 0.12, 0.4)[shape - 1])
            radius += np.float32(amp / (1 + 0.2 * k)) * np.cos(k * theta + np.float32(rng.uniform(0, 2 * np.pi)))
        m = np.hypot(x - cx, y - cy) <= size * np.clip(radius, 0.3, 2)
    if rng.uniform() < 0.3:
        ex, ey = cx + rng.choice([-1, 1]) * rng.uniform(1.0, 1.6) * size, cy + rng.uniform(-1, 1) * size
        m |= (x - ex) ** 2 + (y - ey) ** 2 <= (size * rng.uniform(0.1, 0.25)) ** 2
    return _blurred(m.astype(np.float32), rng.uniform(0.01, 0.05) * s)


def skin_lesion_photo(family: str, k: int, width: int = 600, height: int = 450) -> Image.Image:
    """Photo ``k`` of a family of skin lesion photos (HAM10000 and ISIC are 600x450), all different, made here so
    that a near-duplicate check is measured on the kind of picture dermatology sets hold: skin of one of six
    tones with low-frequency shading (a ramp at a random angle, a faint uneven light, patches of redness) and one
    darker lesion near the centre (``_lesion_mask``) of uneven pigment, brown, dark brown, blue-grey or red,
    blurred as a camera would. Families: ``"smooth"``, no texture; ``"textured"``, skin furrows and grain, a
    pigment network in the lesion; ``"dermoscopic"``, textured and seen through a dermatoscope (a round field,
    dark outside and shaded towards its rim), hairs on half of them; ``"hairs"``, smooth with 4 to 30 dark
    hairs; ``"grey"``, smooth, in grey."""
    from PIL import ImageDraw

    if family not in SKIN_FAMILIES:
        raise ValueError(f"skin_lesion_photo: unknown family {family!r} (one of {', '.join(SKIN_FAMILIES)})")
    rng = np.random.default_rng([k, SKIN_FAMILIES.index(family) + 101])
    h, w = height, width
    lh, lw = max(2, h // 4), max(2, w // 4)  # the low-frequency parts, at a quarter of the side
    tone = _SKIN_TONES[rng.integers(len(_SKIN_TONES))] + rng.normal(0, 8, 3).astype(np.float32)
    yy = np.arange(lh, dtype=np.float32)[:, None] / lh - 0.5
    xx = np.arange(lw, dtype=np.float32)[None, :] / lw - 0.5
    angle = rng.uniform(0, 2 * np.pi)
    ramp = xx * np.cos(angle) + yy * np.sin(angle) * lh / lw
    light = 1 + rng.uniform(0.05, 0.25) * ramp + rng.uniform(0.01, 0.05) * _field(rng, lh, lw, 4)
    red = rng.uniform(0, 12) * np.clip(_field(rng, lh, lw, 3), 0, None)  # redness: less green and blue
    low = np.stack([tone[0] * light, tone[1] * light - red, tone[2] * light - 0.5 * red], axis=-1)
    pigment = tone * rng.uniform(0.3, 0.75) * _PIGMENT_TINTS[rng.choice(len(_PIGMENT_TINTS), p=[0.45, 0.35, 0.1, 0.1])]
    uneven = 1 + rng.uniform(0.05, 0.3) * _field(rng, lh, lw, 6)
    img = np.stack([_upsampled(low[..., c], w, h) for c in range(3)], axis=-1)
    lesion = np.stack([_upsampled(pigment[c] * uneven, w, h) for c in range(3)], axis=-1)
    textured = family in ("textured", "dermoscopic")
    if textured:
        grain = (_blurred(0.5 + 0.12 * rng.standard_normal((h, w)).astype(np.float32), 1.2) - 0.5) / 0.05
        lines = _blurred((rng.uniform(0, 1, (max(2, h // 6), max(2, w // 6))) < 0.3).astype(np.float32), 0.8)
        furrows = _upsampled(lines, w, h, Image.Resampling.BILINEAR) - 0.3
        img += (rng.uniform(4, 10) * grain + rng.uniform(10, 25) * furrows)[..., None]
        holes = _blurred((rng.uniform(0, 1, (max(2, h // 5), max(2, w // 5))) < 0.5).astype(np.float32), 0.7)
        lesion *= (1 - rng.uniform(0.15, 0.35) * _upsampled(holes, w, h, Image.Resampling.BILINEAR))[..., None]
    mask = _upsampled(_lesion_mask(rng, max(2, h // 2), max(2, w // 2)), w, h, Image.Resampling.BILINEAR)
    alpha = (rng.uniform(0.65, 0.95) * mask)[..., None]
    im = Image.fromarray(np.clip(img * (1 - alpha) + lesion * alpha, 0, 255).astype(np.uint8))
    if family == "hairs" or (family == "dermoscopic" and rng.uniform() < 0.5):
        draw = ImageDraw.Draw(im)
        colour = tuple(int(c) for c in rng.integers(10, 60, 3))
        for _ in range(int(rng.integers(4, 30))):
            p0 = rng.uniform(0, 1, 2) * (w, h)
            d = rng.normal(0, 1, 2)
            d /= np.linalg.norm(d)
            length = rng.uniform(0.2, 0.8) * w
            bend = rng.normal(0, 0.15, 2) * length
            points = [tuple((p0 + d * length * t + bend * 4 * t * (1 - t)).tolist()) for t in np.linspace(0, 1, 12)]
            draw.line(points, fill=colour, width=int(rng.integers(1, 4)))
    if family == "dermoscopic":
        ry = np.arange(h, dtype=np.float32)[:, None] - h / 2
        rx = np.arange(w, dtype=np.float32)[None, :] - w / 2 - rng.uniform(-0.03, 0.03) * w
        r = np.hypot(rx, ry) / np.float32(0.5 * np.hypot(w, h) * rng.uniform(0.65, 0.9))
        fall = np.clip(1 - 0.35 * r * r, 0, 1) / (1 + np.exp(np.minimum((r - 1) * 40, 50)))
        im = Image.fromarray(np.clip(np.asarray(im, np.float32) * fall[..., None], 0, 255).astype(np.uint8))
    im = im.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 1.5)))
    return im.convert("L").convert("RGB") if family == "grey" else im


def jpeg_bytes(im: Image.Image, quality: int = 92, **kw: Any) -> bytes:
    """``im`` encoded as JPEG bytes (``kw``: more of Pillow's JPEG save options)."""
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def write_corpus(
    out: str | os.PathLike,
    *,
    count: int,
    classes: tuple[str, ...] = ("benign", "malignant", "nevus"),
    sizes: tuple[tuple[int, int], ...] = ((640, 480), (480, 640), (800, 600), (1024, 768)),
    bad: bool = True,
    seed: int = 0,
    quality: int = 92,
) -> Path:
    """Write ``count`` JPEGs under ``out/images/<class>/`` and ``out/manifest.csv``; each image shows
    a lesion whose look depends on its class (``lesion_photo``).

    With ``bad``, four extra rows point at a missing, an empty, a truncated and a non-image file.
    Returns the manifest path.
    """
    out = Path(out)
    rows = []
    for i in range(count):
        label = classes[i % len(classes)]
        w, h = sizes[i % len(sizes)]
        rel = f"images/{label}/img_{i:06d}.jpg"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        data = jpeg_bytes(
            lesion_photo(w, h, i % len(classes), seed * 1_000_003 + i), quality=quality, progressive=(i % 7 == 3)
        )
        (out / rel).write_bytes(data)
        rows.append((f"img_{i:06d}", rel, label))
    if bad:
        (out / "images/bad").mkdir(parents=True, exist_ok=True)
        (out / "images/bad/empty.jpg").write_bytes(b"")
        good = jpeg_bytes(photo_like(640, 480, seed + 99))
        (out / "images/bad/truncated.jpg").write_bytes(good[: len(good) // 3])
        (out / "images/bad/not_an_image.jpg").write_text("this is a text file, not a JPEG\n")
        rows += [
            ("bad_missing", "images/bad/missing.jpg", classes[0]),
            ("bad_empty", "images/bad/empty.jpg", classes[0]),
            ("bad_truncated", "images/bad/truncated.jpg", classes[1 % len(classes)]),
            ("bad_not_an_image", "images/bad/not_an_image.jpg", classes[2 % len(classes)]),
        ]
    manifest = out / "manifest.csv"
    with open(manifest, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "path", "label"])
        writer.writerows(rows)
    return manifest
