"""The perceptual hash of a sample's stored pixels (samples.npz ``phash``, format version 3).

docs/FORMAT.md ("The perceptual hash") states the recipe; change the two together. In short: the
grey image of the stored pixels, area-averaged to 32x32, its 2-D DCT-II, and one bit per coefficient
of the lowest 8x8 frequencies: set when the coefficient is positive (the DC bit is always 0). Because
only signs are kept, a flip or a quarter turn of the image maps the hash to another by a bit
permutation and a mask (``variants``): one hash is stored per sample, and two samples are compared
under all eight flips and turns (``distance``).
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = [
    "HASH_SIDE",
    "BLOCK",
    "GREY_WEIGHTS",
    "phash",
    "phash_batch",
    "variants",
    "variants_array",
    "popcount",
    "distance",
]

HASH_SIDE = 32  # the grey image is area-averaged to HASH_SIDE x HASH_SIDE
"""The side the grey image is area-averaged to."""
BLOCK = 8  # the hash keeps the BLOCK x BLOCK lowest DCT frequencies: 64 bits
"""The hash keeps the BLOCK x BLOCK lowest DCT frequencies: 64 bits."""
GREY_WEIGHTS = (299, 587, 114)  # ITU-R BT.601 luma of R, G, B, times 1000: integers, exact in float32
"""ITU-R BT.601 luma weights of R, G, B, times 1000."""


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


@functools.lru_cache(maxsize=16)
def _kernel(side: int) -> np.ndarray:
    """[BLOCK, side]: area averaging then the DCT rows, as one matrix."""
    return _dct_rows() @ _area_matrix(side)


_WEIGHTS = 1 << np.arange(63, -1, -1, dtype=np.uint64)  # bit (u, v) at 63 - (8u + v): row-major, MSB first


def _bits(coeffs: np.ndarray) -> np.ndarray:
    """[..., 8, 8] DCT coefficients -> uint64 hashes."""
    bits = (coeffs > 0).reshape(*coeffs.shape[:-2], BLOCK * BLOCK)
    bits[..., 0] = False  # the DC term: always positive, carries nothing
    return (bits.astype(np.uint64) * _WEIGHTS).sum(axis=-1, dtype=np.uint64)


def phash(pixels: np.ndarray) -> int:
    """The 64-bit perceptual hash of uint8 RGB pixels [S, S, 3] (docs/FORMAT.md)."""
    return int(phash_batch(pixels[None])[0])


def phash_batch(pixels: np.ndarray) -> np.ndarray:
    """``phash`` of each image of a uint8 [N, S, S, 3] batch, as uint64 [N]."""
    if pixels.ndim != 4 or pixels.shape[1] != pixels.shape[2] or pixels.shape[3] != 3:
        raise ValueError(f"phash needs uint8 pixels [N, S, S, 3], not {pixels.shape}")
    grey = pixels.astype(np.float32) @ np.array(GREY_WEIGHTS, dtype=np.float32)  # exact: < 2**24
    k = _kernel(pixels.shape[1])
    coeffs = k @ grey @ k.T  # [N, 8, 8]: row (vertical) frequency u, column frequency v
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
    """The hashes of the eight flips and quarter turns of each image of ``h`` (uint64 [N]): [N, 8]."""
    h = np.asarray(h, dtype=np.uint64)
    t = _transpose(h)
    # a zero coefficient stays 0 under negation; the mask's DC bit is 0 already
    return np.stack([(x ^ m) & _NOT_DC for x in (h, t) for m in _MASKS], axis=-1)


def variants(h: int) -> list[int]:
    """The hashes of an image's eight flips and quarter turns, from its hash; the first is ``h``."""
    return [int(x) for x in variants_array(np.array([h], dtype=np.uint64))[0]]


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64."""
    return np.bitwise_count(np.asarray(x, dtype=np.uint64)).astype(np.int64)


def distance(a: int, b: int) -> int:
    """The Hamming distance of two images' hashes, least over the eight flips and turns of ``b``."""
    return int(popcount(variants_array(np.array([b], dtype=np.uint64))[0] ^ np.uint64(a)).min())
