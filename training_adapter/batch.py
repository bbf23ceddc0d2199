"""Batch: a batch's stored pixels -> (augmented) uint8 batch, the step both readers share.

``BatchDataset`` holds what the index and streaming readers share: the options, the epoch (shared
with persistent workers), the batch memory (``buffers``) and ``collate``, which writes every sample
straight into a preallocated batch (a ring slot in a worker, so the hand-over copies nothing).
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from wds_tools.errors import OptionError

from .augment import _cv2, augment_batch, augment_into, batch_params, no_autocast, normalize
from .buffers import BatchRing, BufferPool, shared
from .indexplan import SampleIndex
from .shardlist import ShardList, WorkerInfo, worker_info
from .transform import apply_transform

if TYPE_CHECKING:  # (loader imports this module)
    from .loader import LoaderOptions

__all__ = ["Batch", "BatchDataset", "Stored"]

# (images uint8 [B, 3, H, W] channels-last, labels int64 [B][, params float32 [B, 14]][, keys]); from a
# worker that writes into a ``BatchRing``, the images are its ``Slot`` (which holds the labels and
# params too: None in their places) and the metadata numpy arrays
Batch: TypeAlias = tuple[Any, ...]
"""A batch: ``(images, labels[, params][, metadata][, keys])``, as ``BatchDataset`` yields it."""


class Stored(Protocol):
    """A batch's stored pixels where a reader found them (``tarread.Views``, ``offsetread.Located``)."""

    def arrays(self, S: int) -> Iterator[np.ndarray]:
        """Each sample's pixels as a [S, S, 3] uint8 view."""
        ...

    def copy_into(self, flat: np.ndarray) -> None:
        """Copy the samples into ``flat`` ([k, S*S*3] uint8)."""
        ...


class BatchDataset(IterableDataset):
    """Yields whole batches: ``(images uint8 [B, 3, H, W] channels-last, labels int64 [B])``.

    With ``device_augment`` a third item, the float32 params [B, 14] for ``augment_batch``; with
    ``metadata`` the next, a dict of the named columns (numbers as float32 [B], NaN where missing;
    strings as lists, None where missing); with ``return_keys`` a last item, the list of sample keys.
    With ``transform`` the images are what it returns, stacked (uint8 [B, 3, H, W] channels-last
    when it returns uint8 [3, H, W], else as it returns them).
    """

    index: SampleIndex | None = None  # the index reader's rows (None: the tars are streamed)

    def __init__(self, shards: ShardList, options: LoaderOptions) -> None:
        if options.normalize and (shards.mean is None or shards.std is None):
            raise OptionError(
                "normalize=True needs mean and std: point urls at the shards folder or its "
                "index.json, or pass mean= and std="
            )
        self.shards = shards
        self.options = options
        self.rank_world: tuple[int, int] | None = None  # taken in the main process by ShardLoader
        self._epoch = mp.get_context().Value("q", 0, lock=False)  # shared: persistent workers see set_epoch
        # the epoch of the iteration running (-1: ``epoch``), fixed when it begins: a set_epoch for the next one
        # before the workers start reading changes nothing of it
        self._running = mp.get_context().Value("q", -1, lock=False)
        self.ring: BatchRing | None = None  # set by ShardLoader for its worker processes, for its lifetime
        # the ring generation of this iteration's workers (None: persistent workers read ring.gen per epoch)
        self.ring_gen: int | None = None
        self._gen = 0  # the generation this worker's claims carry
        self._claimed: Any = None  # the slot this worker is filling (given back if the batch fails)
        self._pool = BufferPool()  # batches made in this process (num_workers=0, or the ring's copies)
        # a resumed epoch's plan (resume.Span or resume.StreamPlan), set by ShardLoader.load_state_dict's
        # next iteration; it applies to the epoch in _resumes only (shared: persistent workers see it end)
        self.resume: Any = None
        self._resumes = mp.get_context().Value("q", -1, lock=False)
        self._stage = BufferPool(2)  # the built-in step's images that ``transform`` reads

    @property
    def epoch(self) -> int:
        """The epoch whose batches ``__iter__`` yields."""
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the one the next iteration yields (workers, persistent ones too, see it)."""
        self._epoch.value = int(epoch)

    def begin_iteration(self) -> int:
        """Fix the epoch the iteration beginning now yields (``epoch`` now), and return it."""
        self._running.value = self._epoch.value
        return int(self._running.value)

    @property
    def running_epoch(self) -> int:
        """The epoch of the iteration running (``begin_iteration``), else ``epoch``."""
        e = int(self._running.value)
        return self.epoch if e < 0 else e

    def resumed(self, epoch: int) -> Any:
        """The resumed plan of ``epoch`` (None: the whole epoch is planned as usual)."""
        return self.resume if self.resume is not None and self._resumes.value == epoch else None

    @property
    def copies_only(self) -> bool:
        """Whether a worker only copies stored pixels: ``ShardLoader`` then runs its workers as threads."""
        return False

    def num_batches(self, *, rank: int, world: int, num_workers: int) -> int | None:
        """Batches this rank yields per epoch (None: unknown, the shards come without counts)."""
        raise NotImplementedError

    def prepare(self, *, rank: int, world: int, num_workers: int) -> None:
        """Check, in the main process before any worker starts, what would fail in a worker."""

    def num_samples(self, *, rank: int, world: int, num_workers: int) -> int | None:
        """Samples this rank yields per epoch (None: unknown, the shards come without counts)."""
        raise NotImplementedError

    def refuse_empty_epoch(
        self, total: int | None, largest: int | None, *, rank: int, world: int, num_workers: int, per: str
    ) -> None:
        """The rule for an empty epoch: where ``drop_last`` leaves a rank no batch of a split that has
        samples (``total``), refuse, naming the counts; ``largest``: the most samples one batch source
        (a rank, or a ``per`` worker) gets, so the largest batch_size that yields a batch."""
        o = self.options
        if not o.drops_last or o.resampled or not total:
            return
        if self.num_batches(rank=rank, world=world, num_workers=num_workers) != 0:
            return
        where = f" over {world} ranks" if world > 1 else ""
        raise OptionError(
            f"an epoch would have 0 batches: {total:,} samples{where}, at most {largest or 0:,} per {per}, "
            f"fewer than batch_size={o.batch_size}, and drop_last={o.drops_last} drops a short batch; use "
            f"batch_size <= {largest or 1}{', fewer workers' if per == 'worker' and num_workers > 1 else ''} or "
            f"drop_last=False"
        )

    def __getstate__(self) -> dict[str, Any]:
        # a subset function is applied already (the index rows hold it), and a batch_transform runs
        # in the main process: neither need pickle for spawned workers
        state = dict(self.__dict__)
        if callable(self.options.subset) or self.options.batch_transform is not None:
            state["options"] = _without_subset(self.options)
        return state

    def __iter__(self) -> Iterator[Batch]:
        if get_worker_info() is not None and _cv2 is not None:
            _cv2.setNumThreads(0)  # one worker process per core already; no OpenCV threads after fork
        if self.ring is not None:
            self._gen = self.ring_gen if self.ring_gen is not None else int(self.ring.gen.value)
        where = worker_info()
        if self.rank_world is not None:  # taken in the main process: a worker may not see torch.distributed
            where = where._replace(rank=self.rank_world[0], world=self.rank_world[1])
        yield from self.epoch_batches(where, self.running_epoch)

    def epoch_batches(self, where: WorkerInfo, epoch: int) -> Iterator[Batch]:
        """This worker's batches of ``epoch``."""
        raise NotImplementedError

    # --- batches -------------------------------------------------------------------------------
    def _alloc(self, shape: tuple[int, ...]) -> torch.Tensor:
        if get_worker_info() is not None:  # shared memory: the queue to the main process copies nothing
            return shared(shape)
        return self._pool.get(shape)

    def collate(
        self,
        keys: list[str] | None,
        labels: Sequence[int] | np.ndarray,
        epoch: int,
        stored: Stored,
        S: int,
        meta: dict[str, Any] | None = None,
    ) -> Batch:
        """One batch of ``labels`` (a list or an int64 array) and ``keys`` (None when neither the
        augmentation, the transform nor ``return_keys`` needs them); ``stored`` gives their [S, S, 3]
        stored pixels; ``meta`` the ``metadata`` columns' values (float64 arrays or lists)."""
        try:
            with no_autocast(torch.device("cpu")):  # in the caller's next() (or a worker forked from it) under autocast
                if self.options.transform is None:
                    return self._built_in(keys, labels, epoch, stored, S, meta=meta)
                first = self._built_in(keys, labels, epoch, stored, S, final=False)
                return self._transformed(self.options.transform, first, keys or [], epoch, meta)
        except BaseException:
            if self._claimed is not None and self.ring is not None:  # a failed batch gives its slot back
                self.ring.release(self._claimed)
            raise
        finally:
            self._claimed = None

    def _acquire(self, shape: tuple[int, ...], chw: bool = False, params: bool = False) -> tuple[Any, torch.Tensor]:
        """(the ring slot, its memory as ``shape``) in a worker with a ring, else (None, fresh memory)."""
        ring = self.ring if get_worker_info() is not None else None
        got = ring.acquire(shape, chw, gen=self._gen, params=params) if ring is not None else None
        if got is None:
            return None, self._alloc(shape)
        self._claimed = got[0]
        return got

    def _transformed(
        self, fn: Callable[[Any], Any], batch: Batch, keys: list[str], epoch: int, meta: dict[str, Any] | None
    ) -> Batch:
        """The built-in step's batch with ``fn`` (``transform``) applied to each image, seeded per sample."""
        o = self.options
        outs = apply_transform(fn, batch[0], keys, seed=o.seed, epoch=epoch)
        info = get_worker_info()
        ref = None
        if outs and outs[0].dtype == torch.uint8 and outs[0].dim() == 3 and outs[0].shape[0] == 3:
            # batched in the layout the transform returns: channels-last [B, H, W, 3] memory when its
            # results are channels-last, else contiguous [B, 3, H, W] (a transposing copy costs ~0.4 ms
            # per 224 px sample); in the worker's ring slot when it has one
            _, H, W = outs[0].shape
            chw = not outs[0].permute(1, 2, 0).is_contiguous()
            shape = (len(outs), 3, H, W) if chw else (len(outs), H, W, 3)
            ref, buf = self._acquire(shape, chw) if info is not None and not o.normalize else (None, self._alloc(shape))
            images: Any = buf if chw else buf.permute(0, 3, 1, 2)
            for i, y in enumerate(outs):
                images[i].copy_(y)
        else:
            images = torch.stack(outs) if outs else batch[0]
        return self._finish(images, torch.as_tensor(batch[1], dtype=torch.int64), None, ref, keys, meta)

    def _finish(
        self,
        images: Any,
        label_t: torch.Tensor,
        params: np.ndarray | None,
        ref: Any,
        keys: list[str] | None,
        meta: dict[str, Any] | None,
    ) -> Batch:
        """The batch tuple (images normalised under ``normalize``); images left in a ring slot (``ref``)
        travel as the slot, the rest as arrays."""
        o = self.options
        if o.normalize and self.shards.mean is not None and self.shards.std is not None:
            images = normalize(images.float(), self.shards.mean, self.shards.std)
        ring = self.ring
        label_out: Any = label_t
        params_out: Any = None
        meta_out: Any = None
        if o.metadata:
            meta_out = {
                k: torch.from_numpy(v.astype(np.float32)) if isinstance(v, np.ndarray) else v
                for k, v in (meta or {}).items()
            }
        if ref is not None and ring is not None:
            # the labels and params go into the slot beside the images, and the main process takes
            # all three as views of it (ShardLoader._through_ring); the metadata travel as arrays: a
            # tensor sent from a worker would travel through a shared-memory file and a socket per
            # batch, a few ms in all, more than the batch's copy
            labels_at, params_at = ring.extras(ref)
            labels_at[:] = label_t.numpy()
            if params_at is not None and params is not None:
                params_at[:] = params
            ring.publish(ref)
            images, label_out = ref, None
            if meta_out is not None:
                meta_out = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in meta_out.items()}
        elif o.on_device and params is not None:
            params_out = torch.from_numpy(params.astype(np.float32))
        out: Batch = (images, label_out)
        if o.on_device:
            out += (params_out,)
        if o.metadata:
            out += (meta_out,)
        if o.return_keys:
            out += (keys,)
        return out

    def _built_in(
        self,
        keys: list[str] | None,
        labels: Sequence[int] | np.ndarray,
        epoch: int,
        stored: Stored,
        S: int,
        *,
        final: bool = True,
        meta: dict[str, Any] | None = None,
    ) -> Batch:
        """The batch with the built-in augmentation (if any); ``final=False``: only (images, labels),
        in this process's own memory, for ``transform`` to read."""
        o = self.options
        cfg = o.augmentation
        n = len(labels)
        label_t = torch.as_tensor(labels, dtype=torch.int64)
        params = None if cfg is None else batch_params(cfg, seed=o.seed, epoch=epoch, keys=keys or [], src_size=S)
        on_cpu = cfg is not None and not o.on_device  # the workers augment
        fast_cpu = cfg is not None and on_cpu and not cfg.affine_p
        cpu_affine = cfg is not None and on_cpu and bool(cfg.affine_p)
        O = (cfg.size or S) if cfg is not None and fast_cpu else S
        ref = None
        info = get_worker_info()
        # [B, O, O, 3] in memory, seen as [B, 3, O, O] channels-last: augmented on the CPU, or the
        # stored [S, S, 3] arrays copied as they are
        shape = (n, O, O, 3)
        if info is not None and not o.normalize and not cpu_affine and final:
            ref, buf = self._acquire(shape, params=params is not None and o.on_device)
        else:
            buf = self._alloc(shape) if final else self._stage.get(shape)
        if cfg is not None and params is not None and fast_cpu:
            for i, src in enumerate(stored.arrays(S)):
                augment_into(torch.from_numpy(src), params[i], buf[i], cfg)
        else:
            stored.copy_into(buf.numpy().reshape(n, -1))
        images: Any = buf.permute(0, 3, 1, 2)  # [B, 3, H, W], channels-last memory
        if cpu_affine and params is not None:
            x = augment_batch(images, params, config=cfg).round_()
            images = x.to(torch.uint8).contiguous(memory_format=torch.channels_last)
        if not final:
            return images, labels
        return self._finish(images, label_t, params, ref, keys, meta)


def _without_subset(options: LoaderOptions) -> LoaderOptions:
    """``options`` with ``subset`` and ``batch_transform`` None (checked again, they pass)."""
    return replace(options, subset=None, batch_transform=None)
