"""augment: parameter purity (and a hand-worked row), each transform's geometry on known patterns, both paths
against the independent reference (tests/augref.py: torchvision's jitter, PIL's bilinear), and batch == per-sample."""

from __future__ import annotations

import dataclasses
import math

import augref
import numpy as np
import pytest
import torch

from training_adapter.augment import (
    PARAM_NAMES,
    AugmentConfig,
    augment_batch,
    augment_into,
    batch_params,
    sample_params,
)
from wds_tools.errors import OptionError

S = 32
P = {n: i for i, n in enumerate(PARAM_NAMES)}


@pytest.fixture(autouse=True, params=["opencv", "torch"])
def backend(request, monkeypatch):
    """Every test runs on both CPU paths: OpenCV (installed with the train extra) and plain torch."""
    import training_adapter.augment as aug

    if request.param == "torch":
        monkeypatch.setattr(aug, "_cv2", None)
    else:
        pytest.importorskip("cv2")
    return request.param


OFF = AugmentConfig(crop=False, hflip=0, vflip=0, rot90=False, brightness=0, contrast=0)


def params(**kw) -> np.ndarray:
    p = sample_params(OFF, seed=0, epoch=0, key="x", src_size=S)
    for k, v in kw.items():
        if k == "crop":
            p[0:4] = v
        else:
            p[P[k]] = v
    return p


def marked() -> torch.Tensor:
    """Grey image with a red top-left and a green top-right corner block."""
    img = torch.full((S, S, 3), 100, dtype=torch.uint8)
    img[:4, :4] = torch.tensor([255, 0, 0], dtype=torch.uint8)
    img[:4, -4:] = torch.tensor([0, 255, 0], dtype=torch.uint8)
    return img


def run(img: torch.Tensor, p: np.ndarray, cfg: AugmentConfig = OFF, size: int = S) -> torch.Tensor:
    out = torch.empty(size, size, 3, dtype=torch.uint8)
    augment_into(img, p, out, cfg)
    return out


def red(img) -> tuple[int, int]:
    ys, xs = np.nonzero((img[..., 0] == 255).numpy())
    return int(ys.mean() > S / 2), int(xs.mean() > S / 2)  # (bottom?, right?)


def test_identity_is_bit_exact():
    img = marked()
    assert torch.equal(run(img, params()), img)
    assert torch.equal(
        augment_batch(img.permute(2, 0, 1)[None], params()[None], config=OFF)[0].round().to(torch.uint8),
        img.permute(2, 0, 1),
    )


@pytest.mark.parametrize(
    "kw, corner",
    [
        ({"hflip": 1}, (0, 1)),
        ({"vflip": 1}, (1, 0)),
        ({"hflip": 1, "vflip": 1}, (1, 1)),
        ({"rot90": 1}, (1, 0)),
        ({"rot90": 2}, (1, 1)),
        ({"rot90": 3}, (0, 1)),
    ],
)
def test_flips_and_turns_move_the_marked_corner(kw, corner):
    img = marked()
    out = run(img, params(**kw))
    assert red(out) == corner
    k = kw.get("rot90", 0)  # rot90 k=1 turns counter-clockwise: the top-right green block goes top-left
    if k == 1:
        assert out[0, 0].tolist() == [0, 255, 0]
    batch = augment_batch(img.permute(2, 0, 1)[None], params(**kw)[None], config=OFF)
    assert torch.equal(batch[0].round().to(torch.uint8).permute(1, 2, 0), out)  # exact permutations


def test_crop_covers_the_expected_region():
    img = torch.zeros(S, S, 3, dtype=torch.uint8)
    img[..., 0] = torch.arange(S).view(S, 1) * 4  # red = 4 * row
    img[..., 1] = torch.arange(S).view(1, S) * 4  # green = 4 * column
    top, left, h, w = 8, 4, 16, 16
    out = run(img, params(crop=(top, left, h, w)))
    # upsampled x2: output row r samples source row top + (r + 0.5) / 2 - 0.5
    assert out[..., 0].min() == 4 * top and out[..., 0].max() == 4 * (top + h - 1)
    assert out[..., 1].min() == 4 * left and out[..., 1].max() == 4 * (left + w - 1)
    assert abs(int(out[S // 2, 0, 0]) - 4 * (top + h / 2 - 0.25)) <= 1
    same = run(img, params(crop=(top, left, S, S - left)), size=S)
    assert same.shape == (S, S, 3)


def test_params_are_pure_and_vary():
    cfg = AugmentConfig()
    a = sample_params(cfg, seed=1, epoch=0, key="k1", src_size=224)
    assert np.array_equal(a, sample_params(cfg, seed=1, epoch=0, key="k1", src_size=224))
    assert not np.array_equal(a, sample_params(cfg, seed=1, epoch=1, key="k1", src_size=224))
    assert not np.array_equal(a, sample_params(cfg, seed=1, epoch=0, key="k2", src_size=224))
    assert not np.array_equal(a, sample_params(cfg, seed=2, epoch=0, key="k1", src_size=224))
    many = batch_params(cfg, seed=0, epoch=0, keys=[f"k{i}" for i in range(400)], src_size=224)
    top, left, h, w = many[:, 0], many[:, 1], many[:, 2], many[:, 3]
    assert (top >= 0).all() and (top + h <= 224).all() and (left + w <= 224).all() and (h >= 1).all()
    area = h * w / 224**2
    assert area.min() > 0.07 and area.max() <= 1 and 0.4 < area.mean() < 0.7
    assert 0.4 < many[:, P["hflip"]].mean() < 0.6 and set(many[:, P["rot90"]]) == {0, 1, 2, 3}
    assert (np.abs(many[:, P["brightness"]] - 1) <= 0.2).all() and many[:, P["brightness"]].std() > 0.05
    assert (many[:, P["angle"]] == 0).all()  # affine_p defaults to 0
    aff = batch_params(dataclasses.replace(cfg, affine_p=1.0), seed=0, epoch=0, keys=["a", "b"], src_size=224)
    assert (np.abs(aff[:, P["angle"]]) <= 10).all() and (aff[:, P["angle"]] != 0).all()


def test_switches_turn_steps_off():
    p = sample_params(OFF, seed=0, epoch=3, key="z", src_size=S)
    assert p[0:4].tolist() == [0, 0, S, S] and p[4:7].tolist() == [0, 0, 0]
    assert p[P["brightness"]] == p[P["contrast"]] == p[P["saturation"]] == 1


def test_jitter_on_flat_colour():
    img = torch.full((S, S, 3), 100, dtype=torch.uint8)
    out = run(img, params(brightness=1.2), cfg=dataclasses.replace(OFF, brightness=0.2))
    assert (out == 120).all()
    out = run(img, params(contrast=0.5), cfg=dataclasses.replace(OFF, contrast=0.2))
    assert (out == 100).all()  # contrast keeps a flat image at its mean


@pytest.mark.parametrize("cfg", [AugmentConfig(), AugmentConfig(saturation=0.4, size=48)])
def test_batch_path_matches_per_sample_path(cfg):
    rng = np.random.default_rng(0)
    coarse = torch.from_numpy(rng.integers(0, 256, (8, 3, 8, 8), dtype=np.uint8)).float()
    imgs = torch.nn.functional.interpolate(coarse, size=(S, S), mode="bilinear").round().to(torch.uint8)
    keys = [f"s{i}" for i in range(8)]
    p = batch_params(cfg, seed=5, epoch=2, keys=keys, src_size=S)
    O = cfg.size or S
    cpu = torch.stack([run(imgs[i].permute(1, 2, 0), p[i], cfg, O) for i in range(8)]).permute(0, 3, 1, 2)
    batch = augment_batch(imgs, keys, config=cfg, seed=5, epoch=2)
    assert batch.shape == (8, 3, O, O) and batch.dtype == torch.float32
    diff = (batch.round() - cpu.float()).abs()
    # interpolation and rounding; within a few pixels of the crop border, interpolate clamps to the
    # crop while grid_sample reads the neighbouring source pixels
    assert diff[:, :, 4:-4, 4:-4].max() <= 3
    assert diff.mean() < 0.6
    assert torch.equal(batch, augment_batch(imgs, p, config=cfg))


def test_affine_rotation_turns_the_image():
    img = marked().permute(2, 0, 1)[None]
    for angle, k in ((90.0, 3), (-90.0, 1)):  # a positive angle turns clockwise (y points down)
        out = augment_batch(img, params(angle=angle)[None], config=OFF)[0]
        turned = augment_batch(img, params(rot90=k)[None], config=OFF)[0]
        assert (out - turned).abs().max() < 0.01
    shifted = augment_batch(img, params(tx=0.25)[None], config=OFF)[0]
    assert shifted[0, 0, 8].item() == 255 and shifted[0, 0, 0].item() == 255  # moved right by 8 px, edge clamped


def test_normalised_output():
    img = torch.full((1, 3, S, S), 255, dtype=torch.uint8)
    out = augment_batch(img, params()[None], config=OFF, mean=[0.5] * 3, std=[0.25] * 3)
    assert torch.allclose(out, torch.full_like(out, 2.0))


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"hflip": 2}, r"augment.hflip=2: expected a probability"),
        ({"crop_scale": [0.5, 0.1]}, r"augment.crop_scale=.*min <= max"),
        ({"brightness": -1}, r"augment.brightness=-1: expected a number >= 0"),
        ({"size": 0}, r"augment.size=0"),
        ({"wobble": 1}, r"unknown setting 'wobble'"),
    ],
)
def test_config_errors(kw, msg):
    with pytest.raises(OptionError, match=msg):
        AugmentConfig.from_dict(kw)


def test_augment_batch_shape_errors():
    with pytest.raises(OptionError, match=r"expected images \[B, 3, S, S\]"):
        augment_batch(torch.zeros(2, 4, 4, 3, dtype=torch.uint8), ["a", "b"])
    with pytest.raises(OptionError, match=r"expected params \[2, 14\]"):
        augment_batch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), np.zeros((3, 14)))


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("hflip", [0, 1])
@pytest.mark.parametrize("vflip", [0, 1])
def test_flips_and_turns_compose_like_torch(hflip, vflip, k):
    """The CPU path folds flips and turns into one flip and a transpose: same pixels as doing each."""
    img = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (S, S, 3), dtype=np.uint8))
    want = img
    if hflip:
        want = want.flip(1)
    if vflip:
        want = want.flip(0)
    want = torch.rot90(want, k, dims=(0, 1))
    assert torch.equal(run(img, params(hflip=hflip, vflip=vflip, rot90=k)), want)
    # with a crop and a resize as well: the same as resizing the transformed crop
    box = (3, 5, 20, 14)
    crop = img[3:23, 5:19]
    if hflip:
        crop = crop.flip(1)
    if vflip:
        crop = crop.flip(0)
    crop = torch.rot90(crop, k, dims=(0, 1))
    ref = torch.nn.functional.interpolate(
        crop.permute(2, 0, 1)[None].float(), size=(S, S), mode="bilinear", antialias=True, align_corners=False
    )[0].permute(1, 2, 0)
    got = run(img, params(crop=box, hflip=hflip, vflip=vflip, rot90=k)).float()
    assert (got - ref).abs().max() <= 1


def test_resize_writes_the_batch_like_interpolate():
    from training_adapter.augment import _resize_into

    x = torch.from_numpy(np.random.default_rng(2).integers(0, 256, (1, 3, 40, 27), dtype=np.uint8))
    x = x.contiguous(memory_format=torch.channels_last)
    for size in (64, 16):  # up and down (antialiased)
        out = torch.empty(size, size, 3, dtype=torch.uint8)
        _resize_into(x, out)
        ref = torch.nn.functional.interpolate(
            x, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        assert torch.equal(out, ref[0].permute(1, 2, 0))


# --- against the independent reference (tests/augref.py) ------------------------------------


def _identity_jitter(img: torch.Tensor, b: float, c: float, s: float) -> torch.Tensor:
    """augment_into with every geometric step off: only the jitter, with these factors."""
    return run(img, params(brightness=b, contrast=c, saturation=s), cfg=dataclasses.replace(OFF, brightness=0.5))


@pytest.mark.parametrize(
    "b, c, s",
    [
        (1.2, 0.8, 1),
        (0.8, 1.2, 1),
        (1.0, 1.2, 1),
        (2.0, 2.0, 1),
        (0.05, 1.9, 1),
        (1.1, 0.9, 0.6),
        (0.9, 1.15, 1.4),
        (1, 1, 0),
    ],
)
def test_jitter_is_the_documented_composition_of_torchvisions_definitions(b: float, c: float, s: float) -> None:
    """OpenCV, torch's int16 (default ranges) and int32 (wide ranges) fixed point and the 3x3 map
    (saturation) against brightness, contrast and saturation written from torchvision's definitions,
    clamped once at the end as augment documents ("fused into one per-pixel linear map"): within 1
    level (0.5 for the final rounding, at most 0.5 more from coefficients rounded to 1/256)."""
    img = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (S, S, 3), dtype=np.uint8))
    want = augref.jitter(img.numpy(), b, c, s)
    assert np.abs(_identity_jitter(img, b, c, s).numpy() - want).max() <= 1


@pytest.mark.parametrize("b", [0.8, 1.2])
@pytest.mark.parametrize("c", [0.8, 1.2])
@pytest.mark.parametrize("s", [0.8, 1.2])
def test_jitter_is_torchvisions_color_jitter_where_no_step_clamps(b: float, c: float, s: float) -> None:
    """At the corners of the default ranges, on an image whose every intermediate value stays in
    0..255, torchvision's step-by-step clamping never acts: the jitter is torchvision's, within 1."""
    rng = np.random.default_rng(4)
    img = rng.integers(70, 181, (S, S, 3), dtype=np.uint8)
    x1 = b * img.astype(float)  # each step unclamped: the precondition, checked
    x2 = c * x1 + (1 - c) * (x1 @ augref.GREY).mean()
    x3 = s * x2 + (1 - s) * (x2 @ augref.GREY)[..., None]
    assert all(0 <= x.min() and x.max() <= 255 for x in (x1, x2, x3))
    want = augref.jitter(img, b, c, s, clamp_each=True)
    assert np.abs(_identity_jitter(torch.from_numpy(img), b, c, s).numpy() - want).max() <= 1


def test_jitter_differs_from_torchvision_where_brightness_clamps() -> None:
    """The documented difference, worked by hand: half the pixels 250, half 50 (mean grey 150),
    brightness 1.2 then contrast 0.8. torchvision clamps after brightness: 300 -> 255 and 60, mean
    157.5, then 0.8 * 255 + 0.2 * 157.5 = 235.5 and 0.8 * 60 + 31.5 = 79.5. The fused map does not:
    0.96 * 250 + 0.2 * 1.2 * 150 = 276 -> 255 and 0.96 * 50 + 36 = 84."""
    img = torch.full((S, S, 3), 50, dtype=torch.uint8)
    img[: S // 2] = 250
    out = _identity_jitter(img, 1.2, 0.8, 1)
    assert set(out[: S // 2].flatten().tolist()) == {255} and set(out[S // 2 :].flatten().tolist()) == {84}
    tv = augref.jitter(img.numpy(), 1.2, 0.8, 1, clamp_each=True)
    assert np.allclose(tv[: S // 2], 235.5) and np.allclose(tv[S // 2 :], 79.5)


def test_the_reference_jitter_is_pils_image_enhance() -> None:
    """The reference's torchvision definitions against PIL's ImageEnhance (Brightness, Contrast,
    Color: the same blends, PIL rounding its mean grey and truncating every step to uint8): within
    3 levels (three truncations, each under 1 and scaled by the later factors)."""
    from PIL import Image, ImageEnhance

    img = np.random.default_rng(5).integers(0, 256, (S, S, 3), dtype=np.uint8)
    for b, c, s in ((1.2, 0.8, 1.3), (0.8, 1.2, 0.7), (1.1, 1.1, 1.0)):
        im = Image.fromarray(img)
        for enhance, f in ((ImageEnhance.Brightness, b), (ImageEnhance.Contrast, c), (ImageEnhance.Color, s)):
            im = enhance(im).enhance(f)
        assert np.abs(np.asarray(im) - augref.jitter(img, b, c, s, clamp_each=True)).max() <= 3


def test_the_reference_resize_is_pils_bilinear() -> None:
    """The reference's triangle filter against PIL's BILINEAR resize of float images (mode F), up and down."""
    from PIL import Image

    img = np.random.default_rng(6).uniform(0, 255, (20, 13)).astype(np.float32)
    for h, w in ((37, 50), (7, 5), (20, 6)):
        pil = np.asarray(Image.fromarray(img, "F").resize((w, h), Image.Resampling.BILINEAR))
        assert np.abs(augref.resize(img[..., None], h, w)[..., 0] - pil).max() < 1e-3


@pytest.mark.parametrize(
    "cfg",
    [
        AugmentConfig(),
        AugmentConfig(size=48),
        AugmentConfig(size=20, saturation=0.4),
        AugmentConfig(brightness=1, contrast=1, saturation=1, size=40),
    ],
)
def test_per_sample_and_batch_paths_match_the_reference(cfg: AugmentConfig) -> None:
    """augment_into (crop, resize inside the crop, flips, turns, jitter) and augment_batch (every step
    by sampling, with and without the affine) against the reference, sample by sample, from the same
    parameter rows. augment_into: max |diff| <= 1 + G, G the jitter's gain b·c·(s + |1 - s|): the
    resized crop is rounded to uint8 by a fixed-point resize (under 1 level), the jitter scales that
    by up to G and rounds again; mean |diff| < 0.75. augment_batch: float32 rounding only (< 0.01)."""
    rng = np.random.default_rng(7)
    coarse = torch.from_numpy(rng.integers(0, 256, (6, 3, 5, 5), dtype=np.uint8)).float()
    imgs = torch.nn.functional.interpolate(coarse, size=(S, S), mode="bicubic").clamp(0, 255).round().to(torch.uint8)
    O = cfg.size or S
    for epoch in range(3):
        keys = [f"s{i}" for i in range(len(imgs))]
        p = batch_params(cfg, seed=1, epoch=epoch, keys=keys, src_size=S)
        for i in range(len(imgs)):
            src = imgs[i].permute(1, 2, 0).contiguous()
            d = np.abs(run(src, p[i], cfg, O).numpy() - augref.augment_reference(src.numpy(), p[i], out=O))
            b, c, s = p[i, P["brightness"]], p[i, P["contrast"]], p[i, P["saturation"]]
            assert d.max() <= 1 + b * c * (s + abs(1 - s)) and d.mean() < 0.75
        for affine_cfg in (cfg, dataclasses.replace(cfg, affine_p=1.0)):
            pa = batch_params(affine_cfg, seed=1, epoch=epoch, keys=keys, src_size=S)
            got = augment_batch(imgs, pa, config=affine_cfg).permute(0, 2, 3, 1).numpy()
            want = np.stack(
                [
                    augref.augment_reference(im.permute(1, 2, 0).numpy(), row, out=O, sampled=True)
                    for im, row in zip(imgs, pa)
                ]
            )
            assert np.abs(got - want).max() < 0.01


def test_sample_params_hand_worked() -> None:
    """sample_params for seed 0, epoch 0, key "k", a 224 px source, against values worked by hand from
    BLAKE2b-512 of b"0\\x000\\x00k" (coreutils: printf '0\\0000\\000k' | b2sum -l 512 gives
    d52e39db 2bb6757a 397aca6c 27c60f25 945f7826 48214d5c 3c9f919a 5ca3ef14 2a85791a 780e1b53 af339958
    ff0e1978 5edafb96 eec3d7d6 10d52f03 3b4da7b3; each 4 bytes little-endian / 2^32 is one uniform u_i).

    defaults: area = 224² (0.08 + 0.92 u0), u0 = 0xdb392ed5 / 2^32 = 0.856341 -> 43544.4; ratio =
    exp(ln 3/4 + ln(16/9) u1), u1 = 0.478359 -> 0.987626; w = round(sqrt(43544.4 · 0.987626)) =
    round(207.38) = 207, h = round(sqrt(43544.4 / 0.987626)) = round(209.98) = 210; top = int(u2 ·
    (224 - 210 + 1)) = int(0.424965 · 15) = 6, left = int(u3 · 18) = int(0.144772 · 18) = 2; hflip
    u4 = 0.150 < 0.5: 1; vflip u5 = 0.361 < 0.5: 1; rot90 int(4 u6) = int(2.415) = 2; affine u7 =
    0.0818 >= affine_p 0: angle 0, shift 0, scale 1; brightness 1 + 0.2 (2 u12 - 1) = 1 + 0.2 · 0.179561
    = 1.035912; contrast 1 + 0.2 (2 · 0.839230 - 1) = 1.135692; saturation 0: factor 1.
    affine_p 0.5: u7 < 0.5, angle 10 (2 u8 - 1) = 10 (2 · 0.103417 - 1) = -7.931665; tx = 0.05 (2 u9 - 1)
    = 0.05 (2 · 0.324632 - 1) = -0.017537; ty = 0.05 (2 · 0.346088 - 1) = -0.015391; scale 0.9 + 0.2 u11
    = 0.9 + 0.2 · 0.469132 = 0.993826.
    """
    assert np.allclose(
        augref.uniforms(0, 0, "k")[[0, 1, 2, 3, 12, 13]],
        [
            0xDB392ED5 / 2**32,
            0x7A75B62B / 2**32,
            0x6CCA7A39 / 2**32,
            0x250FC627 / 2**32,
            0x96FBDA5E / 2**32,
            0xD6D7C3EE / 2**32,
        ],
        rtol=0,
        atol=1e-15,
    )
    want = [6, 2, 210, 207, 1, 1, 2, 0, 0, 0, 1, 1.035912, 1.135692, 1]
    got = sample_params(AugmentConfig(), seed=0, epoch=0, key="k", src_size=224)
    assert np.allclose(got, want, rtol=0, atol=1e-6)
    aff = sample_params(AugmentConfig(affine_p=0.5), seed=0, epoch=0, key="k", src_size=224)
    assert np.allclose(aff, want[:7] + [-7.931665, -0.017537, -0.015391, 0.993826] + want[11:], rtol=0, atol=1e-6)
    assert list(PARAM_NAMES) == list(augref.PARAM_ORDER)


def _torchvision_get_params(
    rng: np.random.Generator, S: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (torchvision/transforms/transforms.py) on an S x S image,
    restated line by line with numpy's generator in place of torch's."""
    height = width = S
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def _clamped_crop(u: np.ndarray, S: int) -> tuple[int, int]:
    """The crop before issue 23 (one draw, each side clamped to the image): (h, w), to show the check can fail."""
    area = S * S * (0.08 + 0.92 * u[0])
    ratio = math.exp(math.log(3 / 4) + math.log(16 / 9) * u[1])
    return min(S, max(1, round(math.sqrt(area / ratio)))), min(S, max(1, round(math.sqrt(area * ratio))))


def _percentiles_close(a: np.ndarray, b: np.ndarray, span: float) -> bool:
    return bool(np.all(np.abs(np.percentile(a, [10, 50, 90]) - np.percentile(b, [10, 50, 90])) <= 0.02 * span))


@pytest.mark.parametrize("backend", ["opencv"], indirect=True)  # the draw does not depend on the pixel backend
def test_crop_draws_like_torchvision(backend: str) -> None:
    """20,000 default crops of a 1000 px square: area fraction and aspect (w/h) at the 10th/50th/90th
    percentiles within 2% of their span (0.92 and 4/3 - 3/4) of torchvision's get_params, restated in this
    file from its source (and torchvision itself where it imports); the old clamped draw fails the same check."""
    S, n = 1000, 20000
    rows = batch_params(AugmentConfig(), seed=3, epoch=0, keys=[f"k{i}" for i in range(n)], src_size=S)
    h, w = rows[:, P["height"]], rows[:, P["width"]]
    assert (rows[:, P["top"]] + h <= S).all() and (rows[:, P["left"]] + w <= S).all() and (rows[:, 0:2] >= 0).all()
    ours = (h * w / S**2, w / h)
    rng = np.random.default_rng(11)
    tv = np.array([_torchvision_get_params(rng, S, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(n)], float)
    refs = [("restated", (tv[:, 2] * tv[:, 3] / S**2, tv[:, 3] / tv[:, 2]))]
    try:
        from torchvision.transforms import RandomResizedCrop
    except ImportError:
        pass
    else:
        torch.manual_seed(0)
        img = torch.empty(3, S, S, dtype=torch.uint8)
        got = np.array([RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(n)], float)
        refs.append(("torchvision", (got[:, 2] * got[:, 3] / S**2, got[:, 3] / got[:, 2])))
    spans = (0.92, 4 / 3 - 3 / 4)
    for name, ref in refs:
        for q, (a, b, span) in enumerate(zip(ours, ref, spans)):
            assert _percentiles_close(a, b, span), (
                name,
                q,
                np.percentile(a, [10, 50, 90]),
                np.percentile(b, [10, 50, 90]),
            )
    old = np.array([_clamped_crop(augref.uniforms(3, 0, f"k{i}"), S) for i in range(n)], float)
    assert not _percentiles_close(old[:, 0] * old[:, 1] / S**2, refs[0][1][0], spans[0])


@pytest.mark.parametrize("backend", ["opencv"], indirect=True)
@pytest.mark.parametrize(
    "cfg",
    [
        AugmentConfig(),
        AugmentConfig(crop_scale=(0.6, 1.0)),
        AugmentConfig(crop_ratio=(1.5, 2.0), crop_scale=(0.9, 1.0)),
        AugmentConfig(crop_ratio=(0.25, 0.5), crop_scale=(0.95, 1.0), affine_p=0.5, saturation=0.3),
    ],
)
def test_sample_params_follow_the_documented_rule(backend: str, cfg: AugmentConfig) -> None:
    """sample_params against augref.params_row (the rule restated from the docs: torchvision's attempts over
    u0, u1 and SHAKE-256's 18 uniforms, the centre crop with the ratio clamped), row for row, with configs
    that reach later attempts and the fallback."""
    S = 97
    keys = [f"s{i}" for i in range(1500)]
    got = batch_params(cfg, seed=5, epoch=2, keys=keys, src_size=S)
    want = np.stack([augref.params_row(cfg, 5, 2, k, S) for k in keys])
    assert np.array_equal(got, want)


def test_crop_fallback_hand_worked() -> None:
    """Ratios (1.5, 2) at scale (0.9, 1) on a 100 px square never fit (w = sqrt(area · ratio) >= sqrt(9000 · 1.5)
    = 116 > 100): every attempt fails, and torchvision's centre crop is w = 100, h = round(100 / 1.5) = 67,
    top = (100 - 67) // 2 = 16."""
    cfg = AugmentConfig(crop_ratio=(1.5, 2.0), crop_scale=(0.9, 1.0))
    for k in ("a", "b", "c"):
        assert sample_params(cfg, seed=0, epoch=0, key=k, src_size=100)[0:4].tolist() == [16, 0, 67, 100]


def test_constant_tensors_are_made_once_per_device(monkeypatch):
    """After the first call, augment_batch and normalize build no tensor from a Python list: on CUDA each
    such build is a synchronous copy, the host waiting for the stream's earlier work (the previous step)."""
    from training_adapter.augment import batch_params, normalize

    cfg = AugmentConfig(saturation=0.2, affine_p=1.0)
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    p = torch.as_tensor(batch_params(cfg, seed=0, epoch=0, keys=["a", "b"], src_size=8), dtype=torch.float32)
    first = augment_batch(x, p, config=cfg, mean=[0.5, 0.4, 0.3], std=[0.2, 0.2, 0.25])
    made = []
    for name in ("tensor", "as_tensor"):
        monkeypatch.setattr(torch, name, _counting(getattr(torch, name), made))
    again = augment_batch(x, p, config=cfg, mean=[0.5, 0.4, 0.3], std=[0.2, 0.2, 0.25])
    normalize(x.float(), [0.5, 0.4, 0.3], [0.2, 0.2, 0.25])
    monkeypatch.undo()
    assert made == [] and torch.equal(first, again)


def _counting(real, made: list):
    """``real`` (torch.tensor, torch.as_tensor), noting each Python list or tuple it is given."""

    def call(*a, **k):
        if isinstance(a[0], list | tuple):
            made.append(a[0])
        return real(*a, **k)

    return call


def test_augment_batch_and_normalize_ignore_an_enclosing_autocast():
    """Under a training loop's torch.autocast (bfloat16 here, on the CPU) the crop's placement and the
    luma are still computed in float32: the result equals the one without autocast (it was off by up to
    79 grey levels), and the caller's autocast is as it was afterwards."""
    from training_adapter.augment import normalize

    cfg = AugmentConfig(affine_p=1.0, saturation=0.3)
    x = torch.randint(0, 256, (8, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    keys = [f"k{i}" for i in range(8)]
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    want = augment_batch(x, keys, config=cfg, seed=1, epoch=2)
    want_norm = augment_batch(x, keys, config=cfg, seed=1, epoch=2, mean=mean, std=std)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = augment_batch(x, keys, config=cfg, seed=1, epoch=2)
        got_norm = augment_batch(x, keys, config=cfg, seed=1, epoch=2, mean=mean, std=std)
        plain = normalize(x.float(), mean, std)
        still = torch.is_autocast_enabled("cpu")
    assert still and got.dtype == got_norm.dtype == plain.dtype == torch.float32
    assert torch.equal(got, want) and torch.equal(got_norm, want_norm)
    assert torch.equal(plain, normalize(x.float(), mean, std))


def test_constants_kept_are_never_let_go_of(monkeypatch):
    """Past the number kept (many different mean/std values), new constants are made per call; those
    kept stay the same tensors (one let go of could have its memory handed to another stream's tensor
    while a kernel queued earlier still reads it)."""
    import training_adapter.augment as aug

    monkeypatch.setattr(aug, "_CONSTS", {})
    cpu = torch.device("cpu")
    kept = [aug._const([float(i)], torch.float32, cpu) for i in range(3)]
    extra = [aug._const([10.0 + i], torch.float32, cpu) for i in range(300)]
    assert all(aug._const([float(i)], torch.float32, cpu) is t for i, t in enumerate(kept))
    assert len(aug._CONSTS) <= 300 and extra[-1].item() == 309.0
    assert aug._const([309.0], torch.float32, cpu) is not extra[-1]  # past the limit: made per call
