"""Options: what a loader reads and how it batches, as one frozen object validated once.

``make_loader`` takes them as keywords and builds a ``LoaderOptions``; the batch datasets
(``streaming``, ``indexed``) take it whole. How the batches are run (workers, pinning, prefetch)
stays with ``loader.ShardLoader``; where the shards are, with ``shardlist.resolve_urls``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from wds_tools.errors import OptionError
from wds_tools.format.tar import DEFAULT_CHUNK

from .augment import AugmentConfig
from .indexplan import ClassWeights, Subset

__all__ = ["LoaderOptions", "READERS", "ON_ERROR", "MAX_SEED"]

READERS = ("auto", "index", "stream")
"""The values of ``reader=``."""
ON_ERROR = ("raise", "skip")
"""The values of ``on_error=``."""


MAX_SEED = (1 << 63) - 1
"""The largest ``seed``: a state records it as an int64, and numpy's generators take no negative one."""


def _seed(seed: Any) -> int:
    """``seed`` as an ``int`` from 0 to ``MAX_SEED``: any integer (a numpy integer, a 0-d integer array or
    tensor), not a bool, float or string; an ``OptionError`` naming it otherwise."""
    kind = str(getattr(seed, "dtype", type(seed).__name__))
    try:
        value = None if "bool" in kind or getattr(seed, "ndim", 0) != 0 else operator.index(seed)
    except TypeError:
        value = None
    if value is None or not 0 <= value <= MAX_SEED:
        got = f"{seed!r}" if value is None or value == seed else f"{seed!r} ({value})"
        dtype, shape = getattr(seed, "dtype", None), tuple(getattr(seed, "shape", ()))
        if dtype is None:
            what = f"a {type(seed).__name__}"
        elif type(seed).__module__ == "numpy" and not shape and type(seed).__name__ != "ndarray":
            what = f"a numpy {dtype}"
        else:
            what = f"a {type(seed).__name__} of {dtype}" + (f", shape {shape}" if shape else "")
        why = what if value is None else "out of range"
        raise OptionError(f"seed={got}: {why}; expected an integer from 0 to 2**63 - 1")
    return value


@dataclass(frozen=True)
class LoaderOptions:
    """``make_loader``'s reading and batching keywords (see its docstring), checked on creation.

    The fields hold what was asked; the properties below say what applies, since evaluation
    (``train=False``) neither augments nor shuffles and keeps a short last batch by default.
    """

    batch_size: int
    train: bool
    seed: int = 0
    augment: AugmentConfig | bool | None = None
    device_augment: bool = False
    normalize: bool = False
    shuffle_buffer: int = 1000
    shuffle_shards: bool = True
    resampled: bool = False
    epoch_batches: int | None = None
    drop_last: bool | None = None
    on_error: str = "raise"
    return_keys: bool = False
    read_size: int = DEFAULT_CHUNK
    reader: str = "auto"
    subset: Subset = None
    class_weights: ClassWeights | None = None
    check_samples: bool | str = "labels"
    allow_mixed: bool = False
    transform: Callable[[Any], Any] | None = None
    batch_transform: Callable[[Any, Any], Any] | None = None
    metadata: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", _seed(self.seed))
        a = self.augment
        if not (a is None or isinstance(a, (bool, AugmentConfig))):
            what = "a function" if callable(a) else f"a {type(a).__name__}"
            raise OptionError(
                f"augment={a!r} is {what}; augment takes the built-in augmentation's settings (an "
                f"AugmentConfig or a mapping of them), None or True (the defaults) or False (none). "
                f"To apply your own function to each sample pass it as transform= (with augment=False "
                f"to replace the built-in one, e.g. transform=torchvision.transforms.v2.RandAugment())"
                f", or to whole batches as batch_transform="
            )
        for name in ("transform", "batch_transform"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise OptionError(f"{name}={getattr(self, name)!r}: expected a function (or a callable module)")
        if self.transform is not None and self.device_augment:
            raise OptionError(
                "transform= runs in the workers after the built-in augmentation, which "
                "device_augment=True leaves to the accelerator; drop device_augment, or pass "
                "augment=False and apply your transform yourself after augment_batch"
            )
        if isinstance(self.metadata, str) or not all(isinstance(m, str) for m in self.metadata):
            raise OptionError(
                f"metadata={self.metadata!r}: expected a list of column names, e.g. ['age', 'sex', 'localization']"
            )
        object.__setattr__(self, "metadata", tuple(self.metadata))
        if self.check_samples not in (True, False, "labels"):
            raise OptionError(
                f"check_samples={self.check_samples!r}: expected 'labels' (the default), True (labels "
                f"and pixels) or False"
            )
        b = self.batch_size
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise OptionError(f"batch_size={b!r}: expected a positive integer")
        if self.on_error not in ON_ERROR:
            raise OptionError(f"on_error={self.on_error!r}: expected 'raise' or 'skip'")
        if not isinstance(self.shuffle_buffer, int) or self.shuffle_buffer < 0:
            raise OptionError(f"shuffle_buffer={self.shuffle_buffer!r}: expected a number of samples >= 0")
        if self.reader not in READERS:
            raise OptionError(f"reader={self.reader!r}: expected 'auto', 'index' or 'stream'")
        for name in ("train", "resampled", "shuffle_shards"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"{name}={getattr(self, name)!r}: expected True or False")
        if self.drop_last is not None and not isinstance(self.drop_last, bool):
            raise OptionError(
                f"drop_last={self.drop_last!r}: expected True, False or None (the default: "
                f"True in training, False in evaluation)"
            )
        e = self.epoch_batches
        if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e < 1):
            raise OptionError(f"epoch_batches={e!r}: expected a number of batches >= 1, or None")

    @cached_property  # once: collate asks for every batch
    def augmentation(self) -> AugmentConfig | None:
        """The built-in augmentation applied: ``augment`` (default settings when None or True) in
        training unless it is False, else none."""
        if not self.train or self.augment is False:
            return None
        return self.augment if isinstance(self.augment, AugmentConfig) else AugmentConfig()

    @property
    def on_device(self) -> bool:
        """Whether batches come with augmentation parameters for ``augment_batch`` on the accelerator."""
        return self.device_augment and self.train

    @property
    def buffer(self) -> int:
        """The streaming reader's shuffle buffer in samples (0 in evaluation)."""
        return self.shuffle_buffer if self.train else 0

    @property
    def shuffles_shards(self) -> bool:
        """Whether the shard order is shuffled (training only)."""
        return self.shuffle_shards and self.train

    @property
    def drops_last(self) -> bool:
        """Whether a short last batch is dropped (``drop_last``; by default in training only)."""
        return self.train if self.drop_last is None else self.drop_last

    @property
    def covers(self) -> bool:
        """Whether an epoch holds every sample once across the ranks (evaluation, without resampling):
        ranks then differ by at most one sample (index reader) or by their shards (streaming)."""
        return not self.train and not self.resampled

    @property
    def needs_index(self) -> list[str]:
        """The options set that only the index reader takes (for the message refusing them)."""
        needs = [
            name
            for name, v in (
                ("subset", self.subset),
                ("class_weights", self.class_weights),
                ("metadata", self.metadata or None),
            )
            if v is not None
        ]
        return needs + (["check_samples=True"] if self.check_samples is True else [])  # "labels": where there is one
