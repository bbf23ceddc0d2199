"""The perceptual hash as docs/FORMAT.md ("The perceptual hash") words it, written without format.phash:
the tests' reference (scipy's DCT; area averaging as the integral of the pixels taken as constant squares)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from scipy.fft import dctn
from scipy.linalg import svdvals


def _area_rows(a: np.ndarray, n: int = 32) -> np.ndarray:
    """Average ``a`` over n equal intervals of its rows, pixel x covering [x, x + 1): integral of the step
    function between the interval's ends, over the interval's length."""
    s = a.shape[0]
    total = np.concatenate([np.zeros((1, *a.shape[1:])), np.cumsum(a, axis=0)])

    def integral(x: float) -> np.ndarray:
        k = min(int(np.floor(x)), s - 1)
        return total[k] + (x - k) * a[k]

    return np.stack([(integral((i + 1) * s / n) - integral(i * s / n)) / (s / n) for i in range(n)])


def doc_firm(pixels: np.ndarray) -> int:
    """FORMAT.md's count of firm coefficients: of the whole image's 63 AC coefficients (u, v < 8) of the
    orthonormal DCT of its 32x32 grey image in grey levels, those of magnitude 1 or more."""
    return doc_details(pixels)[1]


def doc_rank(pixels: np.ndarray) -> int:
    """FORMAT.md's count of firm singular values: of the whole image's 7x7 block of those coefficients with
    u, v >= 1 (grey levels), the singular values of at least 1 and of at least 1/96 of the largest."""
    return doc_details(pixels)[2]


def doc_hash(pixels: np.ndarray) -> list[int]:
    """The seven hashes of stored pixels [S, S, 3], as FORMAT.md words them, written without format.phash."""
    return doc_details(pixels)[0]


def doc_details(pixels: np.ndarray) -> tuple[list[int], int, int]:
    """(the seven hashes, the whole image's firm coefficients, its firm singular values) of stored pixels
    [S, S, 3]."""
    s = pixels.shape[0]
    r, g, b = (pixels[..., c].astype(np.int64) for c in range(3))
    grey = (299 * r + 587 * g + 114 * b).astype(np.float64)
    f = next((f for f in (8, 4, 2) if s % f == 0 and s // f >= 32), 1)  # each pixel: the mean of its f x f block
    t = s // f
    means = grey.reshape(t, f, t, f).mean(axis=(1, 3))
    grey = np.repeat(np.repeat(means, f, axis=0), f, axis=1)
    d, e = s // 32, s // 18
    w, v = s - 2 * d, s - 2 * e
    # whole, centre, top, bottom, left, right, smaller centre
    boxes = [(0, 0, s), (d, d, w), (0, d, w), (2 * d, d, w), (d, 0, w), (d, 2 * d, w), (e, e, v)]
    out, firm, rank = [], 0, 0
    for top, left, side in boxes:
        window = grey[top : top + side, left : left + side]
        small = _area_rows(_area_rows(window).T).T
        coeffs = dctn(small, type=2, norm="ortho")[:8, :8]
        h = 0
        for u in range(8):
            for v in range(8):
                bit = 0 if (u, v) == (0, 0) else int(coeffs[u, v] > 0)
                h |= bit << (63 - (8 * u + v))
        if not out:  # the whole image: its firm coefficients (grey levels: the luma above is times 1000)
            ac = np.abs(coeffs / 1000).reshape(-1)[1:]
            firm = int((ac >= 1.0).sum())
            sv = svdvals(coeffs[1:, 1:] / 1000)  # largest first
            rank = int(((sv >= 1.0) & (sv >= sv[0] / 96)).sum())
            h |= int(firm < 16 or rank < 5) << 63  # too flat to hash
        out.append(h)
    return out, firm, rank


# Colour agreement (FORMAT.md): the documented numbers, written here, not read from format.phash
DOC_COLOUR_GREY = 4
DOC_COLOUR_LEVEL = 12
DOC_COLOUR_SHARE = Fraction(1, 10)
# the eight flips and quarter turns of a 2x2 grid of quarters: quarter (r, c) of g(a) is quarter MAP(r, c) of a
_QUARTER_MAPS = [
    lambda r, c: (r, c),
    lambda r, c: (r, 1 - c),
    lambda r, c: (1 - r, c),
    lambda r, c: (1 - r, 1 - c),
    lambda r, c: (c, r),
    lambda r, c: (c, 1 - r),
    lambda r, c: (1 - c, r),
    lambda r, c: (1 - c, 1 - r),
]


def doc_colour_layout(pixels: np.ndarray) -> list[int]:
    """FORMAT.md's colour layout, in exact fractions: each quarter's mean of Cb and Cr (JPEG's chroma, centred on
    0), rounded halves up and clipped to -127..127; quarters top-left, top-right, bottom-left, bottom-right, Cb
    before Cr."""
    from fractions import Fraction
    from math import floor

    s = pixels.shape[0]
    halves = (slice(0, (s + 1) // 2), slice(s // 2, s))
    weights = ((-0.168736, -0.331264, 0.5), (0.5, -0.418688, -0.081312))
    out = []
    for rows in halves:
        for cols in halves:
            q = pixels[rows, cols].reshape(-1, 3)
            sums = [int(x) for x in q.astype(np.int64).sum(axis=0)]
            for w in weights:
                mean = sum(Fraction(str(wc)) * t for wc, t in zip(w, sums)) / len(q)
                out.append(min(127, max(-127, floor(mean + Fraction(1, 2)))))
    return out


def doc_colour_alike(a: list[int], b: list[int]) -> bool:
    """FORMAT.md's colour agreement of two layouts (as ``doc_colour_layout`` lists them)."""
    if max(abs(x) for x in a) < DOC_COLOUR_GREY or max(abs(x) for x in b) < DOC_COLOUR_GREY:
        return True
    cell = lambda lay, r, c, ch: lay[(2 * r + c) * 2 + ch]  # noqa: E731
    for m in _QUARTER_MAPS:
        ok = True
        for r in (0, 1):
            for c in (0, 1):
                for ch in (0, 1):
                    x, y = cell(a, *m(r, c), ch), cell(b, r, c, ch)
                    if abs(x - y) > DOC_COLOUR_LEVEL + DOC_COLOUR_SHARE * max(abs(x), abs(y)):
                        ok = False
        if ok:
            return True
    return False
