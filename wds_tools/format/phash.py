"""The perceptual hash of a sample's stored pixels (samples.npz ``phash``, format version 3).

docs/FORMAT.md, "The perceptual hash", states the recipe and its reasons; change the two together. Seven
64-bit hashes per sample (the whole image and six windows, each the signs of its lowest 8x8 DCT
coefficients); ``distance`` compares two samples under the eight flips and quarter turns (``variants``); the
whole-image hash's top bit (``FLAT_BIT``) marks a sample too flat to hash, which is no one's near-duplicate.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .model import IndexMeta

__all__ = [
    "HASH_SIDE",
    "BLOCK",
    "WINDOWS",
    "GREY_WEIGHTS",
    "BLOCK_FACTORS",
    "FIRM_LEVEL",
    "FIRM_BITS",
    "DETAIL_RANK",
    "DETAIL_SHARE",
    "DETAIL_LEVEL",
    "FLAT_BIT",
    "FLAT_RULES",
    "COLOUR_GREY",
    "COLOUR_LEVEL",
    "COLOUR_PART",
    "colour_layout",
    "colour_alike",
    "is_flat",
    "flagged_alike",
    "firm_bits",
    "detail_rank",
    "whole_dct",
    "block_factor",
    "window_boxes",
    "grey",
    "phash",
    "phash_batch",
    "variants",
    "variants_array",
    "popcount",
    "distance",
    "distances",
]

HASH_SIDE = 32
"""The side each window's grey image is area-averaged to."""
BLOCK = 8
"""Each hash keeps the BLOCK x BLOCK lowest DCT frequencies: 64 bits."""
WINDOWS = 7
"""Hashes per sample: the whole image, the centre, top, bottom, left and right windows, a smaller centre."""
MARGINS = (32, 18)
"""The windows leave S // MARGINS[0] pixels at a side they are centred between, the smaller centre S // MARGINS[1]
(3.1% and 5.6%: measured, docs/guide/figures.md)."""
BLOCK_FACTORS = (8, 4, 2)
"""The grey image is taken in f x f blocks for the first f of these that divides the side S and leaves
S / f >= HASH_SIDE (else f = 1): 16 to 64 times less work after the first pass, for hashes as good."""
GREY_WEIGHTS = (299, 587, 114)
"""ITU-R BT.601 luma weights of R, G, B, times 1000: integers, exact in float32."""
FIRM_LEVEL = 1.0
"""A coefficient of the whole image's orthonormal 2-D DCT (of its 32x32 grey image in grey levels,
0..255) whose magnitude is at least this is *firm*: its sign bit survives a recompression (which moves
them by 0.09-0.41 at the median, docs/guide/figures.md)."""
FIRM_BITS = 16
"""A sample with fewer firm coefficients among the 63 its whole-image hash keeps is too flat to hash: one
more than the 15 a picture symmetric about its centre can have (its odd frequencies are exactly 0)."""
DETAIL_RANK = 5
"""A sample whose whole image's 7x7 block of DCT coefficients with u, v >= 1 (``whole_dct``) has fewer singular
values of at least ``DETAIL_SHARE`` times the largest and ``DETAIL_LEVEL`` is too flat to hash: its
two-dimensional detail is, within those, the sum of four or fewer separable patterns, which pair with
unrelated pictures at any threshold (docs/guide/figures.md)."""
DETAIL_SHARE = 1 / 96
"""The share of the block's largest singular value that a singular value must reach to count (``DETAIL_RANK``;
chosen by scripts/bench_lowdetail.py --sweep, docs/guide/figures.md)."""
DETAIL_LEVEL = 1.0
"""The least singular value, in grey levels, that counts (``DETAIL_RANK``): ``FIRM_LEVEL``'s (1.5 is weighed
in docs/guide/figures.md)."""
FLAT_BIT = np.uint64(1 << 63)
"""Set in a too-flat sample's whole-image hash (``phash[:, 0]``): the DC bit, otherwise always 0."""
COLOUR_GREY = 4
"""Grey levels of chroma: a picture none of whose four quarters' mean Cb and Cr is this far from 0 has no colour
to compare (a grey picture, or a greyscale copy of a colour one), and is alike in colour to every picture."""
COLOUR_LEVEL = 12
"""Grey levels by which two colour layouts may differ in each value, beyond 1 / ``COLOUR_PART`` of the larger."""
COLOUR_PART = 10
"""Two values of colour layouts may differ by 1 / ``COLOUR_PART`` of the larger too (a brighter copy has stronger
chroma): they agree when ``COLOUR_PART * |a - b| <= COLOUR_PART * COLOUR_LEVEL + max(|a|, |b|)``, in integers."""

FLAT_RULES = 2
"""How many of docs/FORMAT.md's too-flat rules set ``FLAT_BIT`` (1: ``FIRM_BITS``; 2: and ``DETAIL_RANK``); index.json
records it as ``phash_flat_rules``, and a base's hashes whose flags came from other rules are computed again."""


def flagged_alike(info: IndexMeta, columns: Iterable[str]) -> bool:
    """Whether a converted version's samples.npz ``phash`` can be used as it is: it has one (format version 3) and
    its too-flat flags came from the rules this code flags by (index.json ``phash_flat_rules``, absent before it was
    recorded). Otherwise the hashes are computed again from the stored pixels (docs/FORMAT.md)."""
    return "phash" in columns and info.phash_flat_rules == FLAT_RULES


def block_factor(side: int) -> int:
    """f: the side of the square blocks whose mean each pixel's grey value is replaced by (docs/FORMAT.md)."""
    return next((f for f in BLOCK_FACTORS if side % f == 0 and side // f >= HASH_SIDE), 1)


def window_boxes(side: int) -> list[tuple[int, int, int]]:
    """(top row, left column, side) of each of the ``WINDOWS`` squares hashed in a side x side image."""
    d, e = side // MARGINS[0], side // MARGINS[1]
    w, v = side - 2 * d, side - 2 * e
    return [(0, 0, side), (d, d, w), (0, d, w), (2 * d, d, w), (d, 0, w), (d, 2 * d, w), (e, e, v)]


def _area_matrix(lo: float, n: float, side: int) -> np.ndarray:
    """[HASH_SIDE, side]: output cell i is the mean, over [lo + i*n/32, lo + (i+1)*n/32), of the step function
    that is input column x on [x, x + 1)."""
    a = np.zeros((HASH_SIDE, side), dtype=np.float64)
    scale = n / HASH_SIDE
    for i in range(HASH_SIDE):
        start, stop = lo + i * scale, lo + (i + 1) * scale
        for x in range(int(np.floor(start)), min(side, int(np.ceil(stop)))):
            a[i, x] = (min(stop, x + 1) - max(start, x)) / scale
    return a


@functools.lru_cache(maxsize=1)
def _dct_rows() -> np.ndarray:
    """[BLOCK, HASH_SIDE]: the first rows of the DCT-II basis (unnormalised: only signs matter)."""
    u = np.arange(BLOCK)[:, None]
    x = np.arange(HASH_SIDE)[None, :]
    return np.cos(np.pi * (2 * x + 1) * u / (2 * HASH_SIDE))


# The windows share their row and column ranges: five distinct ranges (the whole side, [d, d + w), [0, w),
# [2d, S), [e, e + v)) serve as both. Each window is (row range, column range), in window_boxes' order.
_RANGES_OF = ((0, 0), (1, 1), (2, 1), (3, 1), (1, 2), (1, 3), (4, 4))
_ROWS = np.array([r for r, _ in _RANGES_OF])
_COLS = np.array([c for _, c in _RANGES_OF])


@functools.lru_cache(maxsize=16)
def _kernels(side: int) -> tuple[np.ndarray, np.ndarray]:
    """[5 * BLOCK, side / f], and its transpose: for each of the five ranges of a side x side image, area
    averaging over the range then the DCT rows, as one matrix acting on the f x f block sums (``grey``),
    where a range's ends fall at fractions of a block (f = ``block_factor(side)``; zero outside the range)."""
    (_, _, s), (d, _, w), _, _, _, _, (e, _, v) = window_boxes(side)
    f = block_factor(side)
    k = np.zeros((5, BLOCK, side // f))
    for r, (lo, n) in enumerate(((0, s), (d, w), (0, w), (2 * d, w), (e, v))):
        k[r] = _dct_rows() @ _area_matrix(lo / f, n / f, side // f)  # f a power of 2: exact
    flat = k.reshape(5 * BLOCK, side // f)
    return flat, np.ascontiguousarray(flat.T)


def grey(images: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """The sums of luma times 1000 over each f x f block (f = ``block_factor(S)``), float64 [N, S / f, S / f],
    of uint8 RGB images [S, S, 3] (a batch [N, S, S, 3] or a list). Integers below 2**24 (f <= 8), so the
    float32 sums that make them are exact."""
    side = images[0].shape[0]
    f = block_factor(side)
    t = side // f
    weights = np.array(GREY_WEIGHTS * f, dtype=np.float32)  # a block row's f pixels, R G B each
    out = np.empty((len(images), t, t))
    # one image at a time through buffers of one image's size: they stay in cache, and no batch is stacked
    rows = np.empty((t, side * 3), np.uint16)
    wide = np.empty((t, t, 3 * f), np.float32)
    luma = np.empty((t, t), np.float32)
    for i, px in enumerate(images):
        np.sum(px.reshape(t, f, side * 3), axis=1, dtype=np.uint16, out=rows)  # each block's f rows
        np.copyto(wide, rows.reshape(t, t, 3 * f))
        np.matmul(wide, weights, out=luma)  # each block's f columns, weighted
        out[i] = luma
    return out


_WEIGHTS = 1 << np.arange(63, -1, -1, dtype=np.uint64)  # bit (u, v) at 63 - (8u + v): row-major, MSB first


def _bits(coeffs: np.ndarray) -> np.ndarray:
    """[..., 8, 8] DCT coefficients -> uint64 hashes."""
    bits = (coeffs > 0).reshape(*coeffs.shape[:-2], BLOCK * BLOCK)
    bits[..., 0] = False  # the DC term: always positive, carries nothing
    return np.packbits(bits, axis=-1).view(">u8")[..., 0].astype(np.uint64)


def phash(pixels: np.ndarray) -> np.ndarray:
    """The ``WINDOWS`` 64-bit hashes (uint64 [7]) of uint8 RGB pixels [S, S, 3] (docs/FORMAT.md)."""
    return phash_batch([pixels])[0]


def _coefficients(images: np.ndarray | Sequence[np.ndarray]) -> tuple[np.ndarray, int]:
    """[N, 5, BLOCK, 5, BLOCK] DCT coefficients of every row range against every column range (``_kernels``),
    on the grey block sums (luma times 1000 times f * f), and f."""
    arrays = [np.asarray(px) for px in images]
    shapes = {(px.shape, px.dtype) for px in arrays}
    if len(shapes) != 1 or any(len(sh) != 3 or sh[0] != sh[1] or sh[2] != 3 or dt != np.uint8 for sh, dt in shapes):
        got = sorted(f"{dt}{list(sh)}" for sh, dt in shapes)
        raise ValueError(f"phash needs uint8 pixels [N, S, S, 3] (images of one side), not {', '.join(got)}")
    g = grey(arrays)
    side = arrays[0].shape[0]
    rows, cols_t = _kernels(side)
    # every range's rows against every range's columns in two products (float64: the sums are exact to
    # about 1e-16 of the largest), then each window's pair of ranges
    n, t = g.shape[:2]
    c = (rows @ (g.reshape(n * t, t) @ cols_t).reshape(n, t, 5 * BLOCK)).reshape(n, 5, BLOCK, 5, BLOCK)
    return c, block_factor(side)


@functools.lru_cache(maxsize=16)
def _orthonormal(f: int) -> np.ndarray:
    """[BLOCK, BLOCK]: what turns ``_coefficients``' units (grey times 1000 f^2, unnormalised DCT) into the
    orthonormal DCT of the grey image in grey levels: a(u) a(v) / (1000 f^2), a(0) = sqrt(1/32), a(k) = sqrt(2/32)."""
    a = np.full(BLOCK, np.sqrt(2 / HASH_SIDE))
    a[0] = np.sqrt(1 / HASH_SIDE)
    return np.outer(a, a) / (1000 * f * f)


@functools.lru_cache(maxsize=16)
def _firm_floor(f: int) -> np.ndarray:
    """[BLOCK, BLOCK]: ``FIRM_LEVEL`` in ``_coefficients``' units; infinite for the mean, which is no bit."""
    floor = FIRM_LEVEL / _orthonormal(f)
    floor[0, 0] = np.inf
    return floor


def _firm(c: np.ndarray, f: int) -> np.ndarray:
    """The number of firm coefficients of each whole image, from ``_coefficients``: int [N]."""
    return np.count_nonzero((np.abs(c[:, 0, :, 0, :]) >= _firm_floor(f)).reshape(len(c), BLOCK * BLOCK), axis=1)


@functools.lru_cache(maxsize=16)
def _detail_floor(f: int) -> float:
    """``DETAIL_LEVEL`` squared in the units of ``_coefficients``' block u, v >= 1, whose orthonormal factor is
    one number."""
    return float((DETAIL_LEVEL / _orthonormal(f)[1, 1]) ** 2)


def _squares(c: np.ndarray) -> np.ndarray:
    """The squared singular values of each whole image's 7x7 block u, v >= 1, smallest first, in the square of
    ``_coefficients``' units: float64 [N, 7]. They are the eigenvalues of the block's Gram matrix, from one
    LAPACK call on the stacked blocks (two thirds of the time of ``svd(..., compute_uv=False)`` at 16 blocks)."""
    block = c[:, 0, 1:, 0, 1:]
    return np.linalg.eigvalsh(np.matmul(block.transpose(0, 2, 1), block))


def _rank(c: np.ndarray, f: int) -> np.ndarray:
    """The counted singular values of each whole image's block (``DETAIL_RANK``), from ``_coefficients``: int [N]."""
    q = _squares(c)
    return np.count_nonzero(q >= np.maximum(_detail_floor(f), DETAIL_SHARE**2 * q[:, -1:]), axis=1)


def _flat(c: np.ndarray, f: int) -> np.ndarray:
    """Whether each image is too flat to hash (docs/FORMAT.md), from ``_coefficients``: bool [N]."""
    return (_rank(c, f) < DETAIL_RANK) | (_firm(c, f) < FIRM_BITS)


def whole_dct(images: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """The whole image's lowest BLOCK x BLOCK coefficients of the orthonormal 2-D DCT-II of its 32x32 grey
    image in grey levels (0..255), as FORMAT.md's firm rule reads them: float64 [N, 8, 8]."""
    if not len(images):
        return np.zeros((0, BLOCK, BLOCK))
    c, f = _coefficients(images)
    return c[:, 0, :, 0, :] * _orthonormal(f)


def firm_bits(images: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """How many of the 63 bits of each image's whole-image hash come from a firm coefficient (``FIRM_LEVEL``): int [N]."""
    if not len(images):
        return np.zeros(0, np.int64)
    return _firm(*_coefficients(images))


def detail_rank(images: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """How many singular values of each image's 7x7 block of whole-image coefficients with u, v >= 1 are at least
    ``DETAIL_SHARE`` of the largest and ``DETAIL_LEVEL`` grey levels (``DETAIL_RANK``): int [N]."""
    if not len(images):
        return np.zeros(0, np.int64)
    return _rank(*_coefficients(images))


def phash_batch(images: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """``phash`` of each image of a uint8 [N, S, S, 3] batch, or of a list of [S, S, 3] images of one side,
    as uint64 [N, 7]. A batch takes about half the time per image of one call per image."""
    if not len(images):
        return np.zeros((0, WINDOWS), np.uint64)
    c, f = _coefficients(images)
    out = _bits(c[:, _ROWS, :, _COLS, :].transpose(1, 0, 2, 3))  # [N, window, u, v]
    out[_flat(c, f), 0] |= FLAT_BIT
    return out


def is_flat(h: np.ndarray) -> np.ndarray:
    """Whether each sample is too flat to hash, from its hashes (uint64 [N, K], or [N] whole-image hashes): bool [N]."""
    h = np.asarray(h, dtype=np.uint64)
    return (h if h.ndim == 1 else h[:, 0]) >= FLAT_BIT


def _mask(pred: np.ndarray) -> np.uint64:
    return np.uint64((pred.reshape(-1).astype(np.uint64) * _WEIGHTS).sum(dtype=np.uint64))


_UV = np.stack(np.meshgrid(np.arange(BLOCK), np.arange(BLOCK), indexing="ij"), axis=-1)  # [u, v, (u, v)]
_ODD_V = _mask(_UV[..., 1] % 2 == 1)  # a left-right flip negates the coefficients of odd column frequency
_ODD_U = _mask(_UV[..., 0] % 2 == 1)  # an upside-down flip, those of odd row frequency
_NOT_DC = np.uint64(0x7FFF_FFFF_FFFF_FFFF)
_MASKS = [np.uint64(0), _ODD_V, _ODD_U, _ODD_V ^ _ODD_U]


def _transpose(h: np.ndarray) -> np.ndarray:
    """Swap bit (u, v) with bit (v, u)."""
    out = np.zeros_like(h)
    for u in range(BLOCK):
        for v in range(BLOCK):
            src = np.uint64(63 - (8 * u + v))
            dst = np.uint64(63 - (8 * v + u))
            out |= ((h >> src) & np.uint64(1)) << dst
    return out


def variants_array(h: np.ndarray) -> np.ndarray:
    """The hashes of the eight flips and quarter turns of the images hashed in ``h`` (uint64 [...]): [..., 8]."""
    h = np.asarray(h, dtype=np.uint64)
    t = _transpose(h)
    # a zero coefficient stays 0 under negation; the mask's DC bit is 0 already
    return np.stack([(x ^ m) & _NOT_DC for x in (h, t) for m in _MASKS], axis=-1)


def variants(h: int) -> list[int]:
    """The hashes of an image's eight flips and quarter turns, from its (whole-image) hash; the first is ``h``."""
    return [int(x) for x in variants_array(np.array([h], dtype=np.uint64))[0]]


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64."""
    return np.bitwise_count(np.asarray(x, dtype=np.uint64)).astype(np.int64)


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``distance`` of each row pair of two [P, K] hash arrays (K = 1: whole-image hashes only): [P]."""
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    ab = popcount(variants_array(a[:, 0])[:, :, None] ^ b[:, None, :]).min(axis=(1, 2))
    ba = popcount(variants_array(b[:, 0])[:, :, None] ^ a[:, None, :]).min(axis=(1, 2))
    return np.minimum(ab, ba)


def distance(a: np.ndarray | Sequence[int] | int, b: np.ndarray | Sequence[int] | int) -> int:
    """The distance of two samples: the least Hamming distance between the whole-image hash of either,
    under any of its eight flips and turns, and any of the other's hashes (``phash``; or two whole-image
    hashes, as ints)."""
    return int(distances(np.atleast_2d(np.asarray(a, np.uint64)), np.atleast_2d(np.asarray(b, np.uint64)))[0])


_CHROMA = np.array([(-168736, -331264, 500000), (500000, -418688, -81312)], np.int64)  # Cb, Cr per R, G, B, x 10^6


def colour_layout(images: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """The colour layout of each stored image [S, S, 3] (docs/FORMAT.md, Colour agreement): the mean chroma
    Cb and Cr of its four quarters, rounded and clipped as FORMAT.md says: int16 [N, 2, 2, 2], indexed
    (image, quarter row, quarter column, Cb or Cr). Exact integer arithmetic."""
    if isinstance(images, np.ndarray) and images.ndim == 4:
        return _layouts_of(images)
    arrays = [np.asarray(img) for img in images]
    if not arrays:
        return np.zeros((0, 2, 2, 2), np.int16)
    if len({a.shape for a in arrays}) == 1:
        return _layouts_of(np.stack(arrays))
    return np.concatenate([_layouts_of(a[None]) for a in arrays])  # sides that differ: one at a time


def _layouts_of(a: np.ndarray) -> np.ndarray:
    """``colour_layout`` of images of one side, uint8 [N, S, S, 3]."""
    s = a.shape[1]
    hi, lo = (s + 1) // 2, s // 2
    halves = (slice(0, hi), slice(lo, s))  # an odd side's middle row and column are in both
    sums = np.zeros((len(a), 2, 2, 3), np.int64)  # per quarter, the sums of R, G and B
    for r, rows in enumerate(halves):
        band = a[:, rows].sum(axis=1, dtype=np.int32)  # [N, S, 3]: the half's columns (at most S/2 x 255)
        for c, cols in enumerate(halves):
            sums[:, r, c] = band[:, cols].sum(axis=1, dtype=np.int64)
    den = 2 * 1_000_000 * hi * hi  # each quarter has ceil(S/2)^2 pixels
    total = sums @ _CHROMA.T  # [N, 2, 2, (Cb, Cr)] x 10^6, exact
    mean = np.floor_divide(2 * total + den // 2, den)  # round(total / (10^6 pixels)), halves up, exactly
    return np.clip(mean, -127, 127).astype(np.int16)


def _layout_variants(c: np.ndarray) -> list[np.ndarray]:
    """The layouts of the eight flips and quarter turns of the images of layouts ``c`` [P, 2, 2, 2]."""
    out = []
    for t in (c, c.transpose(0, 2, 1, 3)):
        for rows in (slice(None), slice(None, None, -1)):
            for cols in (slice(None), slice(None, None, -1)):
                out.append(t[:, rows, cols])
    return out


def colour_alike(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each pair of colour layouts (``colour_layout``: [P, 2, 2, 2] each) agrees (docs/FORMAT.md,
    Colour agreement: either has no colour, or under one of the eight flips and quarter turns of ``a`` every
    value is close to ``b``'s): bool [P]."""
    a = np.asarray(a, np.int64).reshape(-1, 2, 2, 2)
    b = np.asarray(b, np.int64).reshape(-1, 2, 2, 2)
    grey = (np.abs(a).reshape(len(a), -1).max(axis=1) < COLOUR_GREY) | (
        np.abs(b).reshape(len(b), -1).max(axis=1) < COLOUR_GREY
    )
    alike = grey.copy()
    for g in _layout_variants(a):
        apart = COLOUR_PART * np.abs(g - b) - np.maximum(np.abs(g), np.abs(b))
        alike |= apart.reshape(len(a), -1).max(axis=1) <= COLOUR_PART * COLOUR_LEVEL
    return alike
