"""The near-duplicate check as docs/FORMAT.md ("Near-duplicates: the check") words it, written without
similar.match: the tests' reference (numpy in float64, area averaging as the integral of the pixels taken as
constant squares, scipy's DCT and its bilinear reading, and a search of its own: a grid of alignments, then
scipy's Nelder-Mead from the best few)."""

from __future__ import annotations

import numpy as np
from scipy.fft import dctn
from scipy.ndimage import map_coordinates
from scipy.optimize import minimize

# the documented numbers, written here, not read from similar.match
DOC_LOOK, DOC_GRID = 64, 32
DOC_MARGIN, DOC_BLOCK = 1.5, 2
DOC_FLOOR, DOC_SHARE, DOC_PLAIN, DOC_DETAIL = 1.0, 0.1, 2.0, 16.0
DOC_SCALE, DOC_COVER, DOC_SLOPES, DOC_MEANS = 1.18, 0.5, (0.5, 2.0), 1.43


def _area(a: np.ndarray, n: int) -> np.ndarray:
    """``a``'s rows averaged over n equal intervals, pixel x covering [x, x + 1)."""
    s = a.shape[0]
    total = np.concatenate([np.zeros((1, *a.shape[1:])), np.cumsum(a, axis=0)])

    def integral(x: float) -> np.ndarray:
        k = min(int(np.floor(x)), s - 1)
        return total[k] + (x - k) * a[k]

    return np.stack([(integral((i + 1) * s / n) - integral(i * s / n)) / (s / n) for i in range(n)])


def doc_look_exact(pixels: np.ndarray) -> np.ndarray:
    """FORMAT.md's look of stored pixels [S, S, 3] before rounding: float64 [32, 32]."""
    px = pixels.astype(np.float64)
    s = px.shape[0]
    if s % 2 == 0 and s // 2 >= DOC_LOOK:  # each pixel the mean of its 2 x 2 block
        px = px.reshape(s // 2, 2, s // 2, 2, 3).mean(axis=(1, 3))
    grey = px[..., 0] * 0.299 + px[..., 1] * 0.587 + px[..., 2] * 0.114
    small = _area(_area(grey, DOC_LOOK).T, DOC_LOOK).T
    p = np.pad(small, ((1, 1), (0, 0)), mode="edge")
    small = (p[:-2] + 2 * p[1:-1] + p[2:]) / 4
    p = np.pad(small, ((0, 0), (1, 1)), mode="edge")
    small = (p[:, :-2] + 2 * p[:, 1:-1] + p[:, 2:]) / 4
    return small.reshape(DOC_GRID, 2, DOC_GRID, 2).mean(axis=(1, 3))


def doc_look(pixels: np.ndarray) -> np.ndarray:
    """FORMAT.md's look: uint8 [32, 32]."""
    return np.clip(np.rint(doc_look_exact(pixels)), 0, 255).astype(np.uint8)


def doc_detail(look: np.ndarray) -> float:
    """The largest singular value of the 7x7 block u, v in 1..7 of the look's orthonormal 2-D DCT-II."""
    return float(np.linalg.svd(dctn(look.astype(np.float64), type=2, norm="ortho")[1:8, 1:8], compute_uv=False)[0])


def doc_turned(look: np.ndarray, turn: int) -> np.ndarray:
    """A look under FORMAT.md's flip or quarter turn (4: transpose, then 1: left-right, then 2: upside down)."""
    if turn & 4:
        look = look.T
    if turn & 1:
        look = look[:, ::-1]
    if turn & 2:
        look = look[::-1, :]
    return np.ascontiguousarray(look)


def doc_ratio(x: np.ndarray, y: np.ndarray, lam: float, ty: float, tx: float) -> float:
    """FORMAT.md's coarse residual over its allowance at one alignment (Y read at lam * p + t for X's cell centre
    p), the quadratic map fitted by least squares; inf where a limit fails."""
    c = np.arange(DOC_GRID) + 0.5
    py, px = np.meshgrid(c, c, indexing="ij")
    qy, qx = lam * py + ty - 0.5, lam * px + tx - 0.5  # index space: cell i's centre at i
    m = DOC_MARGIN
    inside = (qy >= m) & (qy <= DOC_GRID - 1 - m) & (qx >= m) & (qx <= DOC_GRID - 1 - m)
    if not (1 / DOC_SCALE <= lam <= DOC_SCALE) or inside.mean() < DOC_COVER:
        return np.inf
    yv = map_coordinates(y.astype(np.float64), [qy[inside], qx[inside]], order=1)
    xv = x.astype(np.float64)[inside]
    u = yv / 255
    coef, *_ = np.linalg.lstsq(np.stack([u, np.ones_like(u), u * u], axis=1), xv, rcond=None)
    a, b, cc = coef
    sd = xv.std()
    slopes = [(a + 2 * cc * u.min()) / 255, (a + 2 * cc * u.max()) / 255]
    means = sorted([xv.mean(), yv.mean()])
    if sd < DOC_PLAIN or min(slopes) < DOC_SLOPES[0] or max(slopes) > DOC_SLOPES[1] or means[1] > DOC_MEANS * means[0]:
        return np.inf
    e = np.zeros((DOC_GRID, DOC_GRID))
    e[inside] = xv - (a * u + b + cc * u * u)
    nb = DOC_GRID // DOC_BLOCK
    full = inside.reshape(nb, DOC_BLOCK, nb, DOC_BLOCK).all(axis=(1, 3))
    if not full.any():
        return np.inf
    means_b = e.reshape(nb, DOC_BLOCK, nb, DOC_BLOCK).mean(axis=(1, 3))[full]
    return float(np.sqrt((means_b**2).mean()) / np.hypot(DOC_FLOOR, DOC_SHARE * sd))


def doc_best_ratio(a: np.ndarray, b: np.ndarray, turn: int = -1) -> float:
    """The least ``doc_ratio`` this reference finds over both orders, b as it is and turned by ``turn``: a grid of
    scales (steps of 0.04) and shifts (whole cells, up to 3 from the centred scaling), then Nelder-Mead from the
    best three of each; inf where a look is too plain to check (its detail under 16)."""
    if doc_detail(a) < DOC_DETAIL or doc_detail(b) < DOC_DETAIL:
        return np.inf
    best = np.inf
    for y_b in [b] + ([doc_turned(b, turn)] if turn > 0 else []):
        for x, y in ((a, y_b), (y_b, a)):
            grid = []
            for lam in np.arange(1 / DOC_SCALE, DOC_SCALE + 1e-9, 0.04):
                centre = (1 - lam) * DOC_GRID / 2  # the scale about the centres
                for dy in np.arange(-3.0, 3.01, 1.0):
                    for dx in np.arange(-3.0, 3.01, 1.0):
                        grid.append((doc_ratio(x, y, lam, centre + dy, centre + dx), lam, centre + dy, centre + dx))
            grid.sort(key=lambda g: g[0])
            for r, lam, ty, tx in grid[:3]:
                best = min(best, r)
                if np.isfinite(r):
                    res = minimize(
                        lambda v, x=x, y=y: min(doc_ratio(x, y, *v), 1e6),
                        [lam, ty, tx],
                        method="Nelder-Mead",
                        options={"xatol": 1e-3, "fatol": 1e-4, "maxiter": 300},
                    )
                    best = min(best, float(res.fun))
    return best
