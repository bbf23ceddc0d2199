"""An independent reference of the per-sample augmentation, in numpy, for the tests only.

Written from the definitions, not from ``training_adapter.augment``'s code: it imports nothing
from ``training_adapter`` and takes a sample's parameters as a plain row in ``PARAM_ORDER``.

- Resampling is the antialiased bilinear (triangle) filter PIL's ``Image.resize(BILINEAR)``
  defines and torch's ``interpolate(antialias=True)`` follows: output pixel ``i`` of ``n_out`` is
  centred at input coordinate ``(i + 0.5) * n_in / n_out`` (pixel centres at ``j + 0.5``), and the
  triangle's radius is one input pixel when enlarging and ``n_in / n_out`` pixels when shrinking,
  weights normalised over the pixels inside the image (so the edge pixel is repeated). For an
  enlargement this is plain half-pixel bilinear interpolation clamped to the edge.
- Flips and quarter turns are numpy's (``np.rot90`` turns from the first axis towards the second,
  as ``torch.rot90(dims=(0, 1))``: counter-clockwise on screen).
- The colour jitter is torchvision's ``adjust_brightness``, ``adjust_contrast`` and
  ``adjust_saturation`` in that order (brightness: blend with black, ``b * x``; contrast: blend with
  the image's mean grey, ``c * x + (1 - c) * mean(grey)``; saturation: blend with the pixel's grey,
  ``s * x + (1 - s) * grey``), grey being ITU-R 601-2 luma (0.299, 0.587, 0.114, PIL's ``L``;
  torchvision writes 0.2989). ``jitter(..., clamp_each=True)`` clamps to 0..255 after every step as
  torchvision does; ``clamp_each=False`` clamps once at the end, which is what augment documents
  ("fused into one per-pixel linear map").
- The small affine (augment's documented "rotation, translation, scale about the centre", positive
  angles turning clockwise on screen, translation as a fraction of the side) is applied by inverse
  mapping every output pixel centre to a source coordinate and sampling it bilinearly, coordinates
  clamped to the source image (``grid_sample(padding_mode="border")``).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

__all__ = [
    "PARAM_ORDER",
    "GREY",
    "resize_weights",
    "resize",
    "jitter",
    "geometry_resize",
    "geometry_sampled",
    "augment_reference",
    "uniforms",
    "crop_uniforms",
    "crop_box",
    "params_row",
]

# the row layout of a sample's parameters (augment.PARAM_NAMES, restated here as the documented contract)
PARAM_ORDER = (
    "top",
    "left",
    "height",
    "width",
    "hflip",
    "vflip",
    "rot90",
    "angle",
    "tx",
    "ty",
    "scale",
    "brightness",
    "contrast",
    "saturation",
)
_I = {n: i for i, n in enumerate(PARAM_ORDER)}
GREY = np.array([0.299, 0.587, 0.114])


def uniforms(seed: int, epoch: int, key: str) -> np.ndarray:
    """The 16 uniforms augment documents: BLAKE2b-512 of "seed NUL epoch NUL key", as 16 little-endian u32 / 2^32."""
    h = hashlib.blake2b(f"{seed}\x00{epoch}\x00{key}".encode(), digest_size=64).digest()
    return np.array([int.from_bytes(h[4 * i : 4 * i + 4], "little") / 2**32 for i in range(16)])


def crop_uniforms(seed: int, epoch: int, key: str) -> np.ndarray:
    """The 18 uniforms of the crop's attempts 2 to 10: SHAKE-256 of "seed NUL epoch NUL key NUL crop", 72 bytes
    as 18 little-endian u32 / 2^32."""
    h = hashlib.shake_256(f"{seed}\x00{epoch}\x00{key}\x00crop".encode()).digest(72)
    return np.array([int.from_bytes(h[4 * i : 4 * i + 4], "little") / 2**32 for i in range(18)])


def crop_box(
    S: int, scale: tuple[float, float], ratio: tuple[float, float], seed: int, epoch: int, key: str
) -> tuple[int, int, int, int]:
    """(top, left, h, w) as torchvision's RandomResizedCrop.get_params draws it on an S x S image (its source,
    restated), its uniforms taken as augment documents: attempt 1's area and log-ratio from u0, u1, attempt
    k >= 2's from crop_uniforms[2k - 4], [2k - 3]; the position from u2, u3 (randint(0, n) = int(u * n))."""
    u, more = uniforms(seed, epoch, key), crop_uniforms(seed, epoch, key)
    draws = [(u[0], u[1])] + [(more[2 * a], more[2 * a + 1]) for a in range(9)]
    area = S * S
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for ua, ur in draws:
        target_area = area * (scale[0] + (scale[1] - scale[0]) * ua)
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * ur)
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= S and 0 < h <= S:
            return int(u[2] * (S - h + 1)), int(u[3] * (S - w + 1)), h, w
    in_ratio = 1.0  # fallback: the centre crop
    if in_ratio < min(ratio):
        w = S
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = S
        w = int(round(h * max(ratio)))
    else:
        w = h = S
    return (S - h) // 2, (S - w) // 2, h, w


def params_row(cfg, seed: int, epoch: int, key: str, S: int) -> np.ndarray:
    """A sample's parameter row (PARAM_ORDER) as augment documents it, from an AugmentConfig's plain fields:
    the crop (crop_box), then u4 < hflip, u5 < vflip, int(4 u6) quarter turns, the affine when u7 < affine_p
    (angle, tx, ty from u8..u10 symmetric, scale from u11), the jitter factors 1 + x (2 u - 1) from u12..u14."""
    u = uniforms(seed, epoch, key)
    p = np.zeros(len(PARAM_ORDER))
    p[0:4] = crop_box(S, cfg.crop_scale, cfg.crop_ratio, seed, epoch, key) if cfg.crop else (0, 0, S, S)
    p[_I["hflip"]], p[_I["vflip"]] = u[4] < cfg.hflip, u[5] < cfg.vflip
    p[_I["rot90"]] = int(u[6] * 4) if cfg.rot90 else 0
    p[_I["scale"]] = 1.0
    if u[7] < cfg.affine_p:
        p[_I["angle"]] = cfg.affine_degrees * (2 * u[8] - 1)
        p[_I["tx"]] = cfg.affine_translate * (2 * u[9] - 1)
        p[_I["ty"]] = cfg.affine_translate * (2 * u[10] - 1)
        p[_I["scale"]] = cfg.affine_scale[0] + (cfg.affine_scale[1] - cfg.affine_scale[0]) * u[11]
    for name, i in (("brightness", 12), ("contrast", 13), ("saturation", 14)):
        p[_I[name]] = 1 + getattr(cfg, name) * (2 * u[i] - 1)
    return p


def resize_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of the antialiased bilinear (triangle) filter; each row sums to 1."""
    scale = n_in / n_out
    radius = max(scale, 1.0)
    centres = (np.arange(n_out) + 0.5) * scale
    w = np.maximum(0.0, 1.0 - np.abs((np.arange(n_in)[None, :] + 0.5 - centres[:, None]) / radius))
    return w / w.sum(1, keepdims=True)


def resize(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Float [h, w, C] resized to [out_h, out_w, C] with ``resize_weights`` on each axis."""
    rows = resize_weights(img.shape[0], out_h)
    cols = resize_weights(img.shape[1], out_w)
    return np.einsum("ih,hwc,jw->ijc", rows, img.astype(np.float64), cols)


def jitter(img: np.ndarray, b: float, c: float, s: float, *, clamp_each: bool = False) -> np.ndarray:
    """Brightness, contrast, saturation of a float [H, W, 3] image in 0..255 (torchvision's
    definitions); clamped to 0..255 after each step, or only at the end."""
    clamp = (lambda x: np.clip(x, 0, 255)) if clamp_each else (lambda x: x)
    x = img.astype(np.float64)
    x = clamp(b * x)
    x = clamp(c * x + (1 - c) * float((x @ GREY).mean()))
    x = clamp(s * x + (1 - s) * (x @ GREY)[..., None])
    return np.clip(x, 0, 255)


def _flips_turns(img: np.ndarray, p: np.ndarray) -> np.ndarray:
    if p[_I["hflip"]]:
        img = img[:, ::-1]
    if p[_I["vflip"]]:
        img = img[::-1]
    return np.rot90(img, int(p[_I["rot90"]]) % 4, axes=(0, 1))


def geometry_resize(src: np.ndarray, p: np.ndarray, out: int) -> np.ndarray:
    """Crop, resize to [out, out] (the filter stays inside the crop), flips, quarter turns: float [out, out, 3]."""
    top, left, h, w = (int(v) for v in p[0:4])
    crop = src[top : top + h, left : left + w]
    return _flips_turns(resize(crop, out, out), p)


def geometry_sampled(src: np.ndarray, p: np.ndarray, out: int) -> np.ndarray:
    """Crop + resize, affine, flips, quarter turns by sampling: every output pixel centre is taken back
    through each step to a source coordinate, read bilinearly (clamped to the source image)."""
    S = src.shape[0]
    # output pixel centres in [-1, 1] (x right, y down)
    c = (np.arange(out) + 0.5) / out * 2 - 1
    y, x = np.meshgrid(c, c, indexing="ij")
    # quarter turns: np.rot90 k=1 puts input (x, y) = (-y, x) at output (x, y); undo k of them
    for _ in range(int(p[_I["rot90"]]) % 4):
        x, y = -y, x
    if p[_I["vflip"]]:
        y = -y
    if p[_I["hflip"]]:
        x = -x
    # the affine maps a point q to scale * R(angle) q + 2 t (clockwise on screen for angle > 0,
    # y pointing down; t a fraction of the side, the side being 2 long): invert it
    a, s = math.radians(p[_I["angle"]]), p[_I["scale"]]
    dx, dy = x - 2 * p[_I["tx"]], y - 2 * p[_I["ty"]]
    x, y = (math.cos(a) * dx + math.sin(a) * dy) / s, (-math.sin(a) * dx + math.cos(a) * dy) / s
    # crop: [-1, 1] of the crop -> source pixel coordinates (pixel centres at integers)
    top, left, h, w = p[0:4]
    sx = left + (x + 1) / 2 * w - 0.5
    sy = top + (y + 1) / 2 * h - 0.5
    sx, sy = np.clip(sx, 0, S - 1), np.clip(sy, 0, S - 1)
    x0, y0 = np.floor(sx).astype(int), np.floor(sy).astype(int)
    x1, y1 = np.minimum(x0 + 1, S - 1), np.minimum(y0 + 1, S - 1)
    fx, fy = (sx - x0)[..., None], (sy - y0)[..., None]
    f = src.astype(np.float64)
    return (f[y0, x0] * (1 - fx) + f[y0, x1] * fx) * (1 - fy) + (f[y1, x0] * (1 - fx) + f[y1, x1] * fx) * fy


def augment_reference(src: np.ndarray, p: np.ndarray, *, out: int, sampled: bool = False) -> np.ndarray:
    """One uint8 [S, S, 3] sample augmented with its parameter row: float [out, out, 3] in 0..255.

    ``sampled``: the sampling path (every step by inverse mapping, as with the affine); otherwise crop,
    resize inside the crop, flips and turns. The jitter (clamped once, at the end) follows.
    """
    img = geometry_sampled(src, p, out) if sampled else geometry_resize(src, p, out)
    return jitter(img, p[_I["brightness"]], p[_I["contrast"]], p[_I["saturation"]])
