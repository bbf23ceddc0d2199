"""Transform: the user's own per-sample function (``make_loader(transform=...)``), seeded per sample.

Around each call torch's CPU generator, Python's ``random`` and numpy's global generator are seeded
from (seed, epoch, key) alone and restored after the batch (docs/guide/loader-internals.md).
"""

from __future__ import annotations

import hashlib
import pickle
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from wds_tools.errors import OptionError

__all__ = ["transform_seed", "seed_all", "restored", "apply_transform", "start_method", "check_picklable"]


def transform_seed(seed: int, epoch: int, key: str) -> int:
    """The sample's seed: BLAKE2b-8 of "seed NUL epoch NUL key NUL transform", little-endian (0 to 2^64 - 1)."""
    h = hashlib.blake2b(f"{seed}\x00{epoch}\x00{key}\x00transform".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


def seed_all(s: int) -> None:
    """torch's CPU generator, Python's ``random`` and numpy's global generator seeded with ``s``."""
    torch.default_generator.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2**32)


@contextmanager
def restored() -> Iterator[None]:
    """The three generators' states as they were before, whatever seeds the block sets."""
    gen = torch.default_generator
    saved = gen.get_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        gen.set_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


def apply_transform(
    fn: Callable[[torch.Tensor], Any], images: torch.Tensor, keys: Sequence[str], *, seed: int, epoch: int
) -> list[torch.Tensor]:
    """``fn`` of each uint8 [3, H, W] image of ``images`` [B, 3, H, W], seeded per sample; the results,
    checked to be tensors of one shape and dtype (a clear error naming the key otherwise)."""
    out: list[torch.Tensor] = []
    with restored():
        for i, key in enumerate(keys):
            seed_all(transform_seed(seed, epoch, key))
            out.append(_checked(fn(images[i]), key, out[0] if out else None, keys[0]))
    return out


def _checked(y: Any, key: str, first: torch.Tensor | None, first_key: str) -> torch.Tensor:
    """``y`` when it is a tensor of ``first``'s shape and dtype; else an error naming the sample."""
    if not isinstance(y, torch.Tensor):
        raise OptionError(
            f"transform= returned {type(y).__name__} for sample {key!r}; expected a tensor "
            f"(it takes a uint8 [3, H, W] tensor, as torchvision.transforms.v2 does)"
        )
    if first is not None and (y.shape != first.shape or y.dtype != first.dtype):
        raise OptionError(
            f"transform= returned {y.dtype} {list(y.shape)} for sample {key!r} but "
            f"{first.dtype} {list(first.shape)} for {first_key!r}: every sample must come out "
            f"the same shape and dtype to make a batch (end it with a fixed-size Resize or "
            f"CenterCrop)"
        )
    return y


def start_method(context: Any) -> str:
    """How DataLoader workers start under ``multiprocessing_context``: its name, a context's method, or
    (None) Python's default, read without fixing it (``get_start_method()`` would)."""
    if context is None:
        import multiprocessing

        return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if isinstance(context, str):
        return context
    return str(context.get_start_method())


def check_picklable(fn: Callable[..., Any], context: Any) -> None:
    """Refuse a ``transform`` that worker processes started by spawn or forkserver could not receive:
    they get it pickled (a lambda or a nested function is not), and the DataLoader would fail at the
    first batch with a bare PicklingError. Forked workers inherit it as it is."""
    method = start_method(context)
    if method == "fork":
        return
    try:
        pickle.dumps(fn)
    except Exception as e:  # PicklingError, AttributeError, TypeError: whatever pickle raises for it
        raise OptionError(
            f"transform={fn!r} cannot be pickled ({type(e).__name__}: {e}), and DataLoader workers started by "
            f"{method!r} (multiprocessing_context) receive it pickled: define it with def at the top level of "
            f"a module (not a lambda or a function inside another), or pass a picklable object such as a "
            f"torchvision.transforms.v2.Compose; or use num_workers=0 or multiprocessing_context='fork'"
        ) from None
