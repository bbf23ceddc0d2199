"""The perceptual hash (format.phash) against an independent implementation written from docs/FORMAT.md
("The perceptual hash"): scipy's DCT over a grey image area-averaged by pixel replication, on real photos."""

from __future__ import annotations

import numpy as np
import pytest
from phashref import doc_hash
from PIL import Image

from wds_tools.format.phash import distance, phash, phash_batch, variants

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


@pytest.mark.parametrize("side", [8, 50, 64, 100, 224])
def test_the_hash_is_the_documented_recipe(side):
    ims = photos()
    crops = (
        [square(im, side) for im in ims]
        + [square(im, side, (0, 0, 200, 200)) for im in ims]
        + [square(im, side, (300, 100, 500, 300)) for im in ims]
    )
    got = phash_batch(np.stack(crops))
    for i, c in enumerate(crops):
        want = doc_hash(c)
        assert int(got[i]) == phash(c) == want, (side, i, f"{int(got[i]):016x} != {want:016x}")
        assert want >> 63 == 0  # the DC bit


def test_flips_and_quarter_turns_are_the_documented_variants():
    im = square(photos()[0], 224)
    h = phash(im)
    v = variants(h)
    assert v[0] == h and len(set(v)) == 8
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
        assert doc_hash(t) in v
        assert distance(h, doc_hash(t)) == 0 and distance(doc_hash(t), h) == 0


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


def test_imagehash_agrees_where_the_recipes_agree():
    """A cross-check with imagehash's DCT (where installed): its pHash keeps the 8x8 block's bits by
    the median, ours by sign; on the same 32x32 grey image the AC coefficients far from zero and the
    median agree in sign for most bits."""
    imagehash = pytest.importorskip("imagehash")
    ims = [square(im, 224) for im in photos()]
    for im in ims:
        theirs = imagehash.phash(Image.fromarray(im), hash_size=8, highfreq_factor=4).hash.reshape(-1)
        ours = np.array([(phash(im) >> (63 - i)) & 1 for i in range(64)], dtype=bool)
        assert (theirs[1:] == ours[1:]).mean() >= 0.75


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"\[N, S, S, 3\]"):
        phash_batch(np.zeros((2, 8, 9, 3), np.uint8))
