"""Whether two stored images are one photo: the check that a near-duplicate candidate (``similar.near``) must pass.

docs/FORMAT.md ("Near-duplicates: the check") states the rule; change the two together. In short: each image's
*look* is its grey image area-averaged to 64x64 and smoothed by [1, 2, 1] / 4 along each axis, rounded to whole
grey levels (``looks``; computed from the stored pixels, never stored). Two looks X (the reference) and Y are
aligned by a scale and a shift (Y at X's cell p is read at ``lam * p + t``, bilinearly), Y's grey levels mapped
onto X's by a quadratic ``a y + b + c y^2`` fitted by least squares, and compared over the cells of X whose
point falls inside Y, 3 cells in from its sides (a copy cut, shifted or re-framed differs at its edges). What is
compared is the *coarse residual*: X minus the mapped Y, averaged over blocks of 4x4 cells (the blocks wholly
inside), as a root mean square in grey levels. A recompression, rescale or blur of one photo leaves noise that
averages out over a block; two photos of different lesions differ in shapes and shading that do not. The pair
passes when, for one of the two orders, with the second image as it is or turned as its hashes matched, an
alignment with the scale within 1/1.18..1.18, at least half of X covered, the map rising with a slope of 0.5..2
over Y's range and X's grey levels spread by at least ``PLAIN`` (standard deviation) leaves a coarse residual
of at most ``max(FLOOR, SHARE * sd)``, sd the standard deviation of X over the compared cells. Its *score* is
``1 / (1 + residual / allowance)``: 1 for equal looks, ``PASS_SCORE`` (0.5) at the limit.

The alignment is found by a search, then refined: the looks' 2x2 means (32x32) are correlated (Pearson) at every
whole-cell shift of Y's inner part, for Y area-averaged to 32 ... 27 cells (scales 1 ... 0.84), and the best
placement of each order and turn is refined at 64x64 by Gauss-Newton steps on the scale, the shift and the map.
The rule's limits, ``PASS_SCORE`` and the search were chosen by measuring scripts/bench_dups.py's quality set and
scripts/bench_lesions.py's families of lesion photos (docs/guide/figures.md, "Near-duplicates on skin photos").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LOOK",
    "MARGIN",
    "BLOCK",
    "FLOOR",
    "SHARE",
    "PLAIN",
    "DETAIL",
    "detail",
    "SCALE_LIMIT",
    "COVER",
    "SLOPES",
    "PASS_SCORE",
    "looks",
    "turned",
    "inverse_turn",
    "Comparison",
    "compare",
]

LOOK = 64
"""The grey image is area-averaged to LOOK x LOOK cells and smoothed; a look is that image's 2 x 2 means."""
GRID = LOOK // 2
"""A look has GRID x GRID cells."""
MARGIN = 1.5
"""Cells of Y, in from each side, outside which no point of X is compared (edges a cut or a shift changes)."""
BLOCK = 2
"""The residual is averaged over blocks of BLOCK x BLOCK cells of X before its root mean square is taken."""
FLOOR = 1.0
"""Grey levels of coarse residual always allowed: what a recompression at JPEG quality 30 leaves on a smooth photo."""
SHARE = 0.1
"""The share of X's standard deviation allowed as coarse residual when that is more than FLOOR."""
PLAIN = 2.0
"""X's compared cells must spread at least this much (standard deviation, grey levels)."""
DETAIL = 16.0
"""A look whose two-dimensional detail is less than this is *too plain to check* and passes against none: the
largest singular value of the 7x7 block of its orthonormal 2-D DCT-II with u, v in 1..7, in grey levels. A solid
frame, a gradient and a patch of skin lit from the centre are under 6; a photo of one lesion on skin over 40."""
SCALE_LIMIT = 1.18
"""The scale between the two looks is within 1 / SCALE_LIMIT .. SCALE_LIMIT (a crop to 85% and more)."""
COVER = 0.5
"""At least this share of X's cells must be compared."""
SLOPES = (0.5, 2.0)
"""The fitted map's slope, at Y's least and greatest compared grey level, is within these."""
MEANS = 1.43
"""The mean grey levels of the two looks over the compared cells are within this factor of each other."""
PASS_SCORE = 0.5
"""The score at which a pair passes: the coarse residual equal to its allowance."""
COARSE = 0.5
"""The search refines only a placement whose coarse correlation is at least this: no pair that passes has less."""

_SIDES = (32, 31, 30, 29, 28, 27)  # the coarse search's sizes of Y at 32 cells: scales 1 .. 0.84
_COARSE_MARGIN = 2  # cells of the 32-cell view left out at each side in the coarse search
_STEPS = 4  # Gauss-Newton steps
_MEANS_SEARCHED = 1.6  # whole looks' means further apart than this are not searched (MEANS over the compared cells)
_SPREADS_SEARCHED = 2.5  # nor spreads (standard deviations) further apart than this (SLOPES)


def _area(n: int, side: int) -> np.ndarray:
    """[n, side]: cell i is the mean over [i * side / n, (i + 1) * side / n) of pixel x taken as constant on
    [x, x + 1)."""
    a = np.zeros((n, side))
    edges = np.arange(n + 1) * side / n
    for i in range(n):
        lo, hi = edges[i], edges[i + 1]
        for x in range(int(np.floor(lo)), min(side, int(np.ceil(hi)))):
            a[i, x] = (min(hi, x + 1) - max(lo, x)) / (hi - lo)
    return a


@functools.lru_cache(maxsize=16)
def _area32(n: int, side: int) -> np.ndarray:
    return _area(n, side).astype(np.float32)


@functools.lru_cache(maxsize=16)
def _area_band(n: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """``_area(n, side)`` as a band: each output cell's first pixel [n, 1] + 0..width-1 (clipped inside), and the
    weights [n, width] (0 past the cell): a few terms a cell, summed without a matrix product (small products
    take BLAS's threads, and under load cost several times their work)."""
    a = _area(n, side)
    first = np.array([int(np.flatnonzero(row)[0]) for row in a])
    width = max(int(np.flatnonzero(row)[-1]) - f + 1 for row, f in zip(a, first))
    idx = np.minimum(first[:, None] + np.arange(width), side - 1)
    w = np.zeros((n, width), np.float32)
    for i in range(n):
        for k in range(width):
            x = first[i] + k
            w[i, k] = a[i, x] if x < side else 0.0
    return idx, w


def _area_last(g: np.ndarray, n: int) -> np.ndarray:
    """``g`` [..., side] area-averaged along its last axis to n cells."""
    idx, w = _area_band(n, g.shape[-1])
    return np.einsum("...ik,ik->...i", g[..., idx], w)


def _smooth(a: np.ndarray) -> np.ndarray:
    """[1, 2, 1] / 4 along the last two axes, edges replicated."""
    p = np.concatenate([a[..., :1, :], a, a[..., -1:, :]], axis=-2)
    a = (p[..., :-2, :] + 2 * p[..., 1:-1, :] + p[..., 2:, :]) / 4
    p = np.concatenate([a[..., :1], a, a[..., -1:]], axis=-1)
    return (p[..., :-2] + 2 * p[..., 1:-1] + p[..., 2:]) / 4


def looks(images: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """The look of each stored image [S, S, 3] (uint8; a batch or a list, sides may differ): uint8 [N, GRID, GRID],
    its grey image (luma 0.299 R + 0.587 G + 0.114 B; where S is even and S / 2 >= LOOK, of the means of its 2 x 2
    blocks of pixels) area-averaged to LOOK x LOOK cells, smoothed by [1, 2, 1] / 4 along each axis (edges
    replicated), its 2 x 2 means taken and rounded to whole grey levels (docs/FORMAT.md)."""
    out = np.zeros((len(images), GRID, GRID), np.uint8)
    by_side: dict[int, list[int]] = {}
    for k, im in enumerate(images):
        by_side.setdefault(int(np.asarray(im).shape[0]), []).append(k)
    for side, ks in by_side.items():
        f = 2 if side % 2 == 0 and side // 2 >= LOOK else 1
        weights = np.array([0.299, 0.587, 0.114], np.float32)
        for lo in range(0, len(ks), 2):  # small batches: their buffers stay in the cache
            part = ks[lo : lo + 2]
            n = len(part)
            rgb = np.stack([np.asarray(images[k]) for k in part])
            grey = np.dot(rgb.reshape(-1, 3).astype(np.float32), weights).reshape(n, side, side)
            if f == 2:  # the means of each 2 x 2 block (the grey is linear: the grey of the blocks' means)
                pairs = grey[:, 0::2] + grey[:, 1::2]
                grey = (pairs[:, :, 0::2] + pairs[:, :, 1::2]) * np.float32(0.25)
            # columns, then rows
            cols = _area_last(grey, LOOK)  # [n, t, LOOK]
            rows = _area_last(np.ascontiguousarray(cols.transpose(0, 2, 1)), LOOK)  # [n, LOOK (columns), LOOK]
            small = _smooth(rows.transpose(0, 2, 1).astype(np.float64))
            half = small.reshape(n, GRID, 2, GRID, 2).mean(axis=(2, 4))
            out[part] = np.clip(np.rint(half), 0, 255).astype(np.uint8)
    return out


@functools.lru_cache(maxsize=1)
def _dct_rows() -> np.ndarray:
    """[7, GRID]: rows 1..7 of the orthonormal DCT-II basis of GRID points."""
    u = np.arange(1, 8)[:, None]
    x = np.arange(GRID)[None, :]
    return np.sqrt(2 / GRID) * np.cos(np.pi * (2 * x + 1) * u / (2 * GRID))


def detail(look: np.ndarray) -> np.ndarray:
    """The two-dimensional detail of each look [N, GRID, GRID] (``DETAIL``): float64 [N]."""
    c = _dct_rows()
    block = c @ np.asarray(look, np.float64) @ c.T
    return np.linalg.svd(block, compute_uv=False)[:, 0] if len(block) else np.zeros(0)


def turned(look: np.ndarray, turn: int) -> np.ndarray:
    """The look(s) [..., L, L] under flip or quarter turn ``turn`` (``phash.variants_array``'s order: 4 transposes,
    1 flips left-right, 2 upside down, applied in that order): the look of the turned image."""
    if turn & 4:
        look = np.swapaxes(look, -1, -2)
    if turn & 1:
        look = look[..., :, ::-1]
    if turn & 2:
        look = look[..., ::-1, :]
    return np.ascontiguousarray(look)


def inverse_turn(turn: int) -> int:
    """The turn that undoes ``turn``."""
    return {5: 6, 6: 5}.get(turn, turn)


@dataclass
class Comparison:
    """``compare``'s answer, one value per pair."""

    passed: np.ndarray  # bool: the pair is one photo by the check
    score: np.ndarray  # float64: 1 / (1 + residual / allowance), 0 where no alignment was within the limits
    residual: np.ndarray  # float64: the coarse residual, grey levels (inf where none was within the limits)
    allowance: np.ndarray  # float64: max(FLOOR, SHARE * sd)
    scale: np.ndarray  # float64: the scale of the best alignment (Y's cells per X's)


def _views(y32: np.ndarray) -> dict[int, np.ndarray]:
    """The 32-cell looks [P, 32, 32] area-averaged to each of _SIDES."""
    return {m: y32 if m == 32 else _area32(m, 32) @ y32 @ _area32(m, 32).T for m in _SIDES}


def _valid_ncc(x: np.ndarray, y: np.ndarray, fx: np.ndarray, ii: np.ndarray, i2: np.ndarray) -> np.ndarray:
    """Pearson correlation of each y [P, k, k] with every k x k window of x [P, n, n]: [P, n - k + 1, n - k + 1]
    (fx: x's rfft2; ii, i2: the integral images of x and x^2)."""
    n, k = x.shape[-1], y.shape[-1]
    yc = y - y.mean(axis=(1, 2), keepdims=True)
    c = np.fft.irfft2(fx * np.conj(np.fft.rfft2(yc, (n, n))), (n, n))[:, : n - k + 1, : n - k + 1]

    def window(s: np.ndarray) -> np.ndarray:
        return s[:, k:, k:] - s[:, :-k, k:] - s[:, k:, :-k] + s[:, :-k, :-k]

    sx = window(ii)
    vx = np.maximum(window(i2) - sx * sx / (k * k), 1e-6)
    vy = np.maximum((yc * yc).sum(axis=(1, 2)), 1e-6)[:, None, None]
    return c / np.sqrt(vx * vy)


def _coarse(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The best whole-cell placement of y's views in x (looks [P, 64, 64] as float): (correlation, scale, ty, tx)
    of the map from x's 64-cell coordinates to y's (``_refine``'s starting point)."""
    p = len(x)
    x32, y32 = x, y
    best = np.full(p, -np.inf)
    lam, ty, tx = np.ones(p), np.zeros(p), np.zeros(p)
    e = _COARSE_MARGIN
    fx = np.fft.rfft2(x32)
    ii = np.pad(x32, ((0, 0), (1, 0), (1, 0))).cumsum(1).cumsum(2)
    i2 = np.pad(x32 * x32, ((0, 0), (1, 0), (1, 0))).cumsum(1).cumsum(2)
    for m, view in _views(y32).items():
        r = _valid_ncc(x32, view[:, e : m - e, e : m - e], fx, ii, i2)
        flat = r.reshape(p, -1)
        k = flat.argmax(axis=1)
        got = flat[np.arange(p), k]
        oy, ox = np.divmod(k, r.shape[2])
        better = got > best
        s = 32 / m
        # x's coordinate u (cell u covers [u, u + 1)) shows view cell u - o + e, which covers y's [.., ..) * 32 / m:
        # y = s * x + s (e - o)
        best[better] = got[better]
        lam[better] = s
        ty[better] = (s * (e - oy))[better]
        tx[better] = (s * (e - ox))[better]
    return best, lam, ty, tx


def _gather(img: np.ndarray, yy: np.ndarray, xx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """img [P, n, n] read bilinearly at points (yy, xx) [P, M] in cell-index space (cell i's centre at i), clamped
    inside: the values, and the interpolant's derivatives along y and x, each [P, M]."""
    p, n, _ = img.shape
    y0 = np.clip(np.floor(yy), 0, n - 2)
    x0 = np.clip(np.floor(xx), 0, n - 2)
    fy, fx = yy - y0, xx - x0
    idx = (y0 * n + x0).astype(np.int64) + (np.arange(p) * (n * n))[:, None]
    flat = img.reshape(-1)
    a, b = flat[idx], flat[idx + 1]
    c, d = flat[idx + n], flat[idx + n + 1]
    top, bottom = a + (b - a) * fx, c + (d - c) * fx
    return top + (bottom - top) * fy, bottom - top, (b - a) + ((d - c) - (b - a)) * fy


@functools.lru_cache(maxsize=4)
def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The centres of an n x n grid's cells (cell i covers [i, i + 1))."""
    c = np.arange(n) + 0.5
    py, px = np.meshgrid(c, c, indexing="ij")
    return py.reshape(-1), px.reshape(-1)


def _fit_map(xv: np.ndarray, u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Least-squares (a, b, c) of x ~ a u + b + c u^2 over the cells of weight 1 (u: y / 255): [P, 3]."""
    basis = np.stack([u, np.ones_like(u), u * u], axis=1) * w[:, None]  # [P, 3, M]
    ata = basis @ basis.transpose(0, 2, 1) + 1e-9 * np.eye(3)
    atb = basis @ (xv * w)[..., None]
    return np.linalg.solve(ata, atb)[..., 0]


def _inside(qy: np.ndarray, qx: np.ndarray, n: int, margin: float) -> np.ndarray:
    return (qy >= margin) & (qy <= n - 1 - margin) & (qx >= margin) & (qx <= n - 1 - margin)


def _refine(x: np.ndarray, y: np.ndarray, lam: np.ndarray, ty: np.ndarray, tx: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gauss-Newton steps on (scale, shift), the map refitted at each, on the looks' 2x2 means (32x32): the
    refined (lam, ty, tx) of the map from x's 64-cell coordinates to y's."""
    p = len(x)
    x32, y32 = x, y
    xv = x32.reshape(p, -1)
    py, px = _grid(GRID)
    for _ in range(_STEPS):
        qy = lam[:, None] * py + ty[:, None] - 0.5  # cell-index space
        qx = lam[:, None] * px + tx[:, None] - 0.5
        w = _inside(qy, qx, GRID, MARGIN).astype(np.float64)
        yv, gyv, gxv = _gather(y32, qy, qx)
        u = yv / 255.0
        a, b, c = _fit_map(xv, u, w).T
        e = (a[:, None] * u + b[:, None] + c[:, None] * u * u - xv) * w
        slope = (a[:, None] + 2 * c[:, None] * u) / 255.0  # d(map)/dy
        jy, jx = slope * gyv * w, slope * gxv * w
        jac = np.stack([jy * py + jx * px, jy, jx], axis=1)  # [P, 3, M]: d e / d (lam, ty, tx)
        ata = jac @ jac.transpose(0, 2, 1) + 1e-6 * np.eye(3)
        step = -np.linalg.solve(ata, jac @ e[..., None])[..., 0]
        step = np.clip(step, [-0.05, -2.0, -2.0], [0.05, 2.0, 2.0])  # small steps: stay in the basin
        lam, ty, tx = lam + step[:, 0], ty + step[:, 1], tx + step[:, 2]
    return lam, ty, tx


def _measure(x: np.ndarray, y: np.ndarray, lam: np.ndarray, ty: np.ndarray, tx: np.ndarray) -> dict[str, np.ndarray]:
    """The check's quantities at an alignment, on the 64x64 looks."""
    p = len(x)
    xv = x.reshape(p, -1)
    py, px = _grid(GRID)
    qy = lam[:, None] * py + ty[:, None] - 0.5
    qx = lam[:, None] * px + tx[:, None] - 0.5
    inside = _inside(qy, qx, GRID, MARGIN)
    w = inside.astype(np.float64)
    u = _gather(y, qy, qx)[0] / 255.0
    a, b, c = _fit_map(xv, u, w).T
    e = np.where(inside, xv - (a[:, None] * u + b[:, None] + c[:, None] * u * u), 0.0)
    cover = inside.mean(axis=1)
    n = np.maximum(inside.sum(axis=1), 1)
    mean = (xv * w).sum(axis=1) / n
    sd = np.sqrt(np.maximum(((xv - mean[:, None]) ** 2 * w).sum(axis=1) / n, 0))
    lo = np.where(inside, u, np.inf).min(axis=1)
    hi = np.where(inside, u, -np.inf).max(axis=1)
    slopes = np.stack([(a + 2 * c * lo) / 255.0, (a + 2 * c * hi) / 255.0], axis=1)
    other = (u * 255 * w).sum(axis=1) / n  # y's mean over the compared cells
    nb = GRID // BLOCK
    full = inside.reshape(p, nb, BLOCK, nb, BLOCK).all(axis=(2, 4))
    means = e.reshape(p, nb, BLOCK, nb, BLOCK).mean(axis=(2, 4))
    blocks = full.sum(axis=(1, 2))
    residual = np.sqrt((means**2 * full).sum(axis=(1, 2)) / np.maximum(blocks, 1))
    ok = (
        (cover >= COVER)
        & (blocks > 0)
        & (lam >= 1 / SCALE_LIMIT)
        & (lam <= SCALE_LIMIT)
        & (slopes.min(axis=1) >= SLOPES[0])
        & (slopes.max(axis=1) <= SLOPES[1])
        & (sd >= PLAIN)
        & (np.maximum(mean, other) <= MEANS * np.maximum(np.minimum(mean, other), 1e-9))
    )
    return {"ok": ok, "residual": residual, "sd": sd, "lam": lam}


class _Best:
    """The best alignment within the limits found so far for each pair of a chunk: its residual over its allowance."""

    def __init__(self, m: int) -> None:
        self.ratio = np.full(m, np.inf)
        self.residual = np.full(m, np.inf)
        self.allowance = np.full(m, FLOOR)
        self.scale = np.ones(m)

    def keep(self, rows: np.ndarray, got: dict[str, np.ndarray]) -> None:
        """Keep, for each of ``rows``, the measured alignment where it is within the limits and better."""
        allow = np.hypot(FLOOR, SHARE * got["sd"])
        r = np.where(got["ok"], got["residual"] / allow, np.inf)
        better = r < self.ratio[rows]
        at = rows[better]
        self.ratio[at], self.residual[at] = r[better], got["residual"][better]
        self.allowance[at], self.scale[at] = allow[better], got["lam"][better]


def _compare_chunk(xa: np.ndarray, xb: np.ndarray, tt: np.ndarray) -> _Best:
    """``compare`` of one chunk of pairs of looks (float32 [m, GRID, GRID] each; turns [m])."""
    m = len(xa)
    best = _Best(m)
    # a pair whose whole looks differ in mean or spread past what the limits can join is not searched
    ma, mb = xa.mean(axis=(1, 2)), xb.mean(axis=(1, 2))
    sa, sb = xa.std(axis=(1, 2)), xb.std(axis=(1, 2))
    hopeful = (np.maximum(ma, mb) <= _MEANS_SEARCHED * np.maximum(np.minimum(ma, mb), 1e-6)) & (
        np.maximum(sa, sb) <= _SPREADS_SEARCHED * np.maximum(np.minimum(sa, sb), 1e-6)
    )
    hopeful &= np.minimum(sa, sb) >= PLAIN / 2
    hopeful &= (detail(xa) >= DETAIL) & (detail(xb) >= DETAIL)
    # first the identity (a copy as it is, recompressed, rescaled, brighter): a pair it passes needs no search
    ident = np.flatnonzero(hopeful)
    if len(ident):
        ones = np.ones(len(ident))
        got = _measure(xa[ident], xb[ident], ones, ones * 0, ones * 0)
        equal = (xa[ident] == xb[ident]).all(axis=(1, 2))
        got["residual"] = np.where(equal, 0.0, got["residual"])  # equal looks: none, not the fit's rounding
        best.keep(ident, got)
    searched = hopeful & ~(best.ratio <= 1.0)
    todo = np.flatnonzero(searched)
    if not len(todo):
        return best
    # the placements to refine: each order, b as it is and turned; the best by the coarse correlation
    ya, yb = xa[todo], xb[todo]
    turns = tt[todo]
    configs = [(ya, yb), (yb, ya)]
    if (turns > 0).any():
        yt = np.stack([turned(v, int(g)) if g > 0 else v for v, g in zip(yb, turns)])
        configs += [(ya, yt), (yt, ya)]
    top = np.full(len(todo), -np.inf)
    start = np.zeros((len(todo), 3))
    which = np.zeros(len(todo), np.int64)
    for k, (x, y) in enumerate(configs):
        r, lam, ty, tx = _coarse(x, y)
        if k >= 2:
            r = np.where(turns > 0, r, -np.inf)
        better = r > top
        top[better], which[better] = r[better], k
        start[better] = np.stack([lam, ty, tx], axis=1)[better]
    idx = np.flatnonzero(top >= COARSE)
    if len(idx):
        x = np.stack([configs[which[i]][0][i] for i in idx.tolist()])
        y = np.stack([configs[which[i]][1][i] for i in idx.tolist()])
        lam, ty, tx = _refine(x, y, start[idx, 0], start[idx, 1], start[idx, 2])
        best.keep(todo[idx], _measure(x, y, lam, ty, tx))
    return best


def compare(
    a: np.ndarray, b: np.ndarray, turns: np.ndarray | Sequence[int] | None = None, *, chunk: int = 256
) -> Comparison:
    """The check of each pair of looks (``looks``; uint8 [P, GRID, GRID] each): the identity first, then for each
    order, with b as it is and (``turns``, [P], -1 for none) turned so, the best placement refined; the best
    alignment within the limits (docs/FORMAT.md)."""
    a = np.asarray(a)
    b = np.asarray(b)
    n = len(a)
    t = np.full(n, -1, np.int64) if turns is None else np.asarray(turns, np.int64)
    out = Comparison(np.zeros(n, bool), np.zeros(n), np.full(n, np.inf), np.zeros(n), np.ones(n))
    for lo in range(0, n, chunk):
        sl = slice(lo, lo + chunk)
        best = _compare_chunk(a[sl].astype(np.float32), b[sl].astype(np.float32), t[sl])
        found = np.isfinite(best.ratio)
        out.score[sl] = np.where(found, 1 / (1 + np.where(found, best.ratio, 0)), 0.0)
        out.residual[sl] = best.residual
        out.allowance[sl] = best.allowance
        out.scale[sl] = best.scale
        out.passed[sl] = found & (best.ratio <= 1.0)
    return out
