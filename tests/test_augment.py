"""augment: parameter purity, each transform's geometry on known patterns, and batch == per-sample."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from training_adapter.augment import PARAM_NAMES, AugmentConfig, augment_batch, augment_into, batch_params, sample_params
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
    assert torch.equal(augment_batch(img.permute(2, 0, 1)[None], params()[None], config=OFF)[0].round().to(torch.uint8),
                       img.permute(2, 0, 1))


@pytest.mark.parametrize("kw, corner", [
    ({"hflip": 1}, (0, 1)), ({"vflip": 1}, (1, 0)), ({"hflip": 1, "vflip": 1}, (1, 1)),
    ({"rot90": 1}, (1, 0)), ({"rot90": 2}, (1, 1)), ({"rot90": 3}, (0, 1)),
])
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


@pytest.mark.parametrize("kw, msg", [
    ({"hflip": 2}, r"augment.hflip=2: expected a probability"),
    ({"crop_scale": [0.5, 0.1]}, r"augment.crop_scale=.*min <= max"),
    ({"brightness": -1}, r"augment.brightness=-1: expected a number >= 0"),
    ({"size": 0}, r"augment.size=0"),
    ({"wobble": 1}, r"unknown setting 'wobble'"),
])
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
    ref = torch.nn.functional.interpolate(crop.permute(2, 0, 1)[None].float(), size=(S, S), mode="bilinear",
                                          antialias=True, align_corners=False)[0].permute(1, 2, 0)
    got = run(img, params(crop=box, hflip=hflip, vflip=vflip, rot90=k)).float()
    assert (got - ref).abs().max() <= 1


def test_resize_writes_the_batch_like_interpolate():
    from training_adapter.augment import _resize_into

    x = torch.from_numpy(np.random.default_rng(2).integers(0, 256, (1, 3, 40, 27), dtype=np.uint8))
    x = x.contiguous(memory_format=torch.channels_last)
    for size in (64, 16):  # up and down (antialiased)
        out = torch.empty(size, size, 3, dtype=torch.uint8)
        _resize_into(x, out)
        ref = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                                              align_corners=False)
        assert torch.equal(out, ref[0].permute(1, 2, 0))


@pytest.mark.parametrize("b, c", [(1.2, 0.8), (0.8, 1.2), (1.0, 1.2), (2.0, 2.0), (0.05, 1.9)])
def test_jitter_is_within_rounding_of_float(b, c):
    """OpenCV, or torch's int16 (default ranges) and int32 (wide ranges) fixed point, against the float map."""
    from training_adapter.augment import _jitter_, _jitter_float, _luma_mean

    img = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (S, S, 3), dtype=np.uint8))
    p = params(brightness=b, contrast=c)
    out = img.clone()
    _jitter_(out, p)
    assert abs(_luma_mean(img) - float(_gray_mean_ref(img))) < 1e-3
    ref = _jitter_float(img.permute(2, 0, 1)[None].float(), torch.as_tensor(p[None], dtype=torch.float32))
    ref = ref.clamp(0, 255)[0].permute(1, 2, 0)
    assert (out.float() - ref).abs().max() <= 1


def _gray_mean_ref(img_hwc):
    from training_adapter.augment import _gray_mean

    return _gray_mean(img_hwc.permute(2, 0, 1)[None])[0]
