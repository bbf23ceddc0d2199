"""Batch: shards -> samples -> (shuffle buffer) -> augmented uint8 batches, collated inside each worker.

Each DataLoader worker reads its shards with ``tarread``, writes every sample's pixels straight
into a preallocated uint8 batch (in shared memory when it runs in a worker, so the hand-over to the
main process copies nothing), and yields whole batches; the DataLoader runs with
``batch_size=None``. Normalising to float is left to ``to_device`` on the accelerator by default.
"""

from __future__ import annotations

import copy
import logging
import math
import multiprocessing as mp
from collections.abc import Iterator, Sequence
from urllib.parse import urlparse

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from wds_tools.errors import OptionError, ShardError
from wds_tools.format.cpus import usable_cpus

from .augment import _cv2, AugmentConfig, augment_batch, augment_into, batch_params, normalize
from .buffers import BatchRing, BufferPool, Slot
from .gather import Gather
from .indexread import SampleIndex, class_shares, deal, epoch_order, read_sample_index, select
from .shardlist import ShardList, WorkerPlan, plan_epoch, resolve_urls, worker_info
from .tarread import DEFAULT_CHUNK, Identity, SampleStream, Views, first_identity
from .threads import in_order

__all__ = ["ShardDataset", "ShardLoader", "make_loader", "to_device"]

log = logging.getLogger("training_adapter")


class ShardDataset(IterableDataset):
    """Yields whole batches: ``(images uint8 [B, 3, H, W] channels-last, labels int64 [B])``.

    With ``device_augment`` a third item, the float32 params [B, 14] for ``augment_batch``; with
    ``return_keys`` a last item, the list of sample keys.
    """

    def __init__(self, shards: ShardList, *, batch_size: int, train: bool, seed: int = 0,
                 augment: AugmentConfig | None = None, device_augment: bool = False, normalize: bool = False,
                 shuffle_buffer: int = 0, shuffle_shards: bool = True, resampled: bool = False,
                 epoch_batches: int | None = None, drop_last: bool | None = None, on_error: str = "raise",
                 return_keys: bool = False, read_size: int = DEFAULT_CHUNK, reader: str = "auto",
                 subset=None, class_weights=None, check_samples: bool | str = "labels", allow_mixed: bool = False):
        if check_samples not in (True, False, "labels"):
            raise OptionError(f"check_samples={check_samples!r}: expected 'labels' (the default), True (labels and "
                              f"pixels) or False")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise OptionError(f"batch_size={batch_size!r}: expected a positive integer")
        if on_error not in ("raise", "skip"):
            raise OptionError(f"on_error={on_error!r}: expected 'raise' or 'skip'")
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
            raise OptionError(f"shuffle_buffer={shuffle_buffer!r}: expected a number of samples >= 0")
        if normalize and (shards.mean is None or shards.std is None):
            raise OptionError("normalize=True needs mean and std: point urls at the shards folder or its "
                              "index.json, or pass mean= and std=")
        self.shards = shards
        self.batch_size = batch_size
        self.train = train
        self.seed = seed
        self.augment = (augment or AugmentConfig()) if train else None
        self.device_augment = device_augment and train
        self.normalize = normalize
        self.shuffle_buffer = shuffle_buffer if train else 0
        self.shuffle_shards = shuffle_shards and train
        self.resampled = resampled
        self.epoch_batches = epoch_batches
        self.drop_last = train if drop_last is None else drop_last
        self.on_error = on_error
        self.return_keys = return_keys
        self.read_size = read_size
        self._shape: tuple[int, ...] | None = None
        self.rank_world: tuple[int, int] | None = None
        self._epoch = mp.get_context().Value("q", 0, lock=False)  # shared: persistent workers see set_epoch
        self.ring: BatchRing | None = None  # set by ShardLoader for its worker processes
        self._pool = BufferPool()  # batches made in this process (num_workers=0, or the ring's copies)
        # the index reader: samples planned from samples.npz and read by offset (None: stream the tars)
        self.index: SampleIndex | None = None
        self.rows: np.ndarray | None = None  # the index rows of the subset
        self.shares: np.ndarray | None = None  # each class's share of an epoch (class_weights)
        self._gather: Gather | None = None
        self._scratch: np.ndarray | None = None  # the index reader's fetches from object storage
        self.check_samples = check_samples
        self.allow_mixed = allow_mixed
        self.expect: Identity | None = None  # streaming: the dataset every sample must name (tarread.SampleStream)
        if _use_index(shards, reader, subset, class_weights, check_samples):
            self.index = read_sample_index(shards.index_base, shards.meta, shards.urls, shards.names)
            self.rows = select(self.index, subset)
            damaged = self.index.damaged_shards()  # refused before training starts, or left out
            if damaged and on_error == "raise":
                raise ShardError(damaged[0][1] + (f" ({len(damaged)} such shards)" if len(damaged) > 1 else ""))
            for i, problem in damaged:
                log.warning("leaving out a damaged shard (on_error='skip'): %s", problem)
            if damaged:
                self.rows = self.rows[~np.isin(self.index.shard[self.rows], [i for i, _ in damaged])]
            if not len(self.rows):
                raise OptionError(f"subset={subset!r} selects no sample of the {len(self.index)} in these shards")
            if class_weights is not None:
                self.shares = class_shares(self.index, class_weights, self.rows)

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    @property
    def copies_only(self) -> bool:
        """Whether a worker only copies stored pixels (the index reader without CPU augmentation):
        ``ShardLoader`` then runs its workers as threads."""
        return self.index is not None and (self.augment is None or self.device_augment)

    def reader_copy(self, buffers: int = 4) -> ShardDataset:
        """A copy for one reader thread: the same plan, its own mappings and ``buffers`` batch buffers."""
        other = copy.copy(self)
        other._pool, other._gather, other._scratch, other.ring = BufferPool(buffers), None, None, None
        return other

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value = int(epoch)

    def num_batches(self, *, rank: int, world: int, num_workers: int) -> int | None:
        """Batches this rank yields per epoch (None: unknown, the shards come without counts)."""
        if self.index is None:
            plans = self.plans(rank=rank, world=world, num_workers=num_workers)
            return None if any(p.batches is None for p in plans) else sum(p.batches for p in plans)
        B = self.batch_size
        if self.resampled:
            return self._resampled_batches(world)
        per = len(self.rows) // world if world > 1 else len(self.rows)
        n = per // B if self.drop_last else -(-per // B)
        return n if self.epoch_batches is None else min(n, self.epoch_batches)

    def _resampled_batches(self, world: int) -> int:
        if self.epoch_batches is not None:
            return self.epoch_batches
        return max(1, len(self.rows) // (world * self.batch_size))

    def plans(self, *, rank: int, world: int, num_workers: int, epoch: int | None = None) -> list[WorkerPlan]:
        return plan_epoch(len(self.shards), self.shards.counts, batch_size=self.batch_size, seed=self.seed,
                          epoch=self.epoch if epoch is None else epoch, rank=rank, world=world,
                          num_workers=num_workers, shuffle=self.shuffle_shards, drop_last=self.drop_last,
                          resampled=self.resampled, epoch_batches=self.epoch_batches)

    # --- batches -------------------------------------------------------------------------------
    def _alloc(self, shape: tuple[int, ...]) -> torch.Tensor:
        nbytes = math.prod(shape)
        if get_worker_info() is not None:  # shared memory: the queue to the main process copies nothing
            storage = torch.UntypedStorage._new_shared(nbytes)
            return torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape)
        return self._pool.get(shape)

    def _batches(self, stream: SampleStream, plan: WorkerPlan, rng: np.random.Generator, epoch: int
                 ) -> Iterator[tuple]:
        """At most ``plan.batches`` collated batches; a short last one only without ``drop_last``."""
        limit = plan.batches
        need = None if limit is None else limit * self.batch_size
        groups = stream.groups(stream.samples(plan, rng, need), rng)
        if limit == 0:
            return
        made = 0
        for group in groups:
            if len(group) < self.batch_size and self.drop_last:
                return
            self._shape = stream.shape
            # collated before the group's rows are reused
            yield self._collate([s.key for s in group], [s.label for s in group], epoch, self.augment, Views(group))
            made += 1
            if made == limit:  # stop before reading on: the next group would be read for nothing
                return

    def _collate(self, keys: list[str] | None, labels, epoch: int, cfg: AugmentConfig | None, stored) -> tuple:
        """One batch of ``labels`` (a list or an int64 array) and ``keys`` (None when neither the
        augmentation nor ``return_keys`` needs them); ``stored`` gives their stored pixels
        (``tarread.Views`` or ``gather.Located``)."""
        n = len(labels)
        S = self._shape[0]
        labels = torch.as_tensor(labels, dtype=torch.int64)
        params = None if cfg is None else batch_params(cfg, seed=self.seed, epoch=epoch, keys=keys, src_size=S)
        on_cpu = cfg is not None and not self.device_augment  # the workers augment
        fast_cpu, cpu_affine = on_cpu and not cfg.affine_p, on_cpu and bool(cfg.affine_p)
        O = (cfg.size or S) if fast_cpu else S
        ref = None
        info = get_worker_info()
        uses_ring = self.ring is not None and info is not None and not self.normalize and not cpu_affine
        # [B, O, O, 3] in memory, seen as [B, 3, O, O] channels-last: augmented on the CPU, or the
        # stored [S, S, 3] arrays copied as they are
        shape = (n, O, O, 3)
        got = self.ring.acquire(info.id, shape) if uses_ring else None
        if got is not None:
            ref, buf = got
        else:
            buf = self._alloc(shape)
        if fast_cpu:
            for i, src in enumerate(stored.arrays(S)):
                augment_into(torch.from_numpy(src), params[i], buf[i], cfg)
        else:
            stored.copy_into(buf.numpy().reshape(n, -1))
        images = buf.permute(0, 3, 1, 2)  # [B, 3, H, W], channels-last memory
        if cpu_affine:
            x = augment_batch(images, params, config=cfg).round_()
            images = x.to(torch.uint8).contiguous(memory_format=torch.channels_last)
        if self.normalize:
            images = normalize(images.float(), self.shards.mean, self.shards.std)
        params = None if not self.device_augment else torch.from_numpy(params.astype(np.float32))
        if ref is not None:
            self.ring.publish(ref)
            # the main process puts the slot's images in its place (ShardLoader._through_ring) and
            # makes tensors of the arrays: a tensor sent from a worker would travel through a
            # shared-memory file and a socket per batch, a few ms in all, more than the batch's copy
            images, labels = ref, labels.numpy()
            params = None if params is None else params.numpy()
        out: tuple = (images, labels)
        if self.device_augment:
            out += (params,)
        if self.return_keys:
            out += (keys,)
        return out

    def __iter__(self) -> Iterator[tuple]:
        if get_worker_info() is not None and _cv2 is not None:
            _cv2.setNumThreads(0)  # one worker process per core already; no OpenCV threads after fork
        rank, world, worker, num_workers = worker_info()
        if self.rank_world is not None:  # taken in the main process: a worker may not see torch.distributed
            rank, world = self.rank_world
        epoch = self.epoch
        if self.index is not None:
            yield from self._index_batches(rank, world, worker, num_workers, epoch)
            return
        plan = self.plans(rank=rank, world=world, num_workers=num_workers, epoch=epoch)[worker]
        rng = np.random.default_rng([self.seed, epoch, rank, worker, 0x5B])
        stream = SampleStream(self.shards.urls, batch_size=self.batch_size, shuffle_buffer=self.shuffle_buffer,
                              on_error=self.on_error, resampled=self.resampled, read_size=self.read_size,
                              allow_mixed=self.allow_mixed, expect=self.expect)
        made = 0
        for batch in self._batches(stream, plan, rng, epoch):
            made += 1
            yield batch
        if plan.batches is None or made >= plan.batches:
            return
        if self.on_error == "raise":
            raise ShardError(f"rank {rank} worker {worker}: read {made} of {plan.batches} planned batches from "
                             f"{len(plan.shards)} shards; the index's sample counts do not match the shards "
                             f"(re-convert, or check with wds-tools verify)")
        if world > 1:  # the other ranks would wait for this one's missing batches for ever
            raise ShardError(f"rank {rank} worker {worker}: {made} of {plan.batches} planned batches after "
                             f"skipping damaged shards, even with {len(plan.spares)} spare shards; every rank "
                             f"must yield the same number (repair the shards: wds-tools verify names them)")
        log.warning("worker %d: %d of %d planned batches: damaged shards were skipped", worker, made,
                    plan.batches)


    def _index_batches(self, rank: int, world: int, worker: int, num_workers: int, epoch: int) -> Iterator[tuple]:
        """The index reader: this worker's batches of the epoch plan, read by offset."""
        for rows in self.index_plan(rank, world, epoch, worker, num_workers):
            batch = self.index_batch(rows, rank, world, epoch)
            if batch is not None:
                yield batch

    def index_plan(self, rank: int, world: int, epoch: int, worker: int = 0, num_workers: int = 1
                   ) -> list[np.ndarray]:
        """The index rows of each batch of this worker of ``rank`` in ``epoch`` (pure in those and
        the options): the epoch's order dealt to ranks, cut into batches, batch j to worker j % num_workers."""
        idx, B = self.index, self.batch_size
        draws = self._resampled_batches(world) * B * world if self.resampled else None
        # shuffle in train mode unless every shuffle was switched off
        shuffle = self.train and (self.shuffle_shards or self.shuffle_buffer > 1)
        order = epoch_order(self.rows, idx.label, seed=self.seed, epoch=epoch, shuffle=shuffle, shares=self.shares,
                            draws=draws)
        return deal(order, batch_size=B, rank=rank, world=world, num_workers=num_workers, drop_last=self.drop_last,
                    max_batches=None if self.resampled else self.epoch_batches)[worker]

    def index_batch(self, rows: np.ndarray, rank: int, world: int, epoch: int) -> tuple | None:
        """The batch of index ``rows``, read by offset; None when ``on_error="skip"`` left out every
        one of its samples (an error with several ranks: they must yield equal batch counts)."""
        idx = self.index
        S = idx.size
        self._shape = (S, S, 3)
        if self._gather is None:
            self._gather = Gather(idx, labels=bool(self.check_samples), pixels=self.check_samples is True,
                                  skip=self.on_error == "skip")
        if self._scratch is None and len(idx.urls) and "://" in idx.urls[0]:
            self._scratch = np.empty((self.batch_size, idx.sample_bytes), np.uint8)  # object storage fetches here
        good, located = self._gather.locate(rows, self._scratch)
        if len(good) < len(rows):  # on_error="skip" left damaged samples out of this batch
            rows = rows[good]
            if not len(rows):
                if world > 1:
                    raise ShardError(f"rank {rank}: every sample of a batch is damaged (see the warnings above); "
                                     f"every rank must yield the same number of batches: repair the shards "
                                     f"(wds-tools verify names them)")
                return None
        keys = [k.decode() for k in idx.key[rows].tolist()] if self.augment is not None or self.return_keys else None
        return self._collate(keys, idx.label[rows], epoch, self.augment, located)


_INDEX_SCHEMES = ("", "file")  # and every fsspec object store; not pipe: or http(s) (no ranged reads there)


def _use_index(shards: ShardList, reader: str, subset, class_weights, check_samples: bool | str) -> bool:
    """Whether the loader reads by offset from the index (``reader``: auto, index or stream)."""
    if reader not in ("auto", "index", "stream"):
        raise OptionError(f"reader={reader!r}: expected 'auto', 'index' or 'stream'")
    schemes = {urlparse(u).scheme for u in shards.urls}
    schemes = {"" if len(x) <= 1 else x for x in schemes}
    possible = shards.meta is not None and not schemes & {"pipe", "http", "https"}
    needs = [name for name, v in (("subset", subset), ("class_weights", class_weights)) if v is not None]
    needs += ["check_samples=True"] if check_samples is True else []  # "labels": wherever there is an index
    if not possible and (reader == "index" or needs):
        why = ("these URLs are pipe: or http(s) (no ranged reads)" if shards.meta is not None
               else "no index.json lists these shards")
        raise OptionError(f"{', '.join(needs) or 'reader=index'} needs the index reader, but {why}; point urls at "
                          f"the shards folder or its index.json (local or object storage)")
    if reader == "stream" and needs:
        raise OptionError(f"{needs[0]} needs the index reader; drop reader='stream'")
    return possible and reader != "stream"


def _as_is(batch):
    return batch


def _world() -> tuple[int, int]:
    rank, world, _, _ = worker_info()
    return rank, world


class ShardLoader:
    """A DataLoader over a ShardDataset with ``set_epoch``, ``len`` (when the index gives counts), ``mean``/``std``.

    Without a ``set_epoch`` call between two iterations the epoch advances by one, so the shard
    order and the augmentation change every epoch either way.
    """

    def __init__(self, dataset: ShardDataset, *, num_workers: int, pin_memory: bool = False,
                 persistent_workers: bool = False, prefetch_factor: int | None = None,
                 multiprocessing_context=None):
        self.dataset = dataset
        self.num_workers = num_workers
        kw = {}
        if num_workers:
            kw = dict(persistent_workers=persistent_workers, prefetch_factor=prefetch_factor or 2,
                      multiprocessing_context=multiprocessing_context)
        # collate_fn: batches pass as they are (the default would make tensors of the ring's arrays in the worker)
        self.loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory,
                                 collate_fn=_as_is, **kw)
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self._prefetch = prefetch_factor or 2
        # persistent workers keep the dataset they started with, so a ring could not be renewed
        # per epoch; they use one shared-memory tensor per batch instead
        self._use_ring = bool(num_workers) and not persistent_workers
        self._iterated = False
        self._epoch_set = False
        self._readers: list[ShardDataset] | None = None  # the reader threads' datasets (_in_threads)

    @property
    def mean(self) -> list[float] | None:
        return self.dataset.shards.mean

    @property
    def std(self) -> list[float] | None:
        return self.dataset.shards.std

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)
        self._epoch_set = True

    def __len__(self) -> int:
        rank, world = self.dataset.rank_world or _world()
        n = self.dataset.num_batches(rank=rank, world=world, num_workers=max(1, self.num_workers))
        if n is None:
            raise TypeError("the number of batches is unknown: the shards come without an index giving "
                            "their sample counts")
        return n

    def __iter__(self):
        if self._iterated and not self._epoch_set:
            self.dataset.set_epoch(self.dataset.epoch + 1)
        self._iterated, self._epoch_set = True, False
        self.dataset.rank_world = _world()
        if not self.num_workers:
            return self._in_process()
        if self.dataset.copies_only:
            return self._in_threads()
        if not self._use_ring:
            return iter(self.loader)
        return self._through_ring()

    def _in_threads(self):
        """The index reader without CPU augmentation (``threads.py``): ``max(1, num_workers - 1)``
        background threads and the calling thread make the rank's batches, each thread whole
        batches (plan, check, copy) with its own reader, at most ``prefetch_factor`` per
        background thread ahead of the batch the caller waits for; the caller makes the next
        unstarted batch itself rather than wait. Batches come in plan order: the same as with
        ``num_workers=0``.

        The readers (their shard mappings and buffers) are kept from epoch to epoch: a fresh
        mapping faults its pages in again, which on a VM costs about as much as copying them."""
        ds = self.dataset
        rank, world = ds.rank_world
        epoch = ds.epoch
        threads = max(1, self.num_workers - 1)
        ahead = self._prefetch * threads + 1  # counting the batch the caller waits for
        # each reader's buffers: the batches made ahead, the one being made and two the caller holds
        readers, self._readers = self._readers or [ds.reader_copy(ahead + 3) for _ in range(threads + 1)], None

        def make(w, rows):
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

    def _in_process(self):
        """``num_workers=0``: the dataset's batches as they are made, without the DataLoader (whose
        per-batch machinery would only pass them through); pinned when ``pin_memory`` asks."""
        for batch in self.dataset:
            if self.pin_memory:
                batch = tuple(x.pin_memory() if isinstance(x, torch.Tensor) else x for x in batch)
            yield batch

    def _through_ring(self):
        ds = self.dataset
        size = ds.shards.size
        out = (ds.augment.size if ds.augment is not None and ds.augment.size else None) or size
        if out is None:  # no index: the sample size is known only once read; per-batch shm instead
            yield from self.loader
            return
        # a new ring every epoch: workers of an abandoned iterator can never write into this one
        ring = ds.ring = BatchRing(self.num_workers, self._prefetch, ds.batch_size * out * out * 3)
        try:
            for batch in self.loader:
                if isinstance(batch[0], Slot):
                    batch = (ring.take(batch[0], self.pin_memory, ds._pool),
                             *(torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in batch[1:]))
                yield batch
        finally:
            ds.ring = None


def make_loader(urls, *, batch_size: int, train: bool, num_workers: int | None = None, seed: int = 0,
                augment: AugmentConfig | dict | None = None, device_augment: bool = False,
                normalize: bool = False, shuffle_buffer: int | None = None, shuffle_shards: bool = True,
                resampled: bool = False, epoch_batches: int | None = None, drop_last: bool | None = None,
                on_error: str = "raise", return_keys: bool = False, pin_memory: bool = False,
                persistent_workers: bool = False, prefetch_factor: int | None = None,
                mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                split: str | None = None, read_size: int = DEFAULT_CHUNK, reader: str = "auto",
                subset=None, class_weights=None, check_samples: bool | str = "labels",
                allow_mixed: bool = False, allow_partial: bool = False,
                multiprocessing_context=None) -> ShardLoader:
    """A loader of ``(images, labels)`` batches from WebDataset shards (see the README's Training section).

    ``urls``: a brace pattern, a list or ``::``-joined patterns, a shards folder or its index.json
    (its ``split``: ``train`` or ``val`` by ``train``), ``pipe:`` or ``http(s)://`` URLs.

    ``reader``: ``"auto"`` reads by offset when an index lists the shards (local or object
    storage), else streams the tars; ``"index"`` or ``"stream"`` force one. The index reader alone
    takes ``subset`` (a fraction, keys, ``{column: values}`` or a function of the samples.npz
    columns), ``class_weights`` (``"balanced"`` or ``{class: weight}``) and ``check_samples``: every
    sample read is compared with the index, ``"labels"`` (the default): its ``.cls`` with the
    ``label`` column; ``True``: that and its ``.npy`` bytes with ``npy_xxh3`` (a flipped pixel;
    costs a quarter to a third of the eval read rate); ``False``: neither (the NPY header is always
    checked). A mismatch is a ``ShardError`` naming shard, byte offset and key.
    ``shuffle_buffer`` (streaming, train only, default 1000 samples) costs that many samples of
    memory per worker (150 KB each at 224 px: 150 MB for 1000).
    ``allow_mixed``: read shards of different datasets (index.json files of another version,
    classes, size or build) as one set, with the streaming reader: each sample's label is its own
    ``.cls``, and classes, mean/std and size are the first index's; refused by default, since a
    label then names different classes in different shards. Copies of one dataset (a mirror) need
    no option. ``allow_partial``: read a pattern that names only some shards of a split; refused by
    default, naming the missing shards.
    """
    shards = resolve_urls(urls, split=split or ("train" if train else "val"), allow_mixed=allow_mixed,
                          allow_partial=allow_partial)
    if mean is not None:
        shards.mean = list(mean)
    if std is not None:
        shards.std = list(std)
    rank, world = _world()
    if isinstance(augment, dict):
        augment = AugmentConfig.from_dict(augment)
    ds = ShardDataset(shards, batch_size=batch_size, train=train, seed=seed, augment=augment,
                      device_augment=device_augment, normalize=normalize,
                      shuffle_buffer=1000 if shuffle_buffer is None else shuffle_buffer,
                      shuffle_shards=shuffle_shards, resampled=resampled, epoch_batches=epoch_batches,
                      drop_last=drop_last, on_error=on_error, return_keys=return_keys, read_size=read_size,
                      reader=reader, subset=subset, class_weights=class_weights, check_samples=check_samples,
                      allow_mixed=allow_mixed)
    if num_workers is None:  # every core, but no more workers than this rank has shards (streaming) or batches
        if ds.index is not None:
            num_workers = min(usable_cpus(), max(1, ds.num_batches(rank=rank, world=world, num_workers=1)))
        else:
            num_workers = usable_cpus() if resampled else min(usable_cpus(), max(1, len(shards) // world))
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
        raise OptionError(f"num_workers={num_workers!r}: expected an integer >= 0")
    if ds.index is None:
        ds.plans(rank=rank, world=world, num_workers=max(1, num_workers))  # fail now, not inside a worker
        if not allow_mixed and len(shards):  # every worker compares its samples with the first shard's first
            try:
                ds.expect = first_identity(shards.urls[0])
            except ShardError:  # reading it fails again in the worker that owns it, with on_error applied
                ds.expect = None
    elif epoch_batches is not None and not resampled:
        ds.epoch_batches = None
        have = ds.num_batches(rank=rank, world=world, num_workers=1)
        if epoch_batches > have:
            raise OptionError(f"epoch_batches={epoch_batches}: a rank has only {have} batches of {batch_size} "
                              f"this epoch; use epoch_batches <= {have} or resampled=True")
        ds.epoch_batches = epoch_batches
    return ShardLoader(ds, num_workers=num_workers, pin_memory=pin_memory, persistent_workers=persistent_workers,
                       prefetch_factor=prefetch_factor, multiprocessing_context=multiprocessing_context)


def to_device(images: torch.Tensor, device, mean: Sequence[float] | None = None,
              std: Sequence[float] | None = None, *, non_blocking: bool = True) -> torch.Tensor:
    """Move a uint8 batch to ``device`` and return float32 there, normalised when mean/std are given."""
    x = images.to(device, non_blocking=non_blocking).float()
    if mean is None or std is None:
        return x
    return normalize(x, mean, std)

