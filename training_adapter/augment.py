"""Augment: random per-sample transforms in plain torch, on uint8 images.

Parameters are a pure function of (config, seed, epoch, sample key, source size), so workers, ranks
and batch order change nothing. ``augment_into`` applies them per sample on the CPU, ``augment_batch``
per batch on any device (the order and the two paths: docs/guide/loader-internals.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

try:  # the train extra installs it; without it the same transforms run in torch, about 2x slower
    import cv2 as _cv2
except ImportError:  # pragma: no cover - exercised by monkeypatching _cv2 in the tests
    _cv2 = None  # type: ignore[assignment]  # the module, or None without the train extra

from wds_tools.errors import OptionError

__all__ = [
    "AugmentConfig",
    "PARAM_NAMES",
    "sample_params",
    "batch_params",
    "augment_into",
    "augment_batch",
    "normalize",
]

PARAM_NAMES = (
    "top",
    "left",
    "height",
    "width",
    "hflip",
    "vflip",
    "rot90",
    "angle",
    "tx",
    "ty",
    "scale",
    "brightness",
    "contrast",
    "saturation",
)
"""The columns of a params array (one row per sample), in this order."""
_P = {n: i for i, n in enumerate(PARAM_NAMES)}
_GRAY = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL and torchvision use


@dataclass(frozen=True)
class AugmentConfig:
    """Training augmentation settings; each step is switched off by its zero/False value.

    Defaults (all fast enough for the CPU path): random resized crop with scale (0.08, 1) and
    ratio (3/4, 4/3), drawn as torchvision's ``RandomResizedCrop`` draws it, to ``size`` (None: the
    stored size), horizontal and vertical flips with probability 0.5, random quarter turns,
    brightness and contrast jitter of ±0.2.
    Off by default because of their CPU cost, and free with ``device_augment``: saturation
    (a per-pixel grey term, ~0.3 ms per 224 px sample on the CPU) and the small affine
    (``affine_p``; on the CPU the loader then runs ``augment_batch``, ~3 ms per sample).
    """

    size: int | None = None
    crop: bool = True
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    vflip: float = 0.5
    rot90: bool = True
    affine_p: float = 0.0
    affine_degrees: float = 10.0
    affine_translate: float = 0.05
    affine_scale: tuple[float, float] = (0.9, 1.1)
    brightness: float = 0.2
    contrast: float = 0.2
    saturation: float = 0.0

    def __post_init__(self) -> None:
        def pair(name: str, lo: float, hi: float | None) -> None:
            v = getattr(self, name)
            try:
                a, b = (float(x) for x in v)
            except (TypeError, ValueError):
                raise OptionError(f"augment.{name}={v!r}: expected two numbers [min, max]") from None
            if not (lo <= a <= b and (hi is None or b <= hi)):
                raise OptionError(
                    f"augment.{name}={v!r}: expected {lo} <= min <= max" + (f" <= {hi}" if hi is not None else "")
                )
            object.__setattr__(self, name, (a, b))

        pair("crop_scale", 1e-6, 1.0)
        pair("crop_ratio", 1e-3, None)
        pair("affine_scale", 1e-3, None)
        for name in ("hflip", "vflip", "affine_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise OptionError(f"augment.{name}={v!r}: expected a probability between 0 and 1")
        for name in ("brightness", "contrast", "saturation", "affine_degrees", "affine_translate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise OptionError(f"augment.{name}={v!r}: expected a number >= 0 (0 switches it off)")
        for name in ("brightness", "contrast", "saturation"):
            if getattr(self, name) > 1:
                raise OptionError(f"augment.{name}={getattr(self, name)!r}: expected at most 1 (factor 1 ± value)")
        if self.size is not None and (isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1):
            raise OptionError(f"augment.size={self.size!r}: expected a positive number of pixels or null")
        for name in ("crop", "rot90"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"augment.{name}={getattr(self, name)!r}: expected true or false")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> AugmentConfig:
        """The settings of a config file's or ``make_loader``'s ``augment`` mapping (lists as tuples)."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise OptionError(
                f"augment: unknown setting {', '.join(map(repr, unknown))}; expected some of {', '.join(sorted(known))}"
            )
        kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a mapping ``from_dict`` reads back."""
        return asdict(self)

    @property
    def jitter(self) -> bool:
        """Whether any colour jitter (brightness, contrast, saturation) is on."""
        return bool(self.brightness or self.contrast or self.saturation)


def _uniforms(seed: int, epoch: int, key: str) -> np.ndarray:
    """16 uniforms in [0, 1) from BLAKE2b-512 of (seed, epoch, key): pure and worker-independent."""
    h = hashlib.blake2b(f"{seed}\x00{epoch}\x00{key}".encode(), digest_size=64).digest()
    return np.frombuffer(h, dtype="<u4") * (1.0 / 2**32)


def _crop_attempts(seed: int, epoch: int, key: str) -> np.ndarray:
    """18 more uniforms for the crop's attempts 2 to 10: SHAKE-256 of (seed, epoch, key, "crop"), 72 bytes."""
    h = hashlib.shake_256(f"{seed}\x00{epoch}\x00{key}\x00crop".encode()).digest(72)
    return np.frombuffer(h, dtype="<u4") * (1.0 / 2**32)


def _crop_box(
    cfg: AugmentConfig, u: np.ndarray, src_size: int, more: Callable[[], np.ndarray]
) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the random resized crop, drawn as torchvision's
    ``RandomResizedCrop.get_params`` draws it: up to 10 attempts of (area, log-uniform ratio), the
    first that fits kept, else the centre crop with the ratio clamped. Attempt 1 takes u0, u1;
    attempts 2-10 take pairs of ``more()`` (called only when attempt 1 does not fit); the position
    takes u2, u3."""
    S = src_size
    lo, hi = cfg.crop_scale
    lr0, lr1 = math.log(cfg.crop_ratio[0]), math.log(cfg.crop_ratio[1])
    extra: np.ndarray | None = None
    for attempt in range(10):
        if attempt == 0:
            ua, ur = u[0], u[1]
        else:
            if extra is None:
                extra = more()
            ua, ur = extra[2 * attempt - 2], extra[2 * attempt - 1]
        area = S * S * (lo + (hi - lo) * ua)
        ratio = math.exp(lr0 + (lr1 - lr0) * ur)
        w = int(round(math.sqrt(area * ratio)))
        h = int(round(math.sqrt(area / ratio)))
        if 0 < w <= S and 0 < h <= S:
            return int(u[2] * (S - h + 1)), int(u[3] * (S - w + 1)), h, w
    # the centre crop: the whole (square) image unless the ratio range excludes 1
    w = h = S
    if 1 < cfg.crop_ratio[0]:
        h = int(round(S / cfg.crop_ratio[0]))
    elif 1 > cfg.crop_ratio[1]:
        w = int(round(S * cfg.crop_ratio[1]))
    return (S - h) // 2, (S - w) // 2, h, w


def sample_params(cfg: AugmentConfig, *, seed: int, epoch: int, key: str, src_size: int) -> np.ndarray:
    """The transform of one sample as a float64 row (``PARAM_NAMES``); crop box in source pixels."""
    u = _uniforms(seed, epoch, key)
    S = src_size
    p = np.zeros(len(PARAM_NAMES))
    if cfg.crop:
        top, left, h, w = _crop_box(cfg, u, S, lambda: _crop_attempts(seed, epoch, key))
    else:
        top, left, h, w = 0, 0, S, S
    p[0:4] = top, left, h, w
    p[_P["hflip"]] = u[4] < cfg.hflip
    p[_P["vflip"]] = u[5] < cfg.vflip
    p[_P["rot90"]] = int(u[6] * 4) if cfg.rot90 else 0
    p[_P["scale"]] = 1.0
    if u[7] < cfg.affine_p:
        p[_P["angle"]] = cfg.affine_degrees * (2 * u[8] - 1)
        p[_P["tx"]] = cfg.affine_translate * (2 * u[9] - 1)
        p[_P["ty"]] = cfg.affine_translate * (2 * u[10] - 1)
        s0, s1 = cfg.affine_scale
        p[_P["scale"]] = s0 + (s1 - s0) * u[11]
    p[_P["brightness"]] = 1 + cfg.brightness * (2 * u[12] - 1)
    p[_P["contrast"]] = 1 + cfg.contrast * (2 * u[13] - 1)
    p[_P["saturation"]] = 1 + cfg.saturation * (2 * u[14] - 1)
    return p


def batch_params(cfg: AugmentConfig, *, seed: int, epoch: int, keys: Sequence[str], src_size: int) -> np.ndarray:
    """``sample_params`` for each key: float64 [B, len(PARAM_NAMES)]."""
    if not keys:
        return np.zeros((0, len(PARAM_NAMES)))
    return np.stack([sample_params(cfg, seed=seed, epoch=epoch, key=k, src_size=src_size) for k in keys])


def augment_into(src_hwc: torch.Tensor, p: np.ndarray, out_hwc: torch.Tensor, cfg: AugmentConfig) -> None:
    """Crop, flip, turn, resize and jitter one uint8 [S, S, 3] image into ``out_hwc`` [O, O, 3].

    Flips and quarter turns fold into at most one flip and one transpose of the crop (smaller than
    the output on average); the crop is then resized straight into the batch and the jitter runs
    in place there. OpenCV does this when it is installed (the ``train`` extra; about twice as
    fast as torch here); otherwise, and for crops larger than the output (torch antialiases when
    it shrinks), torch does. Either matches ``augment_batch`` within interpolation and rounding.
    """
    top, left, h, w = (int(v) for v in p[0:4])
    O = out_hwc.shape[0]
    crop = src_hwc[top : top + h, left : left + w]
    k = int(p[6]) % 4
    # hflip, vflip, then k quarter turns (torch.rot90: k=1 flips W then transposes, k=2 flips both,
    # k=3 flips H then transposes) = a flip of W and/or H, then a transpose when k is odd
    flip_w, flip_h, transpose = bool(p[4]) != (k in (1, 2)), bool(p[5]) != (k in (2, 3)), k % 2 == 1
    if _cv2 is not None and h <= O and w <= O:
        _geometry_cv2(crop.numpy(), flip_w, flip_h, transpose, out_hwc.numpy())
    else:
        _geometry_torch(crop, flip_w, flip_h, transpose, out_hwc)
    if cfg.jitter:
        _jitter_(out_hwc, p)


def _geometry_cv2(crop: np.ndarray, flip_w: bool, flip_h: bool, transpose: bool, out: np.ndarray) -> None:
    if flip_w or flip_h:
        crop = _cv2.flip(crop, -1 if flip_w and flip_h else (1 if flip_w else 0))
    if transpose:
        crop = _cv2.transpose(crop)
    if crop.shape[:2] == out.shape[:2]:
        np.copyto(out, crop)
    else:  # bilinear, pixel centres as torch's align_corners=False; writes into the batch
        _cv2.resize(crop, (out.shape[1], out.shape[0]), dst=out, interpolation=_cv2.INTER_LINEAR)


def _geometry_torch(crop: torch.Tensor, flip_w: bool, flip_h: bool, transpose: bool, out_hwc: torch.Tensor) -> None:
    dims = [d for d, on in ((1, flip_w), (0, flip_h)) if on]
    img = crop.flip(dims) if dims else crop
    if transpose:
        img = img.transpose(0, 1)
    if img.shape == out_hwc.shape:
        out_hwc.copy_(img)
        return
    chw = img.permute(2, 0, 1).unsqueeze(0)
    if not chw.is_contiguous(memory_format=torch.channels_last):
        chw = chw.contiguous(memory_format=torch.channels_last)
    _resize_into(chw, out_hwc)


def _resize_into(chw: torch.Tensor, out_hwc: torch.Tensor) -> None:
    """Bilinear (antialiased) resize of a channels-last uint8 [1, 3, h, w] into ``out_hwc`` [O, O, 3]."""
    dst = out_hwc.permute(2, 0, 1).unsqueeze(0)  # channels-last view of the batch slot
    try:  # F.interpolate's own op, writing into the batch instead of a new tensor
        torch.ops.aten._upsample_bilinear2d_aa.out(chw, list(dst.shape[2:]), False, None, None, out=dst)
    except (AttributeError, RuntimeError):  # a torch without that overload: interpolate, then copy
        dst.copy_(F.interpolate(chw, size=tuple(dst.shape[2:]), mode="bilinear", antialias=True, align_corners=False))


_CONSTS: dict[tuple[Any, ...], torch.Tensor] = {}
CONSTS_KEPT = 256
"""The constants kept per process (a handful per device and dtype: mean, std, luma weights, quarter turns)."""


def _const(values: Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small constant tensor on ``device``, made once per process: one made from a Python list on
    a CUDA device is a synchronous copy, which makes the host wait for everything queued on the
    stream (the whole previous training step) before it can queue more. A constant kept is never
    let go of (kernels queued on another stream may still read it: freed, the caching allocator
    could hand its memory to that stream's next tensor); past ``CONSTS_KEPT`` (many different
    mean/std values) new ones are made per call instead of kept."""
    key = (tuple(float(v) for v in values), dtype, device)
    t = _CONSTS.get(key)
    if t is None:
        t = torch.tensor(key[0], dtype=dtype, device="cpu").to(device)
        if len(_CONSTS) < CONSTS_KEPT:
            _CONSTS[key] = t
    return t


def _gray_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean luma of each image of [B, 3, H, W] (``_luma_mean`` on the CPU path)."""
    return x.float().mean((2, 3)) @ _const(_GRAY, torch.float32, x.device)


def _luma_mean(img_hwc: torch.Tensor) -> float:
    """Mean luma of one contiguous uint8 [H, W, 3] image."""
    if _cv2 is not None:
        m = _cv2.mean(img_hwc.numpy())
    else:
        m = img_hwc.view(-1, 3).float().mean(0).tolist()
    return m[0] * _GRAY[0] + m[1] * _GRAY[1] + m[2] * _GRAY[2]


_SCRATCH: dict[tuple[torch.dtype, int], torch.Tensor] = {}


def _scratch(shape: tuple[int, ...], dtype: torch.dtype, slot: int = 0) -> torch.Tensor:
    """A reused buffer per dtype and process, grown as needed (a fresh array costs page faults)."""
    n = math.prod(shape)
    t = _SCRATCH.get((dtype, slot))
    if t is None or t.numel() < n:
        t = _SCRATCH[(dtype, slot)] = torch.empty(n, dtype=dtype)
    return t[:n].view(shape)


def _jitter_(img_hwc: torch.Tensor, p: np.ndarray) -> None:
    """Brightness/contrast/saturation of a contiguous uint8 [H, W, 3] image in place, as
    ``_jitter_float`` maps it (rounded, clamped to 0..255)."""
    b, c, s = float(p[_P["brightness"]]), float(p[_P["contrast"]]), float(p[_P["saturation"]])
    if b == 1 and c == 1 and s == 1:
        return
    shape = tuple(img_hwc.shape)
    K, D = c * b, (1 - c) * b * _luma_mean(img_hwc)
    if s != 1:  # the per-pixel grey term: a 3x3 map (the slow case)
        m = torch.tensor(_GRAY).view(3, 1) * (K * (1 - s)) + torch.eye(3) * (K * s)
        x = _scratch(shape, torch.float32)
        y = _scratch(shape, torch.float32, 1)
        x.copy_(img_hwc)
        torch.mm(x.view(-1, 3), m, out=y.view(-1, 3))
        y.add_(D).clamp_(0, 255).round_()
        img_hwc.copy_(y)
        return
    if _cv2 is not None:  # saturate(K*x + D), rounded, vectorised, in place
        a = img_hwc.numpy()
        _cv2.addWeighted(a, K, a, 0.0, D, dst=a)
        return
    # K*x + D rounded, in fixed point with 8 fractional bits: x + ((K-1)*x + D) in int16 when the
    # terms fit (the default ranges), else int32; about 2x faster than float here
    k1, d = int(round((K - 1) * 256)), int(round(D * 256)) + 128
    small = abs(k1) * 255 + abs(d) < 32000
    x = _scratch(shape, torch.int16 if small else torch.int32)
    y = _scratch(shape, x.dtype, 1)
    x.copy_(img_hwc)
    torch.add(torch.tensor(d, dtype=x.dtype), x, alpha=k1, out=y)
    y.bitwise_right_shift_(8).add_(x).clamp_(0, 255)
    img_hwc.copy_(y)


def _jitter_float(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Fused jitter on float [B, 3, H, W] in 0..255 (not clamped)."""
    b, c, s = p[:, _P["brightness"]], p[:, _P["contrast"]], p[:, _P["saturation"]]
    K = c * b
    D = (1 - c) * b * _gray_mean(x)
    w = _const(_GRAY, x.dtype, x.device).view(1, 3, 1, 1)
    gray = (x * w).sum(1, keepdim=True)
    return x * (K * s).view(-1, 1, 1, 1) + (gray * (K * (1 - s)).view(-1, 1, 1, 1) + D.view(-1, 1, 1, 1))


def _theta(p: torch.Tensor, src_size: int) -> torch.Tensor:
    """Per-sample 2x3 matrices mapping output to source coordinates (normalised, align_corners=False)."""
    dt = p.dtype
    B = p.shape[0]
    eye = torch.eye(3, dtype=dt, device=p.device).expand(B, 3, 3)

    def mat(
        a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, e: torch.Tensor, f: torch.Tensor
    ) -> torch.Tensor:
        m = torch.zeros(B, 3, 3, dtype=dt, device=p.device)
        m[:, 0, 0], m[:, 0, 1], m[:, 0, 2] = a, b, c
        m[:, 1, 0], m[:, 1, 1], m[:, 1, 2] = d, e, f
        m[:, 2, 2] = 1
        return m

    one, zero = torch.ones(B, dtype=dt, device=p.device), torch.zeros(B, dtype=dt, device=p.device)
    # quarter turns: torch.rot90(k=1, dims=(H, W)) samples input (x, y) = (-y, x) of the output
    k = p[:, _P["rot90"]].round().long() % 4
    cos_k = _const((1.0, 0.0, -1.0, 0.0), dt, p.device)[k]
    sin_k = _const((0.0, 1.0, 0.0, -1.0), dt, p.device)[k]
    rot = mat(cos_k, -sin_k, zero, sin_k, cos_k, zero)
    fx = torch.where(p[:, _P["hflip"]] > 0, -one, one)
    fy = torch.where(p[:, _P["vflip"]] > 0, -one, one)
    flip = mat(fx, zero, zero, zero, fy, zero)
    # inverse affine: x_r = R(-angle) (x_a - t) / s
    a = torch.deg2rad(p[:, _P["angle"]])
    s = p[:, _P["scale"]]
    ca, sa = torch.cos(a) / s, torch.sin(a) / s
    tx, ty = 2 * p[:, _P["tx"]], 2 * p[:, _P["ty"]]
    aff = mat(ca, sa, -(ca * tx + sa * ty), -sa, ca, -(-sa * tx + ca * ty))
    # crop: crop-normalised -> source-normalised
    top, left, h, w = p[:, 0], p[:, 1], p[:, 2], p[:, 3]
    crop = mat(w / src_size, zero, (2 * left + w) / src_size - 1, zero, h / src_size, (2 * top + h) / src_size - 1)
    m = crop @ aff @ flip @ rot if B else eye
    return m[:, :2, :]


def augment_batch(
    images: torch.Tensor,
    keys_or_params: Sequence[str] | np.ndarray | torch.Tensor,
    *,
    config: AugmentConfig | None = None,
    seed: int = 0,
    epoch: int = 0,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> torch.Tensor:
    """Apply each sample's transform to a uint8 [B, 3, S, S] batch in one pass on its device.

    The same transforms as the loader's CPU path (within interpolation error), in one
    ``affine_grid`` + ``grid_sample`` pass and the colour jitter, in float32 with autocast off
    (the same pixels inside a caller's ``torch.autocast``).

    Args:
        images: A uint8 batch ``[B, 3, S, S]``, on any device.
        keys_or_params: The batch's sample keys (the params are then drawn from ``config``,
            ``seed`` and ``epoch``), or the params array ``[B, 14]`` the loader yields with
            ``device_augment``.
        config: The augmentation settings; None: the defaults. Pass the loader's own.
        seed: The loader's seed (used with keys only).
        epoch: The epoch (used with keys only).
        mean: Per-channel means in 0-1 units (as in index.json); with ``std``, normalise the result.
        std: Per-channel standard deviations in 0-1 units.

    Returns:
        float32 ``[B, 3, O, O]`` (``O``: ``config.size``, else ``S``) in 0..255, or normalised with
        ``mean``/``std``.

    Raises:
        OptionError: ``images`` or the params have the wrong shape.
    """
    cfg = config or AugmentConfig()
    if images.dim() != 4 or images.shape[1] != 3 or images.shape[2] != images.shape[3]:
        raise OptionError(f"augment_batch: expected images [B, 3, S, S], got {list(images.shape)}")
    B, _, S, _ = images.shape
    params: Sequence[str] | np.ndarray | torch.Tensor
    if len(keys_or_params) and isinstance(keys_or_params[0], str):
        params = batch_params(cfg, seed=seed, epoch=epoch, keys=list(keys_or_params), src_size=S)
    else:
        params = keys_or_params
    with no_autocast(images.device):  # float32 throughout, whatever autocast the caller runs under
        p = torch.as_tensor(params, dtype=torch.float32)
        if p.device != images.device:  # from page-locked memory: a copy from pageable memory waits for the stream
            p = (p.pin_memory() if images.is_cuda and not p.is_pinned() else p).to(images.device, non_blocking=True)
        if p.shape != (B, len(PARAM_NAMES)):
            raise OptionError(f"augment_batch: expected params [{B}, {len(PARAM_NAMES)}], got {list(p.shape)}")
        out = cfg.size or S
        x = images.float()
        grid = F.affine_grid(_theta(p, S), [B, 3, out, out], align_corners=False)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
        x = _jitter_float(x, p).clamp_(0, 255)
        if mean is not None and std is not None:
            x = normalize(x, mean, std, scale=255.0)
        return x


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float], *, scale: float = 255.0) -> torch.Tensor:
    """(x / scale - mean) / std per channel, for float [B, 3, H, W]; mean/std in 0-1 units."""
    with no_autocast(x.device):
        m = _const(mean, x.dtype, x.device).view(1, 3, 1, 1) * scale
        s = _const(std, x.dtype, x.device).view(1, 3, 1, 1) * scale
        return (x - m) / s


def no_autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast off for ``device`` while the pixels are computed: under a caller's ``torch.autocast``
    the matrix products that place each sample's crop and its luma would run in bfloat16/float16
    (pixels off by tens of grey levels); the caller's autocast is as it was afterwards."""
    try:
        return torch.autocast(device.type, enabled=False)
    except RuntimeError:  # a device type autocast does not know: nothing to turn off
        return contextlib.nullcontext()
