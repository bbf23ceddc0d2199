"""A reference loader for the tests only: slow and obviously correct.

Stored samples are read with the standard library's ``tarfile`` (members grouped by webdataset's
key rule), and each expected image is the per-sample function applied to one stored array with its
own (seed, epoch, key) parameters. ``check_epoch`` holds what the real loader yielded against it,
sample by sample (key, label, pixels), plus the epoch's coverage rules.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from training_adapter.augment import AugmentConfig, augment_batch, augment_into, normalize, sample_params


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
                    if m.isfile():
                        base = m.name.rsplit("/", 1)[-1]
                        key = m.name[:len(m.name) - len(base)] + base.split(".", 1)[0]
                        members.setdefault(key, {})[base.split(".", 1)[1]] = tf.extractfile(m).read()
        except (tarfile.TarError, OSError):
            continue
    return {k: Stored(int(v["cls"]), np.load(io.BytesIO(v["npy"])))
            for k, v in members.items() if "npy" in v and "cls" in v}


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

    def params(self, key: str, epoch: int, src_size: int) -> np.ndarray:
        return sample_params(self.augment, seed=self.seed, epoch=epoch, key=key, src_size=src_size)

    def image(self, s: Stored, key: str, epoch: int) -> torch.Tensor:
        """[3, O, O]: the stored pixels, augmented on their own with (seed, epoch, key) in train mode."""
        S = s.pixels.shape[0]
        src = torch.from_numpy(s.pixels.copy())
        if not self.train or self.device_augment:
            img = src.permute(2, 0, 1)
        elif self.augment.affine_p:
            p = self.params(key, epoch, S)[None]
            img = augment_batch(src.permute(2, 0, 1)[None], p, config=self.augment).round_().to(torch.uint8)[0]
        else:
            O = self.augment.size or S
            out = torch.empty(O, O, 3, dtype=torch.uint8)
            augment_into(src, self.params(key, epoch, S), out, self.augment)
            img = out.permute(2, 0, 1)
        if self.normalize:
            img = normalize(img[None].float(), self.mean, self.std)[0]
        return img


@dataclass
class Epoch:
    """One rank's epoch as the loader yielded it: per batch, (key or None, label, image digest, params)."""

    batches: list[list[tuple]]

    @property
    def samples(self) -> list[tuple]:
        return [s for b in self.batches for s in b]


def record(batch: tuple, *, keys: bool, params: bool) -> list[tuple]:
    """A loader batch as (key, label, digest, params row or None) per sample."""
    images, labels = batch[0], batch[1]
    ks = batch[-1] if keys else [None] * len(labels)
    ps = batch[2] if params else None
    return [(ks[i], int(labels[i]), digest(images[i]), None if ps is None else ps[i].numpy().copy())
            for i in range(len(labels))]


def check_epoch(ep: Epoch, stored: dict[str, Stored], expect: Expect, epoch: int, *, batch_size: int,
                resampled: bool = False) -> list[str]:
    """Every yielded sample is one stored sample, with its own label and its own expected pixels
    (and params); no key twice unless resampled. Returns the keys in yield order."""
    by_digest: dict[str, str] = {}
    want: dict[str, str] = {}
    for k, s in stored.items():
        d = digest(expect.image(s, k, epoch))
        want[k] = d
        by_digest.setdefault(d, k)
    keys = []
    for key, label, d, p in ep.samples:
        if key is None:  # no keys asked for: the pixels must be some sample's expected pixels
            assert d in by_digest, "an image that is no stored sample's expected image"
            key = by_digest[d]
        assert key in stored, f"unknown key {key!r}"
        assert d == want[key], f"{key}: pixels are not its own stored pixels (augmented with its own params)"
        assert label == stored[key].label, f"{key}: label {label}, stored {stored[key].label}"
        if p is not None:
            S = stored[key].pixels.shape[0]
            assert np.array_equal(p, expect.params(key, epoch, S).astype(np.float32)), f"{key}: params"
        keys.append(key)
    COMPARED[0] += len(keys)
    if not resampled:
        dup = [k for k, n in Counter(keys).items() if n > 1]
        assert not dup, f"keys yielded twice in one epoch: {dup[:5]}"
    sizes = [len(b) for b in ep.batches]
    assert all(0 < n <= batch_size for n in sizes), sizes
    return keys
