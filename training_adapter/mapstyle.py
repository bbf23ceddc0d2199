"""Map-style: one sample at a time by position, through the index, for any sampler.

``ShardIndexDataset`` reads a split's rows from samples.npz (``indexplan``) and each item by
offset (``offsetread``): no epoch plan, no batches; a ``DataLoader`` with a sampler of the caller's
choice batches them.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from wds_tools.errors import OptionError, ShardError

from .indexplan import Subset, read_sample_index, readable_by_offset, select
from .offsetread import Gather
from .shardlist import resolve_urls

__all__ = ["ShardIndexDataset"]


class ShardIndexDataset(torch.utils.data.Dataset):
    """Map-style access to a split of wds-tools shards through their index.

    ``dataset[i]`` is ``(image, label, key, meta)``: the stored uint8 pixels as [3, S, S]
    (channels-last memory, a copy the caller owns), the label index, the sample key and a dict of
    the index's per-sample columns (``width``, ``height``, ``src_size``: the source image's size
    and bytes) and its metadata columns, typed as the sample's .json has them (int, float or str;
    None where missing; one named width, height or src_size as ``meta.<name>``). ``classes``
    names the labels. Any sampler works, e.g. ``WeightedRandomSampler(weights[dataset.labels], n)`` or
    ``DistributedSampler(dataset)``.

    Args:
        path: A shards folder or its index.json, local or in object storage (or a pattern of shards
            an index lists).
        split: The split to read.
        subset: The samples to read, as in ``make_loader``: a fraction, a collection of keys, a
            ``{column: values}`` mapping or a function of the samples.npz columns; None: all.
        check_samples: Compare each sample read with the index, as in ``make_loader``:
            ``"labels"`` (labels and the ``.npy`` members' names), True (and pixels) or False.
        allow_partial: Accept a pattern that names only some shards of the split.

    Raises:
        OptionError: The shards are not listed in an index readable by offset, or an option is
            malformed.
        IndexFormatError: The index cannot be read, or the folder is an unfinished conversion.
        ShardError: A shard's size differs from its index's (at creation), or a sample read does
            not match the index (on access).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        split: str = "train",
        subset: Subset = None,
        check_samples: bool | str = "labels",
        allow_partial: bool = False,
    ) -> None:
        shards = resolve_urls(path, split=split, allow_partial=allow_partial)
        if (
            shards.info is None
            or shards.index_base is None
            or shards.names is None
            or not all(readable_by_offset(u) for u in shards.urls)
        ):
            raise OptionError(
                f"{path}: ShardIndexDataset needs shards listed in an index.json, local or in object "
                f"storage; point it at the shards folder or its index.json"
            )
        self.index = read_sample_index(shards.index_base, shards.info, shards.urls, shards.names)
        damaged = self.index.damaged_shards()
        if damaged:
            raise ShardError(damaged[0].problem)
        self.rows = select(self.index, subset)
        self.classes = self.index.classes
        self.mean, self.std = shards.mean, shards.std
        self.check_samples = check_samples
        self._gather: Gather | None = None  # made on first use (in each DataLoader worker)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def labels(self) -> np.ndarray:
        """Each item's label index, for samplers (e.g. class weights per item)."""
        return self.index.label[self.rows]

    @property
    def keys(self) -> list[str]:
        """Each item's sample key."""
        return [k.decode() for k in self.index.key[self.rows]]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, str, dict[str, int | float | str | None]]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} samples")
        r = int(self.rows[i])
        if self._gather is None:
            self._gather = Gather(self.index, labels=bool(self.check_samples), pixels=self.check_samples is True)
        S = self.index.size
        pixels = np.empty((1, S * S * 3), np.uint8)
        self._gather.read([r], pixels)
        image = torch.from_numpy(pixels.reshape(S, S, 3)).permute(2, 0, 1)
        meta: dict[str, int | float | str | None] = {
            c: int(v[r]) for c, v in self.index.columns.items() if c != "shard"
        }
        for name, values in self.index.metadata.items():
            meta[f"meta.{name}" if name in meta else name] = values.value(r)
        return image, int(self.index.label[r]), self.index.key_str(r), meta
