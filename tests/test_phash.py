"""The perceptual hash (format.phash) against an independent implementation written from docs/FORMAT.md
("The perceptual hash"): scipy's DCT over grey windows area-averaged as integrals, on real photos."""

from __future__ import annotations

import numpy as np
import pytest
from phashref import doc_hash
from PIL import Image

from wds_tools.format.phash import WINDOWS, distance, phash, phash_batch, variants, variants_array

sklearn_datasets = pytest.importorskip("sklearn.datasets")


def photos() -> list[np.ndarray]:
    """The two photographs scikit-learn ships (china.jpg, flower.jpg), uint8 RGB."""
    return list(sklearn_datasets.load_sample_images().images)


def square(im: np.ndarray, side: int, box: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """A crop of a photo resized with PIL to side x side: stored pixels as a conversion would hold them."""
    pil = Image.fromarray(im)
    h, w = im.shape[:2]
    box = box or ((w - h) // 2, 0, (w - h) // 2 + h, h)
    return np.asarray(pil.resize((side, side), Image.Resampling.LANCZOS, box=box), dtype=np.uint8)


@pytest.mark.parametrize("side", [8, 50, 63, 64, 65, 100, 224, 225, 256, 384])
def test_the_hash_is_the_documented_recipe(side):
    ims = photos()
    crops = (
        [square(im, side) for im in ims]
        + [square(im, side, (0, 0, 200, 200)) for im in ims]
        + [square(im, side, (300, 100, 500, 300)) for im in ims]
    )
    got = phash_batch(np.stack(crops))
    assert got.shape == (len(crops), WINDOWS) and got.dtype == np.uint64
    for i, c in enumerate(crops):
        want = doc_hash(c)
        assert got[i].tolist() == phash(c).tolist() == want, (side, i, [f"{h:016x}" for h in want])
        assert all(h >> 63 == 0 for h in want)  # the DC bit
        if side < 18:  # no margin: every window is the whole image
            assert len(set(want)) == 1


def test_flips_and_quarter_turns_are_the_documented_variants():
    im = square(photos()[0], 224)
    h = phash(im)
    v = variants(int(h[0]))
    assert v[0] == h[0] and len(set(v)) == 8
    turned = [
        im[:, ::-1],
        im[::-1],
        im[::-1, ::-1],
        im.transpose(1, 0, 2),
        np.rot90(im),
        np.rot90(im, 3),
        np.rot90(im.transpose(1, 0, 2), 2),
    ]
    for t in turned:
        t = np.ascontiguousarray(t)
        assert doc_hash(t)[0] in v
        assert distance(h, doc_hash(t)) == 0 and distance(doc_hash(t), h) == 0


def test_the_windows_of_a_mirror_are_the_mirrored_windows():
    """The five windows sit symmetrically: a left-right flip swaps the left and right windows and
    mirrors each (its hash's left-right variant), an upside-down flip swaps top and bottom."""
    im = square(photos()[1], 224)
    h = phash(im)
    lr, ud = variants_array(h)[:, 1], variants_array(h)[:, 2]  # the masks of odd v, of odd u
    assert phash(np.ascontiguousarray(im[:, ::-1])).tolist() == lr[[0, 1, 2, 3, 5, 4, 6]].tolist()
    assert phash(np.ascontiguousarray(im[::-1])).tolist() == ud[[0, 1, 3, 2, 4, 5, 6]].tolist()


def test_copies_are_near_and_different_photos_far():
    china, flower = photos()
    a = square(china, 224)
    recompressed = Image.fromarray(square(china, 448))
    import io

    buf = io.BytesIO()
    recompressed.save(buf, "JPEG", quality=60)
    b = np.asarray(Image.open(buf).convert("RGB").resize((224, 224), Image.Resampling.LANCZOS))
    assert distance(phash(a), phash(b)) <= 4
    assert distance(phash(a), phash(square(flower, 224))) >= 16
    assert distance(phash(a), phash(square(china, 224, (0, 0, 300, 300)))) >= 16  # another part of the photo


def test_a_slightly_cropped_copy_matches_a_window():
    """A copy cropped by 6-11% (about the windows' margins: 13 and 23 of the photo's 427 rows a side) is far from
    the original's whole-image hash but near one of its windows: the distance takes the nearest (FORMAT.md)."""
    china = photos()[0]
    h, w = china.shape[:2]
    left = (w - h) // 2
    a = phash(square(china, 224))
    # top, right, left, bottom, smaller centre
    boxes = [
        (12, 0, h - 14, h - 26),
        (26, 12, h, h - 14),
        (0, 13, h - 26, h - 13),
        (13, 26, h - 13, h),
        (24, 22, h - 22, h - 24),
    ]
    for box in [(x0 + left, y0, x1 + left, y1) for x0, y0, x1, y1 in boxes]:
        b = phash(square(china, 224, box))
        whole = distance(int(a[0]), int(b[0]))
        assert distance(a, b) <= 5 < whole, (box, distance(a, b), whole)


def test_imagehash_agrees_where_the_recipes_agree():
    """A cross-check with imagehash's DCT (where installed): its pHash keeps the 8x8 block's bits by
    the median, ours by sign; on the same 32x32 grey image the AC coefficients far from zero and the
    median agree in sign for most bits."""
    imagehash = pytest.importorskip("imagehash")
    ims = [square(im, 224) for im in photos()]
    for im in ims:
        theirs = imagehash.phash(Image.fromarray(im), hash_size=8, highfreq_factor=4).hash.reshape(-1)
        ours = np.array([(int(phash(im)[0]) >> (63 - i)) & 1 for i in range(64)], dtype=bool)
        assert (theirs[1:] == ours[1:]).mean() >= 0.75


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"\[N, S, S, 3\]"):
        phash_batch(np.zeros((2, 8, 9, 3), np.uint8))


def _pattern(side: int) -> np.ndarray:
    """Pixels from an integer formula (no decoder, resampler or random generator involved): noise, whose
    low frequencies any change of the recipe (the blocks, the windows, the weights) moves."""
    y, x, c = np.meshgrid(np.arange(side), np.arange(side), np.arange(3), indexing="ij")
    return ((x * 1103515245 + y * 12345 + c * 2654435761) // 128 % 256).astype(np.uint8)


@pytest.mark.parametrize(
    "side, want",
    [
        # f = 1 (an odd side): the grey image itself
        (
            65,
            "7f2a1900bf57ff48 7b7f18ff57ffddff 4335085d00d1c051 6f2aa8ae358afdae 533f18aa77aaddaa 7b215f251b55da75 7f37aaaf37effeef",
        ),
        (
            100,
            "6e2b9e0b2a0baa23 693f884db75c9b6f 623a0205060802e0 6c2a1c0855005c0a 7b3ebb8a05109a2a 413a15df015c9a21 6b340acf07191a29",
        ),  # f = 2
        (
            224,
            "daf15b0fa2512000 5ff25f0ae709fd55 5bf21b0ea389fc55 5ff15f09e60ba955 5ff55f0ea6abf543 5ff05b0fa301a4ea 5ff51a4fa2591008",
        ),  # f = 4; too flat to hash (18 firm coefficients, but 4 counted singular values: the 5th is 0.95 grey levels, under 1): the top bit set
        (
            256,
            "dc8f5a0fa55554aa 5e555a0da725aeea 5e555a0da3adaaee 5dd75b0f25a305aa 7ab65a0fa747ad50 5f531a0ff75544aa 5ff75a0fa301a0fe",
        ),  # f = 8; too flat to hash (12 firm coefficients: pixel noise averages out): the top bit set
    ],
)
def test_the_recipe_is_pinned(side, want):
    """Format version 3's hashes of a fixed image, written down from the reference (tests/phashref.py) when the
    recipe was fixed: a change to the recipe made in both format.phash and the reference still fails here. (At 224 px the smallest |coefficient|
    of these windows is 2.4e-7 of the largest, far above float64 rounding: the bits do not depend on it.)"""
    px = _pattern(side)
    assert [f"{h:016x}" for h in phash(px).tolist()] == want.split()
    assert [f"{h:016x}" for h in doc_hash(px)] == want.split()


def test_the_caller_s_arrays_are_left_alone():
    """The hashes are computed through scratch buffers: neither the pixels given nor an earlier result change."""
    ims = [square(im, 224) for im in photos()]
    copies = [im.copy() for im in ims]
    first = phash_batch(ims)
    kept = first.copy()
    second = phash_batch([np.ascontiguousarray(im[::-1]) for im in ims])
    assert all(np.array_equal(a, b) for a, b in zip(ims, copies))
    assert np.array_equal(first, kept) and not np.array_equal(first, second)


def test_a_list_of_images_of_one_side_or_none():
    ims = [square(im, 224) for im in photos()]
    assert phash_batch(ims).tolist() == phash_batch(np.stack(ims)).tolist()
    assert phash_batch([]).shape == (0, WINDOWS)
    with pytest.raises(ValueError, match=r"one side.*uint8\[224, 224, 3\], uint8\[64, 64, 3\]"):
        phash_batch([ims[0], square(photos()[1], 64)])
    with pytest.raises(ValueError, match=r"float64"):
        phash_batch([ims[0].astype(np.float64)])


def _squeezed(im: np.ndarray, contrast: float) -> np.ndarray:
    """The photo's colours pulled towards their mean by ``contrast`` (1: unchanged), rounded."""
    a = im.astype(np.float64)
    m = a.mean(axis=(0, 1), keepdims=True)
    return np.clip(np.round(m + contrast * (a - m)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("side", [8, 64, 100, 224, 256])
def test_the_flat_rule_is_the_documented_one(side):
    """The firm coefficients (whole image, |orthonormal DCT| >= 1 grey level), the counted singular values of
    the 7x7 block u, v >= 1 (at least 1 grey level and 1/96 of the largest) and the flat bit of the
    whole-image hash (fewer than 16 firm coefficients or fewer than 5 counted singular values) agree with the
    reference, from solid frames to full-contrast photos; a solid frame is flat, a photo is not, and one
    squeezed to 1/200 of its contrast (its colours within about a grey level) is."""
    from phashref import doc_details

    from wds_tools.format.phash import DETAIL_RANK, FIRM_BITS, detail_rank, firm_bits, is_flat

    ims = [square(im, side) for im in photos()]
    cases = [np.full((side, side, 3), c, np.uint8) for c in (0, 37, 128, 255)]
    cases += [_squeezed(im, f) for im in ims for f in (1.0, 0.05, 0.02, 0.005)]
    got, firm, rank = phash_batch(cases), firm_bits(cases), detail_rank(cases)
    for i, px in enumerate(cases):
        want, want_firm, want_rank = doc_details(px)
        assert (firm[i], rank[i]) == (want_firm, want_rank), (i, firm[i], want_firm, rank[i], want_rank)
        flat = want_firm < FIRM_BITS or want_rank < DETAIL_RANK
        assert int(got[i, 0]) >> 63 == want[0] >> 63 == flat
        if not flat:  # a flat image's other bits may be rounding noise: FORMAT.md
            assert got[i].tolist() == want
    assert is_flat(got[:4]).all() and firm[:4].tolist() == rank[:4].tolist() == [0, 0, 0, 0]
    assert not is_flat(got[4::4]).any()  # the photos themselves
    assert is_flat(got[7::4]).all()  # at 1/200 of their contrast


def test_the_flat_bit_is_the_same_for_every_flip_and_turn():
    """Flips and turns change signs and swap coefficients, never their magnitude: a picture and its mirror
    are both flat or both not (a 1-D gradient is flat: three quarters of its coefficients are exactly 0)."""
    from wds_tools.format.phash import is_flat

    ramp = np.broadcast_to(np.linspace(0, 255, 224).round().astype(np.uint8)[None, :, None], (224, 224, 3))
    for px in (square(photos()[0], 224), np.ascontiguousarray(ramp)):
        turned = [px, px[:, ::-1], px[::-1], px.transpose(1, 0, 2), np.rot90(px)]
        flags = is_flat(phash_batch([np.ascontiguousarray(t) for t in turned]))
        assert len(set(flags.tolist())) == 1
    assert is_flat(phash_batch([np.ascontiguousarray(ramp)]))[0]
    assert is_flat(np.array([1 << 63, 5], np.uint64)).tolist() == [True, False]  # [N] whole-image hashes


def test_flagged_alike_reads_phash_flat_rules_from_the_typed_index(tmp_path):
    """A version's stored phash is used as it is when it has the column and index.json's phash_flat_rules is
    this code's (2: docs/FORMAT.md, index.json), read from ``IndexMeta``."""
    import json

    from conftest import convert_images

    from wds_tools.format.index import load_index
    from wds_tools.format.phash import flagged_alike

    folder = convert_images(tmp_path, 4, size=8, shard_size=2)
    idx = load_index(folder)
    cols = idx.samples.columns
    meta = json.loads((folder / "index.json").read_text())
    assert meta["phash_flat_rules"] == 2 and flagged_alike(idx.info, cols)
    assert not flagged_alike(idx.info, [c for c in cols if c != "phash"])
    meta["phash_flat_rules"] += 1  # hashes flagged by other rules: computed again
    (folder / "index.json").write_text(json.dumps(meta))
    idx = load_index(folder)
    assert not flagged_alike(idx.info, cols)
