"""Indexed: the index reader's batch dataset, for shards an index lists.

Rows from ``indexplan`` (subset, class shares, each epoch's plan), pixels from ``offsetread``, the
batch from ``batch.collate``; no tar header is parsed on the way.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from wds_tools.errors import OptionError, ShardError
from wds_tools.storage.transport import is_local

from .batch import Batch, BatchDataset
from .buffers import BufferPool
from .indexplan import SampleIndex, class_shares, deal, epoch_order, read_sample_index, select
from .offsetread import Gather
from .resume import Span, epoch_span
from .shardlist import ShardList, WorkerInfo

if TYPE_CHECKING:  # (loader imports this module)
    from .loader import LoaderOptions

__all__ = ["IndexedDataset", "metadata_columns", "metadata_batch"]

_OWN_NUMBERS = ("width", "height", "src_size")  # samples.npz's own per-sample numbers a batch may carry


def metadata_columns(index: SampleIndex, names: Sequence[str]) -> None:
    """Refuse a ``metadata`` name that is neither a metadata column of the index (``x`` or
    ``meta.x``) nor width/height/src_size, listing those there are."""
    for name in names:
        ours = name in _OWN_NUMBERS and name in index.columns
        if not ours and (name in _OWN_NUMBERS or name.removeprefix("meta.") not in index.metadata):
            have = ", ".join(list(index.metadata) + list(_OWN_NUMBERS))
            raise OptionError(
                f"metadata={list(names)!r}: {name!r} is not a column of this index; it has {have}"
                + (
                    ""
                    if index.metadata
                    else " (the conversion had no metadata: convert from a manifest CSV with those columns)"
                )
            )


def metadata_batch(index: SampleIndex, names: Sequence[str], rows: np.ndarray) -> dict[str, Any]:
    """The ``metadata`` columns' values of index ``rows``: numbers as float64 (NaN where missing),
    strings as a list (None where missing). width, height and src_size name samples.npz's own
    columns; a metadata column of one of those names is ``meta.<name>`` (as in ``subset``)."""
    out: dict[str, Any] = {}
    for name in names:
        if name not in _OWN_NUMBERS:
            v = index.metadata[name.removeprefix("meta.")].take(rows)
            arr = v.array()
            out[name] = arr.tolist() if v.categories is not None else arr.astype(np.float64)
        else:
            out[name] = index.columns[name][rows].astype(np.float64)
    return out


log = logging.getLogger("training_adapter")


class IndexedDataset(BatchDataset):
    """Batches read by offset through the index (see the module docstring and ``BatchDataset``).

    Damaged shards (missing, or not the size the index says) are refused before training starts,
    or with ``on_error="skip"`` left out.
    """

    index: SampleIndex

    def __init__(self, shards: ShardList, options: LoaderOptions) -> None:
        super().__init__(shards, options)
        if shards.info is None or shards.index_base is None or shards.names is None:
            raise OptionError("the index reader needs shards an index.json lists")
        self.index = read_sample_index(shards.index_base, shards.info, shards.urls, shards.names)
        self.rows = select(self.index, options.subset)  # the index rows of the subset
        damaged = self.index.damaged_shards()
        if damaged and options.on_error == "raise":
            raise ShardError(damaged[0].problem + (f" ({len(damaged)} such shards)" if len(damaged) > 1 else ""))
        for d in damaged:
            log.warning("leaving out a damaged shard (on_error='skip'): %s", d.problem)
        if damaged:
            self.rows = self.rows[~np.isin(self.index.shard[self.rows], [d.position for d in damaged])]
        if not len(self.rows):
            raise OptionError(f"subset={options.subset!r} selects no sample of the {len(self.index)} in these shards")
        # each class's share of an epoch (class_weights)
        self.shares = (
            None if options.class_weights is None else class_shares(self.index, options.class_weights, self.rows)
        )
        metadata_columns(self.index, options.metadata)
        self._gather: Gather | None = None
        self._scratch: np.ndarray | None = None  # the fetches from object storage

    @property
    def copies_only(self) -> bool:
        """Whether a worker only copies stored pixels (no CPU augmentation): ``ShardLoader`` then
        runs its workers as threads."""
        o = self.options
        return (o.augmentation is None or o.on_device) and o.transform is None

    def reader_copy(self, buffers: int = 4) -> IndexedDataset:
        """A copy for one reader thread: the same plan, its own mappings and ``buffers`` batch buffers."""
        other = copy.copy(self)
        other._pool, other._gather, other._scratch, other.ring = BufferPool(buffers), None, None, None
        return other

    def rank_samples(self, world: int, rank: int = 0) -> int:
        """Rows of the selection that ``rank`` reads per epoch (``indexplan.rank_rows``), before
        ``epoch_batches`` (without resampling)."""
        return Span(0, len(self.rows)).rank_rows(world, rank, self.options.covers)

    def full_batches(self, world: int, rank: int = 0) -> int:
        """Batches of ``rank`` of the whole selection, before ``epoch_batches`` (without resampling)."""
        B, per = self.options.batch_size, self.rank_samples(world, rank)
        return per // B if self.options.drops_last else -(-per // B)

    def num_batches(self, *, rank: int, world: int, num_workers: int) -> int | None:
        """Batches this rank yields per epoch."""
        o = self.options
        if o.resampled:
            return self._resampled_batches(world)
        n = self.full_batches(world, rank)
        return n if o.epoch_batches is None else min(n, o.epoch_batches)

    def num_samples(self, *, rank: int, world: int, num_workers: int) -> int | None:
        """Samples this rank yields per epoch (before any that ``on_error="skip"`` leaves out)."""
        o, B = self.options, self.options.batch_size
        n = self.num_batches(rank=rank, world=world, num_workers=num_workers) or 0
        if o.resampled:
            return n * B
        return min(self.rank_samples(world, rank), n * B)

    def _resampled_batches(self, world: int) -> int:
        if self.options.epoch_batches is not None:
            return self.options.epoch_batches
        return max(1, len(self.rows) // (world * self.options.batch_size))

    def prepare(self, *, rank: int, world: int, num_workers: int) -> None:
        """Refuse an epoch that ``drop_last`` leaves empty, and ``epoch_batches`` beyond a rank's batches
        (without resampling)."""
        o = self.options
        self.refuse_empty_epoch(
            len(self.rows),
            self.rank_samples(world, 0),
            rank=rank,
            world=world,
            num_workers=num_workers,
            per="rank" if world > 1 else "epoch",
        )
        if o.epoch_batches is None or o.resampled:
            return
        have = self.full_batches(world, world - 1)  # the last rank has the fewest
        if o.epoch_batches > have:
            raise OptionError(
                f"epoch_batches={o.epoch_batches}: a rank has only {have} batches of {o.batch_size} "
                f"this epoch; use epoch_batches <= {have} or resampled=True"
            )

    def epoch_batches(self, where: WorkerInfo, epoch: int) -> Iterator[Batch]:
        """This worker's batches of the epoch plan, read by offset."""
        for rows in self.index_plan(where.rank, where.world, epoch, where.worker, where.workers):
            batch = self.index_batch(rows, where.rank, where.world, epoch)
            if batch is not None:
                yield batch

    def index_plan(self, rank: int, world: int, epoch: int, worker: int = 0, num_workers: int = 1) -> list[np.ndarray]:
        """The index rows of each batch of this worker of ``rank`` in ``epoch`` (pure in those and
        the options): the epoch's order dealt to ranks, cut into batches, batch j to worker j % num_workers."""
        o = self.options
        span = self.resumed(epoch)  # a Span: the rest of an interrupted epoch (resume.py), from where it stopped
        rest = isinstance(span, Span)
        # shuffle in train mode unless every shuffle was switched off
        shuffle = o.train and (o.shuffles_shards or o.buffer > 1)
        draws = span.draws if rest else self._draws(world)
        order = epoch_order(
            self.rows, self.index.label, seed=o.seed, epoch=epoch, shuffle=shuffle, shares=self.shares, draws=draws
        )
        return deal(
            order[span.start : span.end] if rest else order,
            batch_size=o.batch_size,
            rank=rank,
            world=world,
            num_workers=num_workers,
            drop_last=o.drops_last,
            max_batches=None if o.resampled or rest else o.epoch_batches,
            cover=o.covers,
        )[worker]

    def _draws(self, world: int) -> int | None:
        """The rows a resampled epoch draws for ``world`` ranks (None: not resampled)."""
        return self._resampled_batches(world) * self.options.batch_size * world if self.options.resampled else None

    def epoch_span(self, world: int) -> Span:
        """The positions of the epoch's row sequence that ``world`` ranks read in a whole epoch (``resume``)."""
        o, draws = self.options, self._draws(world)
        return epoch_span(
            len(self.rows) if draws is None else draws,
            world=world,
            batch_size=o.batch_size,
            drop_last=o.drops_last,
            max_batches=None if o.resampled else o.epoch_batches,
            draws=draws,
            cover=o.covers,
        )

    def index_batch(self, rows: np.ndarray, rank: int, world: int, epoch: int) -> Batch | None:
        """The batch of index ``rows``, read by offset; None when ``on_error="skip"`` left out every
        one of its samples (an error with several ranks: they must yield equal batch counts)."""
        o, idx = self.options, self.index
        if self._gather is None:
            self._gather = Gather(
                idx, labels=bool(o.check_samples), pixels=o.check_samples is True, skip=o.on_error == "skip"
            )
        if self._scratch is None and len(idx.urls) and not is_local(idx.urls[0]):
            self._scratch = np.empty((o.batch_size, idx.sample_bytes), np.uint8)  # object storage fetches here
        good, located = self._gather.locate(rows, self._scratch)
        if len(good) < len(rows):  # on_error="skip" left damaged samples out of this batch
            rows = rows[good]
            if not len(rows):
                if world > 1:
                    raise ShardError(
                        f"rank {rank}: every sample of a batch is damaged (see the warnings above); "
                        f"every rank must yield the same number of batches: repair the shards "
                        f"(wds-tools verify names them)"
                    )
                return None
        wants_keys = o.augmentation is not None or o.return_keys or o.transform is not None
        keys = [k.decode() for k in idx.key[rows].tolist()] if wants_keys else None
        meta = metadata_batch(idx, o.metadata, rows) if o.metadata else None
        return self.collate(keys, idx.label[rows], epoch, located, idx.size, meta)
