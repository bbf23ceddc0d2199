"""Colour agreement (format.phash.colour_layout, colour_alike) against docs/FORMAT.md ("Colour agreement")
as tests/phashref.py writes it (exact fractions, a loop over the eight maps of the quarters), on real
photos and on values worked by hand; and what it changes in near-duplicate search (similar.near)."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from phashref import DOC_COLOUR_GREY, DOC_COLOUR_LEVEL, DOC_COLOUR_SHARE, doc_colour_alike, doc_colour_layout
from PIL import Image, ImageEnhance

from wds_tools.format import phash
from wds_tools.format.phash import colour_alike, colour_layout, phash_batch
from wds_tools.similar.match import looks
from wds_tools.similar.near import find_pairs, near_clusters
from wds_tools.synth import jpeg_bytes, lesion_photo


def _solid(rgb: tuple[int, int, int], side: int = 4) -> np.ndarray:
    return np.full((side, side, 3), rgb, np.uint8)


def test_the_documented_numbers():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md").read_text()
    rule = f"{phash.COLOUR_PART}·|g(a) − b| ≤ {phash.COLOUR_PART}·{phash.COLOUR_LEVEL} + max(|g(a)|, |b|)"
    assert rule in doc and f"none of its eight values {phash.COLOUR_GREY} or more from 0" in doc
    assert (phash.COLOUR_GREY, phash.COLOUR_LEVEL, Fraction(1, phash.COLOUR_PART)) == (
        DOC_COLOUR_GREY,
        DOC_COLOUR_LEVEL,
        DOC_COLOUR_SHARE,
    )


@pytest.mark.parametrize(
    "rgb, want",
    [
        ((255, 0, 0), (-43, 127)),  # Cb -43.03; Cr 127.5 rounds up to 128, clipped to 127
        ((255, 255, 0), (-127, 21)),  # Cb -127.5 rounds up to -127; Cr 20.73
        ((0, 0, 255), (127, -21)),  # Cb 127.5 -> 128 -> 127; Cr -20.73
        ((200, 150, 100), (-33, 29)),  # -33.4368, 29.0656
        ((77, 77, 77), (0, 0)),  # the weights of each row sum to 0: a grey pixel has no chroma
    ],
)
def test_layouts_of_solid_colours_worked_by_hand(rgb, want):
    got = colour_layout([_solid(rgb)])
    assert got.shape == (1, 2, 2, 2) and got.dtype == np.int16
    assert got.reshape(-1).tolist() == list(want) * 4


def test_halves_round_up_and_an_odd_side_counts_its_middle_twice():
    # 2x2: each quarter one pixel; Cr of (1, 0, 0) is 0.5 -> 1, Cb of (0, 0, 1) 0.5 -> 1, Cb of (0, 1, 0) -0.33 -> 0
    px = np.array([[(1, 0, 0), (0, 0, 1)], [(0, 1, 0), (9, 9, 9)]], np.uint8)
    assert colour_layout([px]).reshape(-1).tolist() == [0, 1, 1, 0, 0, 0, 0, 0]
    # 3x3: the top-left quarter is rows 0-1, columns 0-1; the middle pixel is in all four
    px = np.zeros((3, 3, 3), np.uint8)
    px[1, 1] = (0, 0, 200)  # Cb 100: a quarter of four pixels has mean 25
    assert colour_layout([px]).reshape(4, 2)[:, 0].tolist() == [25, 25, 25, 25]
    px[0, 0] = (0, 0, 200)  # only the top-left quarter: 50
    assert colour_layout([px]).reshape(4, 2)[:, 0].tolist() == [50, 25, 25, 25]


@pytest.mark.parametrize("side", [1, 2, 3, 63, 64, 224])
def test_the_layout_is_the_documented_recipe(side):
    rng = np.random.default_rng(side)
    pics = [rng.integers(0, 256, (side, side, 3), dtype=np.uint8) for _ in range(3)]
    pics.append(np.asarray(lesion_photo(side * 2 + 8, side + 8, 1, side).resize((side, side))))
    got = colour_layout(pics)
    for k, p in enumerate(pics):
        assert got[k].reshape(-1).tolist() == doc_colour_layout(p), k


def test_a_flip_or_turn_flips_or_turns_the_layout():
    im = np.asarray(lesion_photo(225, 225, 2, 3))  # odd side: the middle row and column in both halves
    base = colour_layout([im])[0]
    ops = [lambda a: a[:, ::-1], lambda a: a[::-1], lambda a: np.rot90(a), lambda a: a.transpose(1, 0, 2)]
    for op in ops:
        turned = colour_layout([np.ascontiguousarray(op(im))])[0]
        assert turned.tolist() == op(base).tolist()  # the grid of quarters moves as the pixels do
        assert colour_alike(base[None], turned[None]).tolist() == [True]


def _layouts(draw_values: list[int]) -> np.ndarray:
    return np.array(draw_values, np.int16).reshape(2, 2, 2)


layout = st.lists(st.integers(-127, 127), min_size=8, max_size=8)


@settings(max_examples=400, deadline=None)
@given(layout, st.lists(st.integers(-16, 16), min_size=8, max_size=8), st.integers(0, 7), st.booleans())
def test_agreement_is_the_documented_rule(a, shift, turn, small):
    """colour_alike against the reference's loop, on layouts near one another (b: a turned and shifted),
    near grey (``small``: values within 6 of 0) and far apart."""
    if small:
        a = [x % 7 - 3 for x in a]
    grid = _layouts(a)
    g = [grid, grid[:, ::-1], grid[::-1], grid[::-1, ::-1]][turn % 4]
    g = g.transpose(1, 0, 2) if turn >= 4 else g
    b = np.clip(g.reshape(-1) + np.array(shift), -127, 127).tolist()
    want = doc_colour_alike(a, b)
    assert colour_alike(_layouts(a)[None], _layouts(b)[None]).tolist() == [want]
    assert colour_alike(_layouts(b)[None], _layouts(a)[None]).tolist() == [doc_colour_alike(b, a)]


def test_agreement_worked_by_hand():
    at = lambda x, y: colour_alike(_layouts([x] * 8)[None], _layouts([y] * 8)[None]).tolist()  # noqa: E731
    assert at(40, 52) == [True]  # 12 <= 12 + 5.2
    assert at(40, 57) == [True]  # 17 <= 12 + 5.7
    assert at(40, 58) == [False]  # 18 > 12 + 5.8
    pink = [40, 30] * 4  # each value by itself: Cr 30 -> 47 is 17 > 12 + 4.7, though Cb 40 -> 57 would do
    assert colour_alike(_layouts(pink)[None], _layouts([x + 17 for x in pink])[None]).tolist() == [False]
    assert at(33, 50) == [True] and at(32, 50) == [False]  # 17 = 12 + 50 / 10 exactly; 18 is past it
    assert at(-33, -50) == [True] and at(-32, -50) == [False]
    greyish = [3, -3, 0, 0, 2, 1, -3, 3]  # no value 4 or more from 0: no colour to compare
    assert colour_alike(_layouts(greyish)[None], _layouts([100, -100] * 4)[None]).tolist() == [True]
    left_right = [60, 0, -60, 0, 60, 0, -60, 0]  # left quarters Cb 60, right -60
    mirrored = [-60, 0, 60, 0, -60, 0, 60, 0]
    assert colour_alike(_layouts(left_right)[None], _layouts(mirrored)[None]).tolist() == [True]
    top_bottom = [60, 0, 60, 0, -60, 0, -60, 0]
    assert colour_alike(_layouts(left_right)[None], _layouts(top_bottom)[None]).tolist() == [True]  # a quarter turn
    diagonal = [60, 0, -60, 0, -60, 0, 60, 0]
    assert colour_alike(_layouts(left_right)[None], _layouts(diagonal)[None]).tolist() == [False]


def _stored(im: Image.Image, side: int = 224) -> np.ndarray:
    """``im`` as a JPEG at quality 90, resized to its stored side (the copies' round trip)."""
    back = Image.open(io.BytesIO(jpeg_bytes(im.convert("RGB"), 90))).convert("RGB")
    return np.asarray(back.resize((side, side), Image.Resampling.BICUBIC))


def _chroma_inverted(im: Image.Image) -> Image.Image:
    """The same lightness with the opposite colours: Cb and Cr mirrored about 128 (PIL's YCbCr)."""
    y, cb, cr = im.convert("YCbCr").split()
    return Image.merge("YCbCr", (y, cb.point(lambda v: 255 - v), cr.point(lambda v: 255 - v))).convert("RGB")


def test_a_copy_of_opposite_colours_is_no_near_duplicate_but_a_greyscale_copy_is():
    """The hashes see grey only: a lesion photo and the same picture with its colours mirrored (its grey the
    same) are within the default threshold by their hashes, and no pair once colour is asked; a brighter
    copy and a greyscale copy stay near duplicates."""
    im = lesion_photo(320, 320, 1, 7)
    pics = [
        _stored(im),
        _stored(_chroma_inverted(im)),
        _stored(ImageEnhance.Brightness(im).enhance(1.1)),
        _stored(im.convert("L")),
    ]
    h = phash_batch(pics)
    lay = colour_layout(pics)
    i, j, _ = find_pairs(h, 5)
    assert {(0, 1), (0, 2), (0, 3)} <= set(zip(i.tolist(), j.tolist()))  # the hashes alone: all near
    asked = []

    def colours(side: int, rows: np.ndarray) -> np.ndarray:
        asked.append((side, rows.tolist()))
        return lay[rows]

    i, j, _ = find_pairs(h, 5, colours=colours)
    pairs = set(zip(i.tolist(), j.tolist()))
    assert (0, 1) not in pairs and {(0, 2), (0, 3)} <= pairs
    for x, y in pairs:
        assert doc_colour_alike(doc_colour_layout(pics[x]), doc_colour_layout(pics[y]))
    look = looks(pics)
    three = [0, 2, 3]  # the photo, its brighter and its greyscale copy: one cluster
    res = near_clusters(h[three], 5, looks=lambda side, rows: (lay[three][rows], look[three][rows]))
    assert [c.tolist() for c in res.clusters] == [[0, 1, 2]]
    res = near_clusters(h[:2], 5, looks=lambda s, r: (lay[r], look[r]))  # equal in grey, apart in colour
    assert res.clusters == [] and res.candidates == 1 and res.passed == 0


def _random_case(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples: equal hashes for all (so every pair is near by the hashes), with colour layouts that are
    copies (shifted by up to 12) of a few, some grey."""
    rng = np.random.default_rng(seed)
    h = np.repeat(rng.integers(0, 2**63, (1, 7), dtype=np.uint64), n, axis=0)
    bases = rng.integers(-90, 91, (4, 8))
    bases[0] = rng.integers(-3, 4, 8)  # a grey one
    lay = bases[rng.integers(0, 4, n)] + rng.integers(-12, 13, (n, 8))
    return h, np.clip(lay, -127, 127).astype(np.int16).reshape(n, 2, 2, 2)


@pytest.mark.slow  # 9 s: two searches per example, each filing its bucket tables
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 40), st.booleans())
def test_clusters_with_colour_are_stars_of_alike_pairs(seed, n, across):
    """With equal hashes and equal looks (the collapse's hardest case: one hash row, many colours), each cluster is
    a representative and samples the reference calls alike with it (across: holding samples of both sets), no
    sample is in two clusters, and a sample alike with none is in none."""
    h, lay = _random_case(seed, n)
    m = n // 2 if across else n
    a, b = h[:m], (h[m:] if across else None)
    la, lb = lay[:m], lay[m:]
    one = looks([_stored(lesion_photo(320, 320, 1, 7))])[0]
    res = near_clusters(
        a, 5, b, looks=lambda side, rows: ((la if side == 0 else lb)[rows], np.repeat(one[None], len(rows), axis=0))
    )
    flat = [x.reshape(-1).tolist() for x in lay]
    seen: set[int] = set()
    for c, rep, ev in zip(res.clusters, res.representative, res.pairs):
        members = c.tolist()
        assert rep in members and not seen & set(members)
        seen |= set(members)
        assert sorted(x for x, *_ in ev.tolist()) == sorted(set(members) - {rep})
        for x in members:
            assert x == rep or doc_colour_alike(flat[x], flat[rep]), (x, rep)
        if across:
            assert min(members) < m <= max(members)
    for x in range(n):  # (across, a cluster's members may be on one side with its representative)
        if not any(doc_colour_alike(flat[x], flat[y]) for y in range(n) if y != x):
            assert x not in seen
