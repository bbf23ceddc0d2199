"""Shard loader: a batch dataset's batches run in this process, in reader threads or in worker processes.

``ShardLoader`` is what ``make_loader`` returns: the batches of its dataset made with ``num_workers=0``,
by reader threads where they only copy (``threads``), or by DataLoader worker processes that hand them
over through one shared-memory ring (``buffers``); moved to ``device`` ahead of the step (``device``);
counted for ``state_dict`` (``resume``). docs/guide/loader-internals.md says why each path exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from wds_tools.errors import OptionError

from .batch import Batch, BatchDataset
from .buffers import BatchRing, Slot, shared_memory_free, slot_layout
from .device import DeviceFeed, cuda_error, cuda_fence, cuda_register, streams_for
from .indexed import IndexedDataset
from .resume import Resumable
from .shardlist import rank_world
from .threads import in_order

__all__ = ["ShardLoader", "AHEAD"]

log = logging.getLogger("training_adapter")

AHEAD = 2
"""Batches ``device=`` copies and prepares ahead of the one the training step gets."""


def _cuda_present() -> bool:
    """Whether CUDA is available to this process (batches can be page-locked)."""
    return torch.cuda.is_available()


def _threads_allowed() -> bool:
    """Whether the index reader may run its copy-only workers as threads of this process: not where
    CUDA is, since this process then launches the training step's kernels (GPU.md: device_augment, read
    by threads beside the trainer, fed ResNet-18 at 0.56 of the ceiling, less than CPU augmentation)."""
    return not torch.cuda.is_available()


def _as_is(batch: Any) -> Any:
    return batch


class ShardLoader(Resumable):
    """A DataLoader over a batch dataset with ``set_epoch``, ``len`` (when the index gives counts), ``mean``/``std``,
    ``state_dict`` / ``load_state_dict`` (mid-epoch resume, ``resume.py``).

    Without a ``set_epoch`` call between two iterations the epoch advances by one, so the shard
    order and the augmentation change every epoch either way.
    """

    def __init__(self, dataset: BatchDataset, *, num_workers: int) -> None:
        o = dataset.options
        self.dataset, self.num_workers = dataset, num_workers
        self.device, self.dtype = o.device, o.dtype
        self._prefetch = o.prefetch_factor or 2
        self._context = o.multiprocessing_context
        self._threads = isinstance(dataset, IndexedDataset) and dataset.copies_only and _threads_allowed()
        processes = bool(num_workers) and not self._threads
        # the ring's slot: the largest batch a worker makes (CPU augmentation may resize), its labels and params;
        # 0 where the size is known only once read (no index), or the images are float (normalize)
        size, cfg = dataset.shards.size, o.augmentation
        out = max(size, cfg.size) if size and cfg is not None and cfg.size and not o.on_device else size
        self._slot_bytes = (
            slot_layout(o.batch_size * out * out * 3, o.batch_size, o.on_device)[2]
            if processes and out and not o.normalize
            else 0
        )
        # without device: page-locked batches only where pin_memory=True asks (the caller's copies out of them are
        # then its own to order: see make_loader); with a CUDA device the feed copies, on its own stream, out of
        # the ring's slots page-locked once, unless pin_memory=False
        device = o.device
        self.pin_memory = _cuda_present() and device is None and bool(o.pin_memory)
        self._pins = self.pin_memory or (device is not None and device.type == "cuda" and o.pin_memory is not False)
        kw: dict[str, Any] = {}
        if num_workers:
            kw = dict(
                persistent_workers=o.persistent_workers,
                prefetch_factor=self._prefetch,
                multiprocessing_context=self._context,
            )
        # collate_fn: batches pass as they are (the default would make tensors of the ring's arrays in the worker);
        # the DataLoader pins (a copy per batch, in its thread) only batches that do not come through the ring
        pin_dl = self.pin_memory and not self._slot_bytes
        self._loader_kw = dict(batch_size=None, num_workers=num_workers, pin_memory=pin_dl, collate_fn=_as_is, **kw)
        self.loader = DataLoader(dataset, **self._loader_kw)
        self.ring: BatchRing | None = None  # made at the first iteration, kept for the loader's lifetime
        self._streams: Any = None
        self._iterated = False
        self._epoch_set = False
        self._iterations = 0  # iterations begun: only the latest one's iterator yields (__iter__)
        self._readers: list[IndexedDataset] | None = None  # the reader threads' datasets (_in_threads)

    @property
    def mean(self) -> list[float] | None:
        """The pixel mean per channel (0-255), from the index or ``make_loader``'s ``mean``."""
        return self.dataset.shards.mean

    @property
    def std(self) -> list[float] | None:
        """The pixel standard deviation per channel (0-255), from the index or ``make_loader``'s ``std``."""
        return self.dataset.shards.std

    @property
    def classes(self) -> list[str] | None:
        """The class names, label i naming ``classes[i]`` (from the index; None without one)."""
        return self.dataset.shards.classes

    @property
    def epoch(self) -> int:
        """The epoch the next iteration yields (unless ``set_epoch`` says otherwise)."""
        return self.dataset.epoch

    def _after_load(self) -> None:
        if self._iterated and self.loader.persistent_workers:  # they hold the dataset as it was: start anew
            self.loader = DataLoader(self.dataset, **self._loader_kw)

    def __len__(self) -> int:
        rank, world = self.dataset.rank_world or rank_world()
        n = self.dataset.num_batches(rank=rank, world=world, num_workers=max(1, self.num_workers))
        if n is None:
            raise TypeError(
                "the number of batches is unknown: the shards come without an index giving their sample counts"
            )
        return n

    @property
    def num_samples(self) -> int | None:
        """Samples this rank yields per epoch (None: unknown, the shards come without counts). In
        evaluation the ranks' counts add up to the split's: each sample once (see the README)."""
        rank, world = self.dataset.rank_world or rank_world()
        return self.dataset.num_samples(rank=rank, world=world, num_workers=max(1, self.num_workers))

    def __iter__(self) -> Iterator[Batch]:
        """The batches of one epoch, fixed now (a ``set_epoch`` before the first batch is for the next
        iteration). One iteration at a time: a later ``iter`` takes the loader's workers over, and the
        earlier iterator then raises at its next batch (it would share their stream)."""
        if self._iterated and not self._epoch_set:
            self.dataset.set_epoch(self.dataset.epoch + 1)
        self._iterated, self._epoch_set = True, False
        self.dataset.rank_world = rank_world()
        self._begin()  # the rest of an epoch after load_state_dict, else the whole epoch
        epoch = self.dataset.begin_iteration()
        self._iterations += 1
        batches = self._batches(epoch)
        if self.device is not None:  # counted as the caller gets them, not as the feed reads ahead
            batches = self._feed()(batches)
        batches = self._counted(batches)
        fn = self.dataset.options.batch_transform
        return self._only_current(batches if fn is None else _batch_transformed(batches, fn), epoch, self._iterations)

    def _only_current(self, batches: Iterator[Batch], epoch: int, mine: int) -> Iterator[Batch]:
        """``batches`` while they are the loader's latest iteration (``mine``); an error once a later one began."""
        try:
            while True:
                if self._iterations != mine:
                    raise OptionError(
                        f"this iterator of the loader (epoch {epoch}) was replaced by a later iter() of it, "
                        f"which took its workers over (they serve one iteration at a time): use one iterator at "
                        f"a time, or a second loader (make_loader again) for a second stream"
                    )
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                yield batch
                del batch  # not held while the caller works on it: its memory is reused once the caller drops it
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def _batches(self, epoch: int) -> Iterator[Batch]:
        if not self.num_workers:
            return self._in_process()
        if self._threads:
            assert isinstance(self.dataset, IndexedDataset)
            return self._in_threads(self.dataset, epoch)
        if not self._slot_bytes:  # the DataLoader's own hand-over: a shared-memory tensor per batch
            return iter(self.loader)
        return self._through_ring()

    def _feed(self) -> DeviceFeed:
        """The ``device`` feed: the loader's mean/std and, under ``device_augment``, its augmentation."""
        ds, o = self.dataset, self.dataset.options
        assert self.device is not None and ds.shards.mean is not None and ds.shards.std is not None  # open_loader
        if self._streams is None:
            self._streams = streams_for(self.device)
        return DeviceFeed(
            self.device,
            dtype=self.dtype,
            mean=ds.shards.mean,
            std=ds.shards.std,
            params=o.on_device,
            augment=o.augmentation if o.on_device else None,
            ahead=AHEAD,
            streams=self._streams,
            hold=self._lend(),  # the slots the ring lends: beyond them it would copy each batch out
        )

    def _in_threads(self, ds: IndexedDataset, epoch: int) -> Iterator[Batch]:
        """The index reader without CPU augmentation (``threads.py``): ``max(1, num_workers - 1)``
        background threads and the calling thread make whole batches, each with its own reader, at
        most ``prefetch_factor`` per background thread ahead; in plan order, as with ``num_workers=0``."""
        rank, world = ds.rank_world or rank_world()
        threads = max(1, self.num_workers - 1)
        ahead = self._prefetch * threads + 1  # counting the batch the caller waits for
        # each reader's buffers: the batches made ahead, the one being made and two the caller holds
        # kept from epoch to epoch: a fresh mapping faults its pages in again, about the cost of copying them
        readers, self._readers = self._readers or [ds.reader_copy(ahead + 3) for _ in range(threads + 1)], None

        def make(w: int, rows: np.ndarray) -> Batch | None:
            return readers[w].index_batch(rows, rank, world, epoch)

        batches = in_order(ds.index_plan(rank, world, epoch), make, threads, ahead=ahead, caller=True)
        try:
            for batch in batches:
                if batch is None:
                    continue
                if self.pin_memory:
                    batch = _pinned(batch)
                yield batch
        finally:
            batches.close()  # drops what is not started and waits for what is
            self._readers = readers

    def _in_process(self) -> Iterator[Batch]:
        """``num_workers=0``: the dataset's batches as they are made, without the DataLoader (whose
        per-batch machinery would only pass them through); pinned when ``pin_memory`` asks."""
        for batch in self.dataset:
            if self.pin_memory:
                batch = _pinned(batch)
            yield batch

    def _ring(self) -> BatchRing:
        """The loader's ring, made (and page-locked, where CUDA moves the batches) at its first iteration:
        ``prefetch_factor`` x workers slots, and those this process may hold."""
        if self.ring is None:
            lend = self._lend()
            slots = self._prefetch * self.num_workers + lend + BatchRing.SPARE
            self._check_shared_memory(slots, lend + BatchRing.SPARE)
            ring = BatchRing(slots, self._slot_bytes, lend=lend, context=self._context)
            if self._pins:
                self._pin(ring)
            self.ring = self.dataset.ring = ring
        return self.ring

    def _lend(self) -> int:
        """The ring's slots this process may hold: the caller's (``BatchRing.LEND``), and with ``device`` the
        feed's, whose copies run ahead (``AHEAD`` and the batch being copied)."""
        return BatchRing.LEND + (AHEAD + 1 if self.device is not None else 0)

    def _check_shared_memory(self, slots: int, held: int) -> None:
        """Refuse a ring larger than the shared memory free (a worker writing past it dies of SIGBUS)."""
        need, free = slots * self._slot_bytes, shared_memory_free()
        if free is None or need <= free:
            return
        mb = 1 / 2**20
        raise OptionError(
            f"the loader's batch ring needs {need * mb:,.0f} MB of shared memory ({slots} batches of "
            f"{self._slot_bytes * mb:,.1f} MB: prefetch_factor={self._prefetch} x num_workers={self.num_workers}, "
            f"and {held} this process may hold), but /dev/shm has {free * mb:,.0f} MB free: lower prefetch_factor, "
            f"num_workers or batch_size, or give /dev/shm more room (docker run --shm-size=...)"
        )

    def _pin(self, ring: BatchRing) -> None:
        """Page-lock the ring's slots once, in the context of the device the batches go to (``device``,
        else the current one); where the driver refuses one (or on ROCm, where shared memory is not
        registered), that slot's batches are copied into page-locked memory as they come."""
        refused: list[int] = []

        def register(storage: torch.UntypedStorage) -> bool:
            rc = cuda_register(storage, self.device)
            if rc:
                refused.append(rc)
            return rc == 0

        # the caller copies out of the slots (pin_memory): wait for the work queued on the current streams before
        # reuse; the feed waits for its own copies
        fence = cuda_fence if self.device is None else None
        ring.pin(None if torch.version.hip else register, fence, pinned_copies=torch.cuda.is_available())
        if refused:
            log.warning(
                "cudaHostRegister refused %d of the loader's %d batch slots (%s): their batches are copied "
                "into page-locked memory as they come",
                len(refused),
                len(ring),
                cuda_error(refused[0]),
            )

    def _through_ring(self) -> Iterator[Batch]:
        """The workers' batches taken from the ring: the slot's images, labels and params lent, no copy."""
        ds = self.dataset
        ring = self._ring()
        persistent = bool(self.loader.persistent_workers)
        gen = ring.begin()
        ds.ring_gen = None if persistent else gen  # non-persistent workers take it with the dataset
        k = 3 if ds.options.on_device else 2
        waited = int(ring.waited.value)
        it = None
        try:
            if persistent:  # the workers are reset: no one receives the batches of earlier iterations, and one still
                ring.end(below=gen)  # being made as they are claims no slot (the reset waits for it)
            it = iter(self.loader)
            if persistent:
                ring.end()  # what they wrote for earlier iterations before the reset
            while True:
                ring.reclaim()  # before waiting: a worker may need the slot the caller let go of
                try:
                    batch = next(it)
                except StopIteration:
                    return
                if isinstance(batch[0], Slot):
                    images, labels, params = ring.take(batch[0])
                    batch = (images, labels, params)[:k] + tuple(_tensors(x) for x in batch[k:])
                else:  # larger than a slot (a transform's), or no slot came free: fresh shared memory
                    waited = ring.warn_if_waited(waited)
                    batch = tuple(_tensors(x) for x in batch)
                    if self.pin_memory:
                        batch = _pinned(batch)
                yield batch
        finally:
            ring.reclaim()  # the batches let go of, before this iteration's workers are shut down
            if not persistent:
                ring.end(gen)  # a worker waiting for a slot gives up: its batch is for no one
                del it  # its workers shut down; what they sent and no one took is freed
                ring.end()


def _pinned(batch: Batch) -> Batch:
    """The batch's tensors copied into page-locked memory."""
    return tuple(x.pin_memory() if isinstance(x, torch.Tensor) else x for x in batch)


def _tensors(x: Any) -> Any:
    """A worker's arrays (alone or in a metadata dict) as tensors."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    if isinstance(x, dict):
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in x.items()}
    return x


def _batch_transformed(batches: Iterator[Batch], fn: Callable[[Any, Any], Any]) -> Iterator[Batch]:
    """Each batch with ``(images, labels) = fn(images, labels)``, in this (the main) process."""
    for batch in batches:
        out = fn(batch[0], batch[1])
        if not (isinstance(out, tuple) and len(out) == 2):
            raise OptionError(
                f"batch_transform= returned {type(out).__name__}; expected (images, labels), as "
                f"torchvision.transforms.v2.CutMix/MixUp return (wrap an images-only function: "
                f"lambda x, y: (f(x), y))"
            )
        yield (*out, *batch[2:])
