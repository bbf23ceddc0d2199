"""The perceptual hash as docs/FORMAT.md ("The perceptual hash") words it, written without format.phash:
the tests' reference (scipy's DCT, area averaging by pixel replication)."""

from __future__ import annotations

import numpy as np
from scipy.fft import dctn


def doc_hash(pixels: np.ndarray) -> int:
    """The recipe as FORMAT.md words it, written without format.phash."""
    s = pixels.shape[0]
    r, g, b = (pixels[..., c].astype(np.int64) for c in range(3))
    grey = (299 * r + 587 * g + 114 * b).astype(np.float64)
    if s % 32 == 0:  # area average = block mean
        small = grey.reshape(32, s // 32, 32, s // 32).mean(axis=(1, 3))
    else:  # area average = replicate every pixel 32x32 times, then block mean of s x s
        big = np.repeat(np.repeat(grey, 32, axis=0), 32, axis=1)
        small = big.reshape(32, s, 32, s).mean(axis=(1, 3))
    coeffs = dctn(small, type=2, norm="ortho")[:8, :8]
    h = 0
    for u in range(8):
        for v in range(8):
            bit = 0 if (u, v) == (0, 0) else int(coeffs[u, v] > 0)
            h |= bit << (63 - (8 * u + v))
    return h
