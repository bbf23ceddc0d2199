"""The perceptual hash of a sample's stored pixels (samples.npz ``phash``, format version 3).

docs/FORMAT.md ("The perceptual hash") states the recipe; change the two together. In short: seven
64-bit hashes per sample, of the whole image and of six windows (the centre and the four edge-centred
squares S // 32 pixels in from the sides, and the centre S // 18 in); each is the grey window
area-averaged to 32x32, its 2-D DCT-II, and one bit per coefficient of the lowest 8x8 frequencies,
set when the coefficient is positive (the DC bit is always 0). Because only signs are kept, a flip or a quarter turn of the image maps the whole
image's hash to another by a bit permutation and a mask (``variants``). Two samples are near when the
whole-image hash of one, under one of the eight flips and turns, is near any of the other's seven
(``distance``): a copy cropped by a few percent matches a window of its original.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

__all__ = [
    "HASH_SIDE",
    "BLOCK",
    "WINDOWS",
    "GREY_WEIGHTS",
    "window_boxes",
    "phash",
    "phash_batch",
    "variants",
    "variants_array",
    "popcount",
    "distance",
    "distances",
]

HASH_SIDE = 32  # a window's grey image is area-averaged to HASH_SIDE x HASH_SIDE
"""The side each window's grey image is area-averaged to."""
BLOCK = 8  # each hash keeps the BLOCK x BLOCK lowest DCT frequencies: 64 bits
"""Each hash keeps the BLOCK x BLOCK lowest DCT frequencies: 64 bits."""
WINDOWS = 7  # hashes per sample: the whole image; the centre, top, bottom, left, right windows; a smaller centre
"""Hashes per sample: the whole image, the centre, top, bottom, left and right windows, a smaller centre."""
# the windows leave S // 32 pixels (3.1%), the smaller centre S // 18 (5.6%), at a side: chosen by measuring
# scripts/bench_dups.py's set (README, Near-duplicates)
MARGINS = (32, 18)
"""The windows leave S // MARGINS[0] pixels at a side they are centred between, the smaller centre S // MARGINS[1]."""
GREY_WEIGHTS = (299, 587, 114)  # ITU-R BT.601 luma of R, G, B, times 1000: integers, exact in float32
"""ITU-R BT.601 luma weights of R, G, B, times 1000."""


def window_boxes(side: int) -> list[tuple[int, int, int]]:
    """(top row, left column, side) of each of the ``WINDOWS`` squares hashed in a side x side image."""
    d, e = side // MARGINS[0], side // MARGINS[1]
    w, v = side - 2 * d, side - 2 * e
    return [(0, 0, side), (d, d, w), (0, d, w), (2 * d, d, w), (d, 0, w), (d, 2 * d, w), (e, e, v)]


@functools.lru_cache(maxsize=16)
def _area_matrix(side: int) -> np.ndarray:
    """[HASH_SIDE, side]: output cell i averages input columns over [i*side/32, (i+1)*side/32)."""
    a = np.zeros((HASH_SIDE, side), dtype=np.float64)
    scale = side / HASH_SIDE
    for i in range(HASH_SIDE):
        lo, hi = i * scale, (i + 1) * scale
        for x in range(int(np.floor(lo)), min(side, int(np.ceil(hi)))):
            a[i, x] = (min(hi, x + 1) - max(lo, x)) / scale
    return a


@functools.lru_cache(maxsize=1)
def _dct_rows() -> np.ndarray:
    """[BLOCK, HASH_SIDE]: the first rows of the DCT-II basis (unnormalised: only signs matter)."""
    u = np.arange(BLOCK)[:, None]
    x = np.arange(HASH_SIDE)[None, :]
    return np.cos(np.pi * (2 * x + 1) * u / (2 * HASH_SIDE))


@functools.lru_cache(maxsize=32)
def _kernel(side: int) -> np.ndarray:
    """[BLOCK, side]: area averaging then the DCT rows, as one matrix."""
    return _dct_rows() @ _area_matrix(side)


_WEIGHTS = 1 << np.arange(63, -1, -1, dtype=np.uint64)  # bit (u, v) at 63 - (8u + v): row-major, MSB first


def _bits(coeffs: np.ndarray) -> np.ndarray:
    """[..., 8, 8] DCT coefficients -> uint64 hashes."""
    bits = (coeffs > 0).reshape(*coeffs.shape[:-2], BLOCK * BLOCK)
    bits[..., 0] = False  # the DC term: always positive, carries nothing
    return (bits.astype(np.uint64) * _WEIGHTS).sum(axis=-1, dtype=np.uint64)


def phash(pixels: np.ndarray) -> np.ndarray:
    """The ``WINDOWS`` 64-bit hashes (uint64 [7]) of uint8 RGB pixels [S, S, 3] (docs/FORMAT.md)."""
    return phash_batch(pixels[None])[0]


def phash_batch(pixels: np.ndarray) -> np.ndarray:
    """``phash`` of each image of a uint8 [N, S, S, 3] batch, as uint64 [N, 7]."""
    if pixels.ndim != 4 or pixels.shape[1] != pixels.shape[2] or pixels.shape[3] != 3:
        raise ValueError(f"phash needs uint8 pixels [N, S, S, 3], not {pixels.shape}")
    side = pixels.shape[1]
    g = (pixels.astype(np.float32) @ np.array(GREY_WEIGHTS, dtype=np.float32)).astype(np.float64)  # exact
    # window_boxes' windows, sharing work: the centre, top and bottom windows have the same columns, the
    # centre, left and right ones the same rows (float64: the sums are exact to about 1e-16 of the largest)
    d, e = side // MARGINS[0], side // MARGINS[1]
    w, v = side - 2 * d, side - 2 * e
    ms, mw, mv = _kernel(side), _kernel(w), _kernel(v)
    coeffs = np.empty((len(pixels), WINDOWS, BLOCK, BLOCK))  # row (vertical) frequency u, column v
    coeffs[:, 0] = ms @ g @ ms.T
    cols = g[:, :, d : d + w] @ mw.T  # [N, S, 8]
    coeffs[:, 1] = mw @ cols[:, d : d + w]
    coeffs[:, 2] = mw @ cols[:, :w]
    coeffs[:, 3] = mw @ cols[:, 2 * d :]
    rows = mw @ g[:, d : d + w]  # [N, 8, S]
    coeffs[:, 4] = rows[:, :, :w] @ mw.T
    coeffs[:, 5] = rows[:, :, 2 * d :] @ mw.T
    coeffs[:, 6] = mv @ g[:, e : e + v, e : e + v] @ mv.T
    return _bits(coeffs)


def _bit_index() -> np.ndarray:
    u, v = np.meshgrid(np.arange(BLOCK), np.arange(BLOCK), indexing="ij")
    return np.stack([u, v], axis=-1)


def _mask(pred: np.ndarray) -> np.uint64:
    return np.uint64((pred.reshape(-1).astype(np.uint64) * _WEIGHTS).sum(dtype=np.uint64))


_UV = _bit_index()
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
