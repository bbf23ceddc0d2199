"""Buffers: the memory batches are made in, reused only once nothing the caller holds refers to it.

``BufferPool`` holds the batches made in this process (``num_workers=0``, or copies out of the
ring); ``BatchRing`` the preallocated shared-memory slots through which worker processes hand
batches to the main process without a copy. Both tell from a numpy array's reference count
whether a tensor made from it is still alive, so a batch the caller keeps is never overwritten.
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np
import torch

from wds_tools.errors import ShardError

__all__ = ["BufferPool", "BatchRing", "Slot", "shared"]


def _unreferenced(arrays: list[np.ndarray], i: int) -> bool:
    """True when ``arrays[i]`` is referenced by that list alone: no tensor made from it is alive
    (``torch.from_numpy`` keeps a reference to the array for as long as its memory is in use)."""
    return sys.getrefcount(arrays[i]) == 2  # the list and getrefcount's own argument


def shared(shape: tuple[int, ...]) -> torch.Tensor:
    """A fresh uint8 tensor of ``shape`` in shared memory (worker processes hand batches over in it)."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape)  # type: ignore[call-overload]


class BufferPool:
    """Batch buffers reused once the caller has let go of every tensor made from them.

    A fresh 9.6 MB batch costs a page fault per 4 KB on its first write, about as much as
    augmenting the batch's samples takes; reusing buffers removes that. A buffer is a numpy array
    and each batch a ``torch.from_numpy`` view of it: the view's storage holds a reference to the
    array until the last tensor sharing it (views, slices) is gone, so the array's reference count
    says, without any private API, when no batch the caller could still read is in it.
    """

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self._bufs: list[np.ndarray] = []

    def get(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A uint8 tensor of ``shape``: a free buffer of its size reused, else a new one."""
        nbytes = math.prod(shape)
        for i in range(len(self._bufs)):
            if self._bufs[i].size == nbytes and _unreferenced(self._bufs, i):
                return torch.from_numpy(self._bufs[i]).view(shape)
        arr = np.empty(nbytes, np.uint8)
        if len(self._bufs) < self.limit:
            self._bufs.append(arr)
        elif self._bufs:  # the caller keeps many batches, or sizes change: replace the oldest
            self._bufs.pop(0)
            self._bufs.append(arr)
        return torch.from_numpy(arr).view(shape)


class Slot:
    """Stands in a worker's batch for images left in a ``BatchRing`` slot."""

    __slots__ = ("worker", "slot", "shape", "chw")

    def __init__(self, worker: int, slot: int, shape: tuple[int, ...], chw: bool = False) -> None:
        self.worker, self.slot, self.shape = worker, slot, shape  # shape: [B, H, W, 3], or [B, 3, H, W] if chw
        self.chw = chw


class BatchRing:
    """Preallocated shared memory through which workers hand uint8 batches to the main process.

    A fresh shared-memory tensor per batch costs page faults on every batch (8 ms for 64 images
    at 224 px here, more than reading them); a worker fills one of its slots in place instead.
    The main process lends the slot itself to the caller (no copy) and frees it once nothing the
    caller holds refers to it any more, which the reference count of the slot's numpy array tells
    (as in ``BufferPool``). Each slot is its own shared-memory block, so a batch the caller keeps
    keeps only its slot alive, not the epoch's ring. At most ``LEND`` slots per worker are lent;
    beyond that a batch is copied out and its slot freed at once, so a caller that keeps many
    batches never starves a worker. A worker that finds none of its slots free (at an epoch's end
    the DataLoader may queue more batches on the last workers) waits for the main process to take
    one, for as long as the main process lives.
    """

    LEND = 2

    def __init__(self, workers: int, prefetch: int, slot_bytes: int) -> None:
        self.slots, self.slot_bytes = prefetch + 2 + self.LEND, slot_bytes
        self.buffers = [shared((slot_bytes,)) for _ in range(workers * self.slots)]
        self.busy = torch.zeros(workers * self.slots, dtype=torch.int32).share_memory_()
        self._parent = os.getpid()
        self._arrays: list[np.ndarray] | None = None  # main process: one numpy view per slot
        self._lent: dict[int, int] = {}  # slot -> worker, for slots the caller may still hold

    def acquire(self, worker: int, shape: tuple[int, ...], chw: bool = False) -> tuple[Slot, torch.Tensor] | None:
        """A free slot of ``worker`` and its memory as ``shape`` (waiting for one); None when a batch is too large.
        ``shape`` is [B, H, W, 3] (handed over as [B, 3, H, W] channels-last), or with ``chw`` [B, 3, H, W]."""
        nbytes = math.prod(shape)
        if nbytes > self.slot_bytes:
            return None
        first = worker * self.slots
        waited = 0
        while not len(free := (self.busy[first : first + self.slots] == 0).nonzero()):
            time.sleep(0.0005)
            waited += 1
            if waited % 2000 == 0 and os.getppid() != self._parent:  # about once a second
                raise ShardError(f"worker {worker}: the main process is gone")
        s = int(free[0])
        return Slot(worker, s, shape, chw), self.buffers[first + s][:nbytes].view(shape)

    def publish(self, ref: Slot) -> None:
        """Mark the slot written: busy until the main process is done with it."""
        self.busy[ref.worker * self.slots + ref.slot] = 1

    def take(self, ref: Slot, pin: bool, pool: BufferPool) -> torch.Tensor:
        """The slot's images as [B, 3, H, W] (channels-last memory): the slot itself, lent, or a copy."""
        self._reclaim()
        i = ref.worker * self.slots + ref.slot
        nbytes = math.prod(ref.shape)
        if not pin and sum(1 for w in self._lent.values() if w == ref.worker) < self.LEND:
            if self._arrays is None:
                self._arrays = [b.numpy() for b in self.buffers]
            self._lent[i] = ref.worker
            lent = torch.from_numpy(self._arrays[i])[:nbytes].view(ref.shape)
            return lent if ref.chw else lent.permute(0, 3, 1, 2)
        out = torch.empty(ref.shape, dtype=torch.uint8, pin_memory=True) if pin else pool.get(ref.shape)
        out.copy_(self.buffers[i][:nbytes].view(ref.shape))
        self.busy[i] = 0
        return out if ref.chw else out.permute(0, 3, 1, 2)

    def _reclaim(self) -> None:
        """Free the lent slots no tensor refers to any more."""
        arrays = self._arrays
        if arrays is None:  # nothing lent yet
            return
        for i in [i for i in self._lent if _unreferenced(arrays, i)]:
            del self._lent[i]
            self.busy[i] = 0
