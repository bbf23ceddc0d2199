"""Buffers: the memory batches are made in, reused only once nothing the caller holds refers to it.

``BufferPool``: this process's batches; ``BatchRing``: the shared-memory slots worker processes hand
batches over in. Liveness is a numpy array's reference count, and why: docs/guide/loader-internals.md,
Batch memory.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import torch

from wds_tools.errors import ShardError

__all__ = ["BufferPool", "BatchRing", "Fence", "Slot", "shared", "slot_layout"]

log = logging.getLogger("training_adapter")

FREE, CLAIMED, PUBLISHED = 0, 1, 2
"""A slot's status in ``BatchRing.state[:, 0]``: free, being written by a worker, written and sent."""
PARAMS = 14  # columns of a params row (augment.PARAM_NAMES), stored after the labels with device_augment
ALIGN = 64


def alone_count() -> int:
    """``sys.getrefcount`` of an array that one list alone refers to, as this interpreter counts it
    (2 on CPython 3.11-3.13: the list and the call's argument; an interpreter that borrows the
    argument's reference, or counts otherwise, says another number)."""
    probe = [np.empty(0, np.uint8)]
    return sys.getrefcount(probe[0])


def _unreferenced(arrays: list[np.ndarray], i: int, alone: int) -> bool:
    """True when ``arrays[i]`` is referenced by that list alone (``alone``: ``alone_count()``
    measured when the list was made): no tensor made from it is alive (``torch.from_numpy`` keeps
    a reference to the array for as long as its memory is in use)."""
    return sys.getrefcount(arrays[i]) <= alone


def shared(shape: tuple[int, ...]) -> torch.Tensor:
    """A fresh uint8 tensor of ``shape`` in shared memory (worker processes hand batches over in it)."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage, 0, shape)  # type: ignore[call-overload]


def shared_memory_free(path: str = "/dev/shm") -> int | None:
    """Bytes free for shared memory (``path``, where POSIX shared memory lives on Linux); None where
    there is no such folder (macOS, Windows)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def slot_layout(image_bytes: int, n: int, params: bool) -> tuple[int, int, int]:
    """Where a batch of ``n`` samples lies in a slot: (labels offset, params offset, bytes used).
    The images first, then the int64 labels, then (``params``) the float32 [n, 14] params, each
    64-byte aligned, so the main process takes all three as views of the slot."""
    labels = _up(image_bytes)
    prm = _up(labels + 8 * n)
    return labels, prm, prm + (4 * PARAMS * n if params else 0)


class Fence(Protocol):
    """Work the main process waits for before a slot is written again (``torch.cuda.Event``)."""

    def query(self) -> bool:
        """Whether the work recorded before it has completed."""
        ...

    def synchronize(self) -> None:
        """Wait until it has."""
        ...


class BufferPool:
    """Batch buffers (numpy arrays, each batch a ``torch.from_numpy`` view) reused once the caller has
    let go of every tensor made from them: eval batches are made at 1/0.85 the rate of a fresh array each."""

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self._bufs: list[np.ndarray] = []
        self._alone = alone_count()

    def get(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A uint8 tensor of ``shape``: a free buffer of its size reused, else a new one."""
        nbytes = math.prod(shape)
        for i in range(len(self._bufs)):
            if self._bufs[i].size == nbytes and _unreferenced(self._bufs, i, self._alone):
                return torch.from_numpy(self._bufs[i]).view(shape)
        arr = np.empty(nbytes, np.uint8)
        if len(self._bufs) < self.limit:
            self._bufs.append(arr)
        elif self._bufs:  # the caller keeps many batches, or sizes change: replace the oldest
            self._bufs.pop(0)
            self._bufs.append(arr)
        return torch.from_numpy(arr).view(shape)


class Slot:
    """Stands in a worker's batch for what it left in a ``BatchRing`` slot: images, labels, params."""

    __slots__ = ("slot", "shape", "chw", "gen", "params")

    def __init__(
        self, slot: int, shape: tuple[int, ...], chw: bool = False, gen: int = 0, params: bool = False
    ) -> None:
        self.slot, self.shape = slot, shape  # shape: [B, H, W, 3], or [B, 3, H, W] if chw
        self.chw, self.gen, self.params = chw, gen, params


class BatchRing:
    """Shared-memory slots through which worker processes hand batches to the main process, one ring for
    the loader's lifetime: a worker claims a free slot, writes its batch there and sends the slot's
    number (``Slot``); the main process lends the slot as views and frees it once no tensor refers to it
    and its ``Fence``, if any, has completed (the protocol: docs/guide/loader-internals.md, Batch memory).
    """

    WAIT = 2.0  # s without a free slot (an abandoned iterator's batches held): fresh shared memory instead
    ALIVE_EVERY = 1.0  # s between looks, while waiting, at whether the main process is still there
    LOCK_WAIT = 30.0  # s at most for the lock: a worker killed holding it would stop the others for good
    ENDED = 1024  # ended generations the workers know of: a worker of an older one could claim again
    LEND = 3  # slots lent: the batch a caller holds while it asks for the next, and two more
    SPARE = 2  # slots let go of, waiting on their fence

    def __init__(
        self, slots: int, slot_bytes: int, *, lend: int = LEND, spare: int = SPARE, context: Any = None
    ) -> None:
        import multiprocessing as mp

        ctx = context if context is not None and hasattr(context, "Lock") else mp.get_context(context)
        self.slot_bytes, self.lend, self.spare = slot_bytes, lend, spare
        self.storages = [torch.UntypedStorage._new_shared(slot_bytes) for _ in range(slots)]
        self.buffers = [torch.empty(0, dtype=torch.uint8, device="cpu").set_(s) for s in self.storages]
        # [slot] -> (status, generation, pid of the worker that claimed it)
        self.state = torch.zeros((slots, 3), dtype=torch.int64, device="cpu").share_memory_()
        self.lock = ctx.Lock()
        self.gen = ctx.Value("q", 0, lock=False)  # the generation persistent workers read per iteration
        self.waited = ctx.Value("q", 0, lock=False)  # batches handed over outside the ring (no slot free)
        # the generations that ended (the last ENDED of them, and every one below ``below``): a worker of
        # one claims no slot, its batch is for no one
        self.ended = torch.full((self.ENDED,), -1, dtype=torch.int64, device="cpu").share_memory_()
        self.below = ctx.Value("q", 0, lock=False)
        self._parent = os.getpid()
        self._main_only()

    def _main_only(self) -> None:
        self._arrays: list[np.ndarray] | None = None  # one numpy view per slot (main process)
        self._alone = alone_count()  # the reference count of a slot's array that no tensor refers to
        self._watch: tuple[int, int] | None = None  # (this process, its parent then): a worker's first claim
        self._held: dict[int, Fence | None] = {}  # slot -> None: lent; a Fence: let go, its copy may run
        self._fence: Callable[[int], Fence | None] | None = None
        self._pinned_copies = False  # copies out of a slot in page-locked memory (torch's own, which tracks copies)
        self._pinning = False  # batches are to be page-locked: one from a slot that is not is copied out
        self._locked_slots: list[bool] = [False] * len(self.storages)  # page-locked for the accelerator
        self._ended: set[int] = set()  # generations whose batches no one receives any more
        self._ends = 0  # generations ended so far (the next place in ``ended``)
        self._stale = False  # whether slots of ended generations may still be being written
        self._np: np.ndarray | None = None
        self.copies = 0  # batches copied out of their slot (the caller held ``lend`` already, or it is not page-locked)
        self.registered = 0  # slots page-locked for the accelerator

    def __len__(self) -> int:
        return len(self.buffers)

    def __getstate__(self) -> dict[str, Any]:
        keep = "slot_bytes lend spare storages buffers state lock gen waited ended below _parent".split()
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._main_only()

    def _states(self) -> np.ndarray:
        if self._np is None:
            self._np = self.state.numpy()
        return self._np

    # --- in the main process: pinning ------------------------------------------------------------
    def pin(
        self,
        register: Callable[[torch.UntypedStorage], bool] | None,
        fence: Callable[[int], Fence | None] | None,
        *,
        pinned_copies: bool = True,
    ) -> None:
        """Batches in page-locked memory: page-lock each slot once (``register``: ``cudaHostRegister`` of
        its shared memory, True where it could; None: none can be) and lend those as they are; a batch
        in a slot that is not page-locked is copied out (into page-locked memory: ``pinned_copies``) and
        its slot freed at once. With ``fence``, a slot the caller let go of is written again only once
        ``fence(slot)`` (events recorded on the current streams) has completed."""
        if register is not None:
            for i, s in enumerate(self.storages):
                if not self._locked_slots[i]:
                    self._locked_slots[i] = bool(register(s))
        self.registered = sum(self._locked_slots)
        self._fence, self._pinned_copies, self._pinning = fence, pinned_copies, True

    # --- in a worker -------------------------------------------------------------------------------
    def acquire(
        self, shape: tuple[int, ...], chw: bool = False, *, gen: int = 0, params: bool = False
    ) -> tuple[Slot, torch.Tensor] | None:
        """A free slot, claimed, and its memory as ``shape``; None when a batch is too large, its iteration
        ``gen`` ended, or no slot came free within ``WAIT`` seconds. ``shape`` is [B, H, W, 3] (handed over as
        [B, 3, H, W] channels-last), or with ``chw`` [B, 3, H, W]; ``params``: room for the params after the
        labels."""
        nbytes = math.prod(shape)
        if slot_layout(nbytes, shape[0], params)[2] > self.slot_bytes:
            return None
        st = self._states()
        start = time.monotonic()
        pid = os.getpid()
        if self._watch is None or self._watch[0] != pid:  # this process's parent as it starts claiming
            self._watch = (pid, os.getppid())
        checked = start
        while True:
            with self._locked():
                # its iteration ended: no one takes this batch. Looked at under the lock, before a claim: the main
                # process frees an ended iteration's slots under it once, and a claim after that would be taken
                # for good
                if gen < self.below.value or gen in self.ended.numpy():
                    return None
                free = np.flatnonzero(st[:, 0] == FREE)
                if len(free):
                    i = int(free[0])
                    st[i, 1], st[i, 2] = gen, pid
                    st[i, 0] = CLAIMED
                    break
            time.sleep(0.0005)
            now = time.monotonic()
            if now - checked > self.ALIVE_EVERY:
                checked = now
                if self._main_gone():
                    raise ShardError(f"a loader worker's main process (pid {self._parent}) is gone: this worker stops")
            if now - start > self.WAIT:
                self.waited.value += 1
                return None
        return Slot(i, shape, chw, gen, params), self.buffers[i][:nbytes].view(shape)

    def _main_gone(self) -> bool:
        """Whether the main process has exited: its pid is gone, or this worker's parent is not the one
        it had at its first claim (the main process under fork and spawn; under forkserver, Python
        3.14's default on Linux, the fork server, which exits with the main process)."""
        return not _alive(self._parent) or (self._watch is not None and os.getppid() != self._watch[1])

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The ring's lock, waited for ``LOCK_WAIT`` seconds at most."""
        if not self.lock.acquire(timeout=self.LOCK_WAIT):
            raise ShardError(
                f"the loader's batch ring stayed locked for {self.LOCK_WAIT:.0f} s: a worker process was "
                f"probably killed while holding its lock (out of memory? see dmesg); make the loader anew"
            )
        try:
            yield
        finally:
            self.lock.release()

    def extras(self, ref: Slot) -> tuple[np.ndarray, np.ndarray | None]:
        """The slot's labels (int64 [B]) and params (float32 [B, 14], or None) as numpy views to fill."""
        n = ref.shape[0]
        lo, po, _ = slot_layout(math.prod(ref.shape), n, ref.params)
        raw = self.buffers[ref.slot].numpy()
        labels = raw[lo : lo + 8 * n].view(np.int64)
        return labels, raw[po : po + 4 * PARAMS * n].view(np.float32).reshape(n, PARAMS) if ref.params else None

    def publish(self, ref: Slot) -> None:
        """Mark the slot written: it stays taken until the main process is done with it."""
        self._states()[ref.slot, 0] = PUBLISHED

    def release(self, ref: Slot) -> None:
        """Give back a slot claimed for a batch that failed."""
        self._states()[ref.slot, 0] = FREE

    # --- in the main process: taking and freeing -------------------------------------------------
    def take(self, ref: Slot) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The slot's images as [B, 3, H, W] (channels-last memory), labels and params (or None): views
        of the slot itself, lent, or copies when the caller holds ``lend`` slots already."""
        self.reclaim()
        if self._arrays is None:
            self._arrays = [b.numpy() for b in self.buffers]
        i, shape, n = ref.slot, ref.shape, ref.shape[0]
        nbytes = math.prod(shape)
        lo, po, _ = slot_layout(nbytes, n, ref.params)
        base = torch.from_numpy(self._arrays[i])  # its storage holds the array: the reference count tells
        lent = sum(1 for f in self._held.values() if f is None)
        # the caller keeps batches, or they are to be page-locked and this slot is not: copy this one out,
        # free the slot now
        if lent >= self.lend or (self._pinning and not self._locked_slots[i]):
            used = slot_layout(nbytes, n, ref.params)[2]
            out = torch.empty(used, dtype=torch.uint8, device="cpu", pin_memory=self._pinned_copies)
            out.copy_(base[:used])
            base = out
            self.copies += 1
            self._free(i)
        else:
            self._held[i] = None
        images = base[:nbytes].view(shape)
        labels = base[lo : lo + 8 * n].view(torch.int64)
        params = base[po : po + 4 * PARAMS * n].view(torch.float32).view(n, PARAMS) if ref.params else None
        return (images if ref.chw else images.permute(0, 3, 1, 2)), labels, params

    def _free(self, i: int) -> None:
        self._held.pop(i, None)
        self._states()[i, 0] = FREE

    def reclaim(self) -> None:
        """Free the slots no tensor refers to any more (once their fence, if any, has completed), at
        most ``spare`` waiting on one (the oldest waited for); and the batches of ended iterations."""
        arrays = self._arrays
        if arrays is not None and self._held:
            for i, fence in list(self._held.items()):
                if fence is None:
                    if not _unreferenced(arrays, i, self._alone):
                        continue
                    fence = self._fence(i) if self._fence is not None else None
                    if fence is None:
                        self._free(i)
                        continue
                    self._held[i] = fence
                if fence.query():
                    self._free(i)
            waiting = [i for i, f in self._held.items() if f is not None]
            for i in waiting[: max(0, len(waiting) - self.spare)]:
                fence = self._held[i]
                if fence is not None:
                    fence.synchronize()
                self._free(i)
        if self._stale:
            self._reclaim_stale()

    def begin(self) -> int:
        """A new iteration's generation (persistent workers read it from ``gen`` as they start an epoch)."""
        self.gen.value += 1
        return int(self.gen.value)

    def end(self, gen: int | None = None, *, below: int | None = None) -> None:
        """No one receives the batches of iteration ``gen`` (or of every one ``below``) any more: free
        those written and not taken; those still being written, once written (or their worker gone).
        Without arguments: look again for those of the generations ended so far."""
        if gen is not None:
            self._ended.add(gen)
            self.ended[self._ends % self.ENDED] = gen
            self._ends += 1
        if below is not None:
            self.below.value = max(int(self.below.value), below)
        self._stale = True
        self._reclaim_stale()

    def _reclaim_stale(self) -> None:
        st = self._states()
        claimed_left = False
        with self._locked():
            for i in range(len(st)):
                status, gen, pid = (int(v) for v in st[i])
                if status == FREE or i in self._held or not (gen < self.below.value or gen in self._ended):
                    continue
                if status == PUBLISHED or not _alive(pid):
                    st[i, 0] = FREE
                else:
                    claimed_left = True
        self._stale = claimed_left
        if not claimed_left:  # none left, and none to come: a worker of an ended generation claims no slot
            self._ended.clear()

    def free_slots(self) -> int:
        """Slots free now (for tests and diagnostics)."""
        return int((self._states()[:, 0] == FREE).sum())

    def warn_if_waited(self, seen: int) -> int:
        """Log once when workers handed batches over outside the ring since ``seen``; the count now."""
        now = int(self.waited.value)
        if now > seen:
            log.warning(
                "%d batches were handed over in fresh shared memory: a worker found none of the loader's %d "
                "batch slots free for %.0f s (are batches of an earlier iteration of this loader still held, "
                "or that iterator not closed?)",
                now - seen,
                len(self),
                self.WAIT,
            )
        return now


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
