"""Transform: the user's own per-sample function (``make_loader(transform=...)``), seeded per sample.

Runs in the workers after the built-in augmentation (or on the stored pixels with ``augment=False``,
and in evaluation), on each sample as a uint8 [3, H, W] tensor, as ``torchvision.transforms.v2``
takes it. Around each call the global random generators are seeded from (seed, epoch, key) alone
(``transform_seed``) and restored afterwards, so a sample's result does not depend on workers,
ranks or batch order, and the caller's own random streams are left as they were:

- ``torch.default_generator.manual_seed(s)`` (the CPU generator ``torch.rand``/``randint`` and
  torchvision draw from; CUDA generators are not touched),
- ``random.seed(s)`` (Python's, which albumentations 1.x uses),
- ``np.random.seed(s % 2**32)`` (numpy's legacy global generator).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from wds_tools.errors import OptionError

__all__ = ["transform_seed", "seeded", "apply_transform"]


def transform_seed(seed: int, epoch: int, key: str) -> int:
    """The sample's seed: BLAKE2b-8 of "seed NUL epoch NUL key NUL transform", little-endian (0 to 2^64 - 1)."""
    h = hashlib.blake2b(f"{seed}\x00{epoch}\x00{key}\x00transform".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


@contextmanager
def seeded(s: int) -> Iterator[None]:
    """torch's CPU generator, Python's ``random`` and numpy's global generator seeded with ``s``, restored after."""
    gen = torch.default_generator
    saved = gen.get_state(), random.getstate(), np.random.get_state()
    gen.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2**32)
    try:
        yield
    finally:
        gen.set_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


def apply_transform(fn: Callable[[torch.Tensor], Any], images: torch.Tensor, keys: Sequence[str], *, seed: int,
                    epoch: int) -> list[torch.Tensor]:
    """``fn`` of each uint8 [3, H, W] image of ``images`` [B, 3, H, W], seeded per sample; the results,
    checked to be tensors of one shape and dtype (a clear error naming the key otherwise)."""
    out: list[torch.Tensor] = []
    for i, key in enumerate(keys):
        with seeded(transform_seed(seed, epoch, key)):
            y = fn(images[i])
        if not isinstance(y, torch.Tensor):
            raise OptionError(f"transform= returned {type(y).__name__} for sample {key!r}; expected a tensor "
                              f"(it takes a uint8 [3, H, W] tensor, as torchvision.transforms.v2 does)")
        if out and (y.shape != out[0].shape or y.dtype != out[0].dtype):
            raise OptionError(f"transform= returned {y.dtype} {list(y.shape)} for sample {key!r} but "
                              f"{out[0].dtype} {list(out[0].shape)} for {keys[0]!r}: every sample must come out "
                              f"the same shape and dtype to make a batch (end it with a fixed-size Resize or "
                              f"CenterCrop)")
        out.append(y)
    return out
