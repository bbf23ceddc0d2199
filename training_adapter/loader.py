"""Loader: shards -> batches (``streaming`` or ``indexed``) -> the training loop, run by workers.

``make_loader`` resolves the shards, takes its keywords as ``LoaderOptions``, picks the reader
(by offset where an index lists the shards, else streaming the tars) and runs its batches in a
``ShardLoader``: in this process (``num_workers=0``), in reader threads where they only copy and
no accelerator trains in this process (``threads``), or in DataLoader worker processes handing
batches over through the loader's shared-memory ring (``buffers``), page-locked for the CUDA
device ``device`` names (or where ``pin_memory=True`` asks). With ``device`` the batches are moved,
normalised (and augmented under ``device_augment``) there ahead of the training step
(``device``); else normalising is left to ``to_device``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from wds_tools.errors import OptionError
from wds_tools.format.cpus import usable_cpus

from .augment import AugmentConfig
from .batch import Batch, BatchDataset
from .buffers import BatchRing, Slot, shared_memory_free, slot_layout
from .device import (
    DeviceFeed,
    as_device,
    as_dtype,
    cuda_error,
    cuda_fence,
    cuda_register,
    streams_for,
    to_device,
)
from .indexed import IndexedDataset
from .indexplan import ClassWeights, Subset, readable_by_offset
from .options import LoaderOptions
from .resume import Resumable
from .shardlist import ShardList, resolve_urls, worker_info
from .streaming import StreamingDataset
from .tarread import DEFAULT_CHUNK
from .threads import in_order
from .transform import check_picklable

__all__ = ["ShardLoader", "make_loader", "open_loader", "open_dataset", "to_device", "default_workers"]

log = logging.getLogger("training_adapter")

AHEAD = 2
"""Batches ``device=`` copies and prepares ahead of the one the training step gets."""


def default_workers(cpus: int, local_ranks: int = 1) -> int:
    """``num_workers`` left to its default: half of this rank's cores (``cpus`` shared by
    ``local_ranks`` ranks on the machine), at least 1, leaving the rest to the training process.

    Chosen from the curve measured on one H200 with 16 cores (``docs/guide/figures.md``, GPU):
    ResNet-18 trained at 8,936 images/s with 15 workers (every core but one) and 10,181 with 8;
    the best counts were 6 to 8. To be measured again there (``scripts/bench_gpu.py``) now that the
    workers' batches are neither copied nor mapped in the training process."""
    return max(1, cpus // max(1, local_ranks) // 2)


def _local_ranks() -> int:
    """The ranks torchrun starts on this machine (``LOCAL_WORLD_SIZE``), 1 without it."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


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


def _world() -> tuple[int, int]:
    where = worker_info()
    return where.rank, where.world


def _reads_index(shards: ShardList, options: LoaderOptions) -> bool:
    """Whether the loader reads by offset from the index (``reader``: auto, index or stream)."""
    possible = shards.info is not None and all(readable_by_offset(u) for u in shards.urls)
    needs = options.needs_index
    if not possible and (options.reader == "index" or needs):
        why = (
            "these URLs are pipe: or http(s) (no ranged reads)"
            if shards.info is not None
            else "no index.json lists these shards"
        )
        raise OptionError(
            f"{', '.join(needs) or 'reader=index'} needs the index reader, but {why}; point urls at "
            f"the shards folder or its index.json (local or object storage)"
        )
    if options.reader == "stream" and needs:
        raise OptionError(f"{needs[0]} needs the index reader; drop reader='stream'")
    return possible and options.reader != "stream"


def open_dataset(shards: ShardList, options: LoaderOptions) -> StreamingDataset | IndexedDataset:
    """The batch dataset of ``shards``: the index reader where it can and may read them, else streaming."""
    if _reads_index(shards, options):
        return IndexedDataset(shards, options)
    return StreamingDataset(shards, options)


class ShardLoader(Resumable):
    """A DataLoader over a batch dataset with ``set_epoch``, ``len`` (when the index gives counts), ``mean``/``std``,
    ``state_dict`` / ``load_state_dict`` (mid-epoch resume, ``resume.py``).

    Without a ``set_epoch`` call between two iterations the epoch advances by one, so the shard
    order and the augmentation change every epoch either way.
    """

    def __init__(
        self,
        dataset: BatchDataset,
        *,
        num_workers: int,
        pin_memory: bool | None = None,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: Any = None,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.dataset = dataset
        self.num_workers = num_workers
        self.device, self.dtype = device, dtype
        self._prefetch = prefetch_factor or 2
        self._context = multiprocessing_context
        o = dataset.options
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
        self.pin_memory = _cuda_present() and device is None and bool(pin_memory)
        self._pins = self.pin_memory or (device is not None and device.type == "cuda" and pin_memory is not False)
        kw: dict[str, Any] = {}
        if num_workers:
            kw = dict(
                persistent_workers=persistent_workers,
                prefetch_factor=self._prefetch,
                multiprocessing_context=multiprocessing_context,
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
        rank, world = self.dataset.rank_world or _world()
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
        rank, world = self.dataset.rank_world or _world()
        return self.dataset.num_samples(rank=rank, world=world, num_workers=max(1, self.num_workers))

    def __iter__(self) -> Iterator[Batch]:
        """The batches of one epoch, fixed now (a ``set_epoch`` before the first batch is for the next
        iteration). One iteration at a time: a later ``iter`` takes the loader's workers over, and the
        earlier iterator then raises at its next batch (it would share their stream)."""
        if self._iterated and not self._epoch_set:
            self.dataset.set_epoch(self.dataset.epoch + 1)
        self._iterated, self._epoch_set = True, False
        self.dataset.rank_world = _world()
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
        background threads and the calling thread make the rank's batches, each thread whole
        batches (plan, check, copy) with its own reader, at most ``prefetch_factor`` per
        background thread ahead of the batch the caller waits for; the caller makes the next
        unstarted batch itself rather than wait. Batches come in plan order: the same as with
        ``num_workers=0``.

        The readers (their shard mappings and buffers) are kept from epoch to epoch: a fresh
        mapping faults its pages in again, which on a VM costs about as much as copying them."""
        rank, world = ds.rank_world or _world()
        threads = max(1, self.num_workers - 1)
        ahead = self._prefetch * threads + 1  # counting the batch the caller waits for
        # each reader's buffers: the batches made ahead, the one being made and two the caller holds
        readers, self._readers = self._readers or [ds.reader_copy(ahead + 3) for _ in range(threads + 1)], None

        def make(w: int, rows: np.ndarray) -> Batch | None:
            return readers[w].index_batch(rows, rank, world, epoch)

        batches = in_order(ds.index_plan(rank, world, epoch), make, threads, ahead=ahead, caller=True)
        try:
            for batch in batches:
                if batch is None:
                    continue
                if self.pin_memory:
                    batch = tuple(x.pin_memory() if isinstance(x, torch.Tensor) else x for x in batch)
                yield batch
        finally:
            batches.close()  # drops what is not started and waits for what is
            self._readers = readers

    def _in_process(self) -> Iterator[Batch]:
        """``num_workers=0``: the dataset's batches as they are made, without the DataLoader (whose
        per-batch machinery would only pass them through); pinned when ``pin_memory`` asks."""
        for batch in self.dataset:
            if self.pin_memory:
                batch = tuple(x.pin_memory() if isinstance(x, torch.Tensor) else x for x in batch)
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
                        batch = tuple(x.pin_memory() if isinstance(x, torch.Tensor) else x for x in batch)
                yield batch
        finally:
            ring.reclaim()  # the batches let go of, before this iteration's workers are shut down
            if not persistent:
                ring.end(gen)  # a worker waiting for a slot gives up: its batch is for no one
                del it  # its workers shut down; what they sent and no one took is freed
                ring.end()


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


def make_loader(
    urls: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    batch_size: int,
    train: bool,
    num_workers: int | None = None,
    seed: int = 0,
    augment: AugmentConfig | Mapping[str, Any] | bool | None = None,
    device_augment: bool = False,
    normalize: bool = False,
    shuffle_buffer: int | None = None,
    shuffle_shards: bool = True,
    resampled: bool = False,
    epoch_batches: int | None = None,
    drop_last: bool | None = None,
    on_error: str = "raise",
    return_keys: bool = False,
    pin_memory: bool | None = None,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    device: torch.device | str | int | None = None,
    dtype: torch.dtype | str = torch.float32,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    split: str | None = None,
    read_size: int = DEFAULT_CHUNK,
    reader: str = "auto",
    subset: Subset = None,
    class_weights: ClassWeights | None = None,
    check_samples: bool | str = "labels",
    allow_mixed: bool = False,
    allow_partial: bool = False,
    multiprocessing_context: Any = None,
    transform: Callable[[Any], Any] | None = None,
    batch_transform: Callable[[Any, Any], Any] | None = None,
    metadata: Sequence[str] = (),
) -> ShardLoader:
    """A loader of ``(images, labels)`` batches from WebDataset shards (see the training guide).

    Each batch is ``(images, labels)``: uint8 ``[B, 3, S, S]`` (channels-last memory) and int64
    ``[B]``; with ``device_augment`` a third item, the float32 params for ``augment_batch``; with
    ``metadata`` the next, a dict of the named columns; with ``return_keys`` a last item, the sample
    keys. With ``device`` the images and labels are on that device, the images normalised (and
    augmented under ``device_augment``, which then adds no params) as ``dtype``, channels-last.
    Call ``set_epoch(epoch)`` before each epoch (without it the epoch advances by one per
    iteration); ``state_dict()``/``load_state_dict()`` resume mid-epoch.

    Args:
        urls: A shards folder or its index.json (then ``split`` picks the split), a brace pattern
            (``shards/v1/224/train-{000000..000041}.tar``), a list or ``::``-joined patterns;
            local, object storage (``s3://``), ``pipe:`` or ``http(s)://``.
        batch_size: Samples per batch.
        train: Training (shuffle, augment, drop a short last batch) or evaluation (every sample
            once across the ranks, pixels as stored).
        num_workers: DataLoader worker processes per rank (reader threads where they only copy and
            CUDA is absent); None: half of this rank's cores (``default_workers``), but no more than
            its shards (streaming) or batches; 0: read in this process.
        seed: Seeds the shard order, shuffles and augmentation, with the epoch: an integer from 0 to
            2**63 - 1 (a numpy integer or a 0-d integer tensor is taken as its value; a bool, float or
            string is refused).
        augment: The built-in augmentation's settings (an ``AugmentConfig`` or a mapping of its
            fields), None or True for the defaults, False for none; training only.
        device_augment: Leave the augmentation to ``augment_batch`` on the accelerator: batches
            carry un-augmented images and each sample's params.
        normalize: Return normalised float32 images (with the index's mean/std) instead of uint8,
            normalised in the workers (``device`` normalises on the device instead).
        shuffle_buffer: The streaming reader's sample shuffle buffer per worker (training only);
            None: 1000 samples (150 KB each at 224 px); 0: none.
        shuffle_shards: Shuffle the shard order (and, with the index reader, the samples) per epoch
            in training.
        resampled: Draw samples (index reader) or shards (streaming) with replacement.
        epoch_batches: Batches per rank per epoch: at most this many, or exactly this many with
            ``resampled``; None: the whole split.
        drop_last: Drop a short last batch; None: in training only.
        on_error: ``"raise"`` a ``ShardError`` on a damaged shard or sample, or ``"skip"`` it
            (logged; the epoch is shorter, ranks stay equal).
        return_keys: Add each batch's sample keys as its last item.
        pin_memory: Without ``device``: True puts batches in page-locked memory (where CUDA is
            available), so that a copy with ``non_blocking=True`` is asynchronous: worker processes'
            batches are their shared-memory slots, page-locked once (no copy), others are copied. A
            slot is written again once the work queued, when you let go of its batch, on the current
            stream of every device with a CUDA context has completed: copy a batch on the current
            stream (``to_device``), or make the current stream wait for the stream you copied on
            (``torch.cuda.current_stream().wait_stream(s)``) before asking for the next batch. None
            (the default) or False: pageable batches (copies from them are synchronous). With a CUDA
            ``device``: None or True page-locks the ring's slots once for the loader's own copies;
            False leaves them pageable (each batch is then copied into page-locked memory first).
        persistent_workers: Keep worker processes alive between epochs.
        prefetch_factor: Batches each worker (or reader thread) prepares ahead; None: 2.
        device: Yield batches on this device (``"cuda"``, ``"cuda:1"``, ``"cpu"``), ready to train on:
            copied (and prepared) there on a side stream two batches ahead of the training step;
            ``"cuda"`` is the current device when ``make_loader`` is called, or under torchrun
            (``LOCAL_RANK``, several devices visible) ``cuda:LOCAL_RANK`` where the current one is
            still cuda:0 (``loader.device`` names it; another current device is refused as ambiguous);
            a device this machine lacks (``"mps"``, ``"xpu"``) is refused before anything is read;
            None: uint8 batches on the CPU, for ``to_device``.
        dtype: With ``device``: the images' dtype, ``torch.float32``, ``torch.bfloat16`` or
            ``torch.float16`` (or their names), normalised in float32 first.
        mean: Per-channel means in 0-1 units, replacing the index's (``loader.mean``).
        std: Per-channel standard deviations in 0-1 units, replacing the index's.
        split: The split to read from a folder or index; None: ``train`` or ``val`` by ``train``.
        read_size: The streaming reader's read size in bytes.
        reader: ``"auto"`` reads by offset when an index lists the shards (local or object
            storage), else streams the tars; ``"index"`` or ``"stream"`` force one.
        subset: Index reader only: the samples to read, as a fraction, a collection of keys, a
            ``{column: values}`` mapping or a function of the samples.npz columns.
        class_weights: Index reader only: each class's share of every epoch, ``"balanced"`` (equal
            shares) or ``{class: weight}`` (classes by name or index; a class not named gets none).
        check_samples: Index reader: compare every sample read with the index: ``"labels"``, its
            ``.cls`` with the ``label`` column and the member name in the tar header in front of its
            ``.npy`` with ``<key>.npy`` (a shard of another conversion copied over this one); True,
            also its ``.npy`` bytes with ``npy_xxh3`` (costs a quarter to a third of the eval read
            rate); False, neither (the NPY header is always checked).
        allow_mixed: Read shards of different datasets as one set with the streaming reader (each
            label is its own ``.cls``; classes, mean/std and size are the first index's); refused by
            default, since a label then names different classes in different shards.
        allow_partial: Read a pattern that names only some shards of a split; refused by default,
            naming the missing shards.
        multiprocessing_context: The DataLoader's multiprocessing context (e.g. ``"spawn"``).
        transform: Your function of each sample (a uint8 ``[3, H, W]`` tensor in, a tensor out), run
            in the workers after the built-in augmentation (instead of it with ``augment=False``),
            in training and evaluation, seeded per sample from (seed, epoch, key).
        batch_transform: ``(images, labels) -> (images, labels)`` on each batch in the main process
            as the loader yields it (e.g. CutMix); not seeded by the loader.
        metadata: Index reader only: metadata column names whose values each batch carries as a
            dict (numbers float32 ``[B]``, NaN where missing; strings as lists, None where missing).

    Returns:
        A ``ShardLoader`` (a DataLoader with ``set_epoch``, ``len`` where the index gives counts,
        ``mean``/``std``, ``classes`` and ``state_dict``/``load_state_dict``).

    Raises:
        OptionError: An option is out of range or malformed, an index-reader option without an
            index, shards of different datasets or part of a split without ``allow_mixed`` or
            ``allow_partial``, an epoch that ``drop_last`` would leave empty, a ``device`` that is
            not there, or ``device`` with ``normalize=True`` or without mean/std; at the first
            iteration, worker processes' batch ring larger than the shared memory free (/dev/shm).
        IndexFormatError: An index cannot be read, or the folder is an unfinished conversion.
        ShardError: A shard's size differs from its index's (with ``on_error="raise"``).
    """
    device = None if device is None else as_device(device)  # before any work: one line where it is not there
    shards = resolve_urls(
        urls, split=split or ("train" if train else "val"), allow_mixed=allow_mixed, allow_partial=allow_partial
    )
    if mean is not None:
        shards.mean = list(mean)
    if std is not None:
        shards.std = list(std)
    options = LoaderOptions(
        batch_size=batch_size,
        train=train,
        seed=seed,
        augment=AugmentConfig.from_dict(augment) if isinstance(augment, Mapping) else augment,
        device_augment=device_augment,
        normalize=normalize,
        shuffle_buffer=1000 if shuffle_buffer is None else shuffle_buffer,
        shuffle_shards=shuffle_shards,
        resampled=resampled,
        epoch_batches=epoch_batches,
        drop_last=drop_last,
        on_error=on_error,
        return_keys=return_keys,
        read_size=read_size,
        reader=reader,
        subset=subset,
        class_weights=class_weights,
        check_samples=check_samples,
        allow_mixed=allow_mixed,
        transform=transform,
        batch_transform=batch_transform,
        metadata=tuple(metadata) if not isinstance(metadata, str) else metadata,  # type: ignore[arg-type]
    )
    return open_loader(
        shards,
        options,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor,
        multiprocessing_context=multiprocessing_context,
        device=device,
        dtype=dtype,
    )


def open_loader(
    shards: ShardList,
    options: LoaderOptions,
    *,
    num_workers: int | None = None,
    pin_memory: bool | None = None,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    multiprocessing_context: Any = None,
    device: torch.device | str | int | None = None,
    dtype: torch.dtype | str = torch.float32,
) -> ShardLoader:
    """The ``ShardLoader`` of resolved ``shards`` read with ``options`` (``make_loader`` without the keywords)."""
    dev = None if device is None else as_device(device)
    images_dtype = as_dtype(dtype)
    if dev is not None and options.normalize:
        raise OptionError(
            "normalize=True normalises in the workers (float32 batches, 4x the bytes); device= normalises "
            "on the device: drop normalize"
        )
    if pin_memory is not None and not isinstance(pin_memory, bool):
        raise OptionError(f"pin_memory={pin_memory!r}: expected True, False or None (the default)")
    rank, world = _world()
    ds = open_dataset(shards, options)
    if num_workers is None:  # half the cores, but no more workers than this rank has shards (streaming) or batches
        cores = default_workers(usable_cpus(), _local_ranks())
        if isinstance(ds, IndexedDataset):
            num_workers = min(cores, max(1, ds.num_batches(rank=rank, world=world, num_workers=1) or 0))
        elif options.resampled:
            num_workers = cores
        else:
            num_workers = min(cores, max(1, len(shards) // world))
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
        raise OptionError(f"num_workers={num_workers!r}: expected an integer >= 0")
    if options.transform is not None and num_workers:  # a transform runs in worker processes, never threads
        check_picklable(options.transform, multiprocessing_context)
    ds.prepare(rank=rank, world=world, num_workers=max(1, num_workers))
    if dev is not None and (ds.shards.mean is None or ds.shards.std is None):
        raise OptionError(
            "device= normalises the images there and needs mean and std: point urls at the shards "
            "folder or its index.json, or pass mean= and std="
        )
    return ShardLoader(
        ds,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor,
        multiprocessing_context=multiprocessing_context,
        device=dev,
        dtype=images_dtype,
    )
