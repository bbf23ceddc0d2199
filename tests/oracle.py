"""A reference loader for the tests only: slow and obviously correct.

Stored samples are read with the standard library's ``tarfile`` (members grouped by webdataset's
key rule), and each expected image is computed on its own from one stored array by ``augref`` (an
independent numpy implementation of the documented augmentation, not ``training_adapter.augment``)
with the sample's own (seed, epoch, key) parameters. ``check_epoch`` holds what the real loader
yielded against it, sample by sample (key, label, pixels within the stated tolerance), plus the
epoch's coverage rules.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from augref import augment_reference, params_row

from training_adapter import AugmentConfig

COMPARED = [0]  # samples checked by check_epoch in this process


@dataclass(frozen=True)
class Stored:
    label: int
    pixels: np.ndarray  # [S, S, 3] uint8


def read_stored(tars: list[Path]) -> dict[str, Stored]:
    """Every sample of ``tars`` by key, read with ``tarfile``; a truncated tar gives the samples
    whose members it holds whole."""
    members: dict[str, dict[str, bytes]] = {}
    for tar in tars:
        try:
            with tarfile.open(tar) as tf:
                for m in tf:
                    f = tf.extractfile(m) if m.isfile() else None
                    if f is not None:
                        base = m.name.rsplit("/", 1)[-1]
                        key = m.name[: len(m.name) - len(base)] + base.split(".", 1)[0]
                        members.setdefault(key, {})[base.split(".", 1)[1]] = f.read()
        except (tarfile.TarError, OSError):
            continue
    return {
        k: Stored(int(v["cls"]), np.load(io.BytesIO(v["npy"]))) for k, v in members.items() if "npy" in v and "cls" in v
    }


def digest(image: torch.Tensor) -> str:
    """One image's values and dtype, whatever its memory layout."""
    t = image.detach().cpu().contiguous()
    return f"{t.dtype}:{tuple(t.shape)}:" + hashlib.sha1(t.numpy().tobytes()).hexdigest()


@dataclass(frozen=True)
class Expect:
    """What a loader built with these options must yield for a sample."""

    train: bool
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    seed: int = 0
    device_augment: bool = False
    normalize: bool = False
    mean: tuple | None = None
    std: tuple | None = None
    on_device: bool = False  # make_loader(device=...): device_augment's augment_batch applied by the loader

    def params(self, key: str, epoch: int, src_size: int) -> np.ndarray:
        """The sample's parameter row, from augment's documented rule restated in augref (not from augment)."""
        return _params_row(self.augment, self.seed, epoch, key, src_size)

    @property
    def augmented(self) -> bool:
        """Whether the loader changes the stored pixels (train mode, augmenting on the CPU or, with
        ``device=``, on the device)."""
        return self.train and (not self.device_augment or self.on_device)

    @property
    def sampled(self) -> bool:
        """Whether the augmentation runs the sampling path (``augment_batch``): the affine, or on the device."""
        return self.augment.affine_p > 0 or (self.device_augment and self.on_device)

    def image(self, s: Stored, key: str, epoch: int) -> np.ndarray:
        """float64 [3, O, O] in 0..255: the stored pixels, augmented on their own with (seed, epoch, key)
        by the independent reference in train mode."""
        if not self.augmented:
            return s.pixels.transpose(2, 0, 1).astype(np.float64)
        S = s.pixels.shape[0]
        p = self.params(key, epoch, S)
        return _reference(s.pixels.tobytes(), s.pixels.shape, p.tobytes(), self.augment.size or S, self.sampled)

    def tolerance(self, key: str, epoch: int, src_size: int) -> float:
        """The largest |loader - reference| allowed for one sample, in 0..255 units.

        Eval and device_augment: 0 (the stored bytes). The sampling path (affine_p > 0, augment_batch
        on the CPU): the loader rounds its float result to uint8, so 0.5. The resize path: the
        resized crop is rounded to uint8 (0.5) by a fixed-point resize (cv2 or torch: under 0.5 more),
        the jitter then multiplies that error by at most its gain G (the largest row sum of |3x3 map|:
        b·c·(s + |1 - s|), 1.44 with the defaults) and rounds again (0.5, with the fixed-point jitter's
        coefficient rounding): 1 + G. Measured on photo-like samples: at most 2.0 with the defaults.
        """
        if not self.augmented:
            return 0.0
        if self.sampled:  # on the device, not rounded to uint8: within the rounding all the same
            return 0.5 + 1e-3
        p = self.params(key, epoch, src_size)
        b, c, s = p[-3:]
        return 1.0 + b * c * (s + abs(1 - s)) + 1e-3

    def pixels(self, image: np.ndarray) -> np.ndarray:
        """A yielded image [3, O, O] back in 0..255 units (undoing ``normalize``) as float64."""
        x = np.asarray(image, dtype=np.float64)
        if self.normalize:
            x = x * np.asarray(self.std).reshape(3, 1, 1) * 255 + np.asarray(self.mean).reshape(3, 1, 1) * 255
        return x

    def check(self, image: np.ndarray, want: np.ndarray, key: str, epoch: int, src_size: int) -> None:
        """``image`` (as yielded) is ``want`` (the reference) within the tolerance: max and mean |diff|."""
        d = np.abs(self.pixels(image) - want)
        tol = self.tolerance(key, epoch, src_size) + (1e-3 if self.normalize else 0.0)
        # the mean |diff|: rounding errors average about a third of a level (at most 0.66 measured, wide
        # jitter ranges included); another sample's image is off by tens of levels
        assert d.max() <= tol and d.mean() <= min(tol, 0.75), (
            f"{key}: pixels are not its own stored pixels (augmented with its own params): "
            f"max |diff| {d.max():.2f} > {tol:.2f} or mean {d.mean():.2f}"
        )


# The reference's results, kept (per process): pure functions of their arguments, and the tests compare many
# loaders' epochs with the same (seed, epoch) images (the defaults' epochs 0 and 1 above all), which the reference
# otherwise recomputes for every stored sample at each check_epoch (most of the loader oracle tests' CPU time).
# Returned read-only, so that no caller changes a kept value.
@functools.lru_cache(maxsize=1 << 15)
def _params_row(augment: AugmentConfig, seed: int, epoch: int, key: str, S: int) -> np.ndarray:
    p = params_row(augment, seed, epoch, key, S)
    p.setflags(write=False)
    return p


@functools.lru_cache(maxsize=1 << 14)
def _reference(pixels: bytes, shape: tuple, p: bytes, out: int, sampled: bool) -> np.ndarray:
    """augment_reference of one stored sample (its uint8 bytes and shape) with one parameter row (float64
    bytes): float64 [3, out, out]."""
    src = np.frombuffer(pixels, np.uint8).reshape(shape)
    ref = augment_reference(src, np.frombuffer(p, np.float64), out=out, sampled=sampled).transpose(2, 0, 1)
    ref.setflags(write=False)
    return ref


@dataclass
class Epoch:
    """One rank's epoch as the loader yielded it: per batch, (key or None, label, image, params)."""

    batches: list[list[tuple]]

    @property
    def samples(self) -> list[tuple]:
        """Every sample of the epoch, in yield order."""
        return [s for b in self.batches for s in b]


def record(batch: tuple, *, keys: bool, params: bool) -> list[tuple]:
    """A loader batch as (key, label, image as a numpy copy, params row or None) per sample."""
    images, labels = batch[0], batch[1]
    ks = batch[-1] if keys else [None] * len(labels)
    ps = batch[2] if params else None
    return [
        (ks[i], int(labels[i]), images[i].detach().cpu().numpy().copy(), None if ps is None else ps[i].numpy().copy())
        for i in range(len(labels))
    ]


def check_epoch(
    ep: Epoch, stored: dict[str, Stored], expect: Expect, epoch: int, *, batch_size: int, resampled: bool = False
) -> list[str]:
    """Every yielded sample is one stored sample, with its own label and its own expected pixels
    (and params); no key twice unless resampled. Returns the keys in yield order."""
    names = list(stored)
    want = {k: expect.image(s, k, epoch) for k, s in stored.items()}
    samples = ep.samples
    if any(key is None for key, *_ in samples):  # no keys asked for: the nearest expected image names it
        refs = np.stack([want[k].reshape(-1) for k in names]).astype(np.float32)
        got = np.stack([expect.pixels(im).reshape(-1) for _, _, im, _ in samples]).astype(np.float32)
        dist = (got * got).sum(1)[:, None] - 2 * got @ refs.T + (refs * refs).sum(1)[None, :]
        nearest = [names[j] for j in dist.argmin(1)]
    keys = []
    for i, (key, label, image, p) in enumerate(samples):
        if key is None:
            key = nearest[i]
        assert key in stored, f"unknown key {key!r}"
        S = stored[key].pixels.shape[0]
        expect.check(image, want[key], key, epoch, S)
        assert label == stored[key].label, f"{key}: label {label}, stored {stored[key].label}"
        if p is not None:
            assert np.array_equal(p, expect.params(key, epoch, S).astype(np.float32)), f"{key}: params"
        keys.append(key)
    COMPARED[0] += len(keys)
    if not resampled:
        dup = [k for k, n in Counter(keys).items() if n > 1]
        assert not dup, f"keys yielded twice in one epoch: {dup[:5]}"
    sizes = [len(b) for b in ep.batches]
    assert all(0 < n <= batch_size for n in sizes), sizes
    return keys
