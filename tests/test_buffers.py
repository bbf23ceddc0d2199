"""buffers: the ring's slots claimed once, lent without a copy, freed only when nothing can read them.

The ring is driven here in one process (a worker's claim and publish, the main process's take and
reclaim); tests/test_loader.py and tests/test_device.py drive it through real worker processes.
``Fences`` stands in for CUDA events: it snapshots the slot when the main process records a fence
and reports a slot written again before its fence completed, the hazard of a non-blocking copy
still reading a slot the caller let go of.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from training_adapter.buffers import CLAIMED, FREE, PUBLISHED, BatchRing, Slot, slot_layout
from wds_tools.errors import ShardError

SHAPE = (3, 4, 4, 3)  # [B, H, W, 3]
IMAGE_BYTES = int(np.prod(SHAPE))


def ring_of(slots: int = 4, *, params: bool = True, **kw) -> BatchRing:
    return BatchRing(slots, slot_layout(IMAGE_BYTES, SHAPE[0], params)[2], **kw)


def fill(ring: BatchRing, value: int, *, gen: int = 0, params: bool = True) -> Slot:
    """What a worker does: claim a slot, write images, labels and params, publish."""
    got = ring.acquire(SHAPE, gen=gen, params=params)
    assert got is not None
    ref, buf = got
    buf.fill_(value)
    labels, prm = ring.extras(ref)
    labels[:] = np.arange(SHAPE[0]) + 100 * value
    if prm is not None:
        prm[:] = value / 2
    ring.publish(ref)
    return ref


def status(ring: BatchRing, ref: Slot) -> int:
    return int(ring.state[ref.slot, 0])


class Fences:
    """Fake CUDA events for ``BatchRing.pin``: each completes after ``delay`` queries (or when waited
    for); on completion the slot's bytes must be those it held when the fence was recorded."""

    def __init__(self, ring: BatchRing, delay: int = 2) -> None:
        self.ring, self.delay = ring, delay
        self.made = self.done = self.waited = 0
        self.violations: list[int] = []
        self.registered: list[int] = []
        self.live: list[Fences.Fence] = []

    def register(self, storage: torch.UntypedStorage) -> bool:
        self.registered.append(storage.data_ptr())
        return True

    def digest(self, slot: int) -> str:
        return hashlib.sha1(self.ring.buffers[slot].numpy().tobytes()).hexdigest()

    def __call__(self, slot: int) -> Fences.Fence:
        self.made += 1
        fence = Fences.Fence(self, slot)
        self.live.append(fence)
        return fence

    def check(self) -> None:
        """Report every slot written again while its fence is pending (whether or not the ring still
        waits on that fence: one freed too early is not queried any more)."""
        for fence in self.live:
            if not fence.finished and self.digest(fence.slot) != fence.before:
                self.violations.append(fence.slot)
                fence.finished = True
        self.live = [f for f in self.live if not f.finished]

    class Fence:
        def __init__(self, owner: Fences, slot: int) -> None:
            self.owner, self.slot, self.left = owner, slot, owner.delay
            self.before = owner.digest(slot)
            self.finished = False

        def _finish(self) -> None:
            if not self.finished:
                self.finished = True
                self.owner.done += 1
                if self.owner.digest(self.slot) != self.before:  # written while the copy still ran
                    self.owner.violations.append(self.slot)

        def query(self) -> bool:
            self.left -= 1
            if self.left <= 0:
                self._finish()
            return self.left <= 0

        def synchronize(self) -> None:
            self.owner.waited += 1
            self.left = 0
            self._finish()


def test_every_claim_gets_its_own_slot_and_a_full_ring_hands_over_elsewhere(monkeypatch):
    ring = ring_of(3)
    claimed = [ring.acquire(SHAPE, gen=1) for _ in range(3)]
    assert all(c is not None for c in claimed)
    assert sorted(c[0].slot for c in claimed) == [0, 1, 2]  # type: ignore[index]
    assert [int(s) for s in ring.state[:, 0]] == [CLAIMED] * 3
    assert [int(s) for s in ring.state[:, 2]] == [os.getpid()] * 3
    monkeypatch.setattr(BatchRing, "WAIT", 0.01)
    assert ring.acquire(SHAPE) is None and ring.waited.value == 1  # no slot free: fresh memory instead
    assert ring.acquire((3, 40, 40, 3)) is None and ring.waited.value == 1  # too large for a slot


def test_take_lends_views_of_the_slot_itself(monkeypatch):
    ring = ring_of()
    ref = fill(ring, 7)
    copies = []
    real = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, *a, **k: copies.append(1) or real(self, *a, **k))
    images, labels, params = ring.take(ref)
    monkeypatch.undo()
    assert copies == [] and ring.copies == 0  # lent: nothing copied
    base = ring.buffers[ref.slot].data_ptr()
    for t in (images, labels, params):
        assert t is not None and base <= t.data_ptr() < base + ring.slot_bytes
    assert images.shape == (3, 3, 4, 4) and images.is_contiguous(memory_format=torch.channels_last)
    assert (images == 7).all() and labels.tolist() == [700, 701, 702] and labels.dtype == torch.int64
    assert params is not None and params.shape == (3, 14) and (params == 3.5).all()
    assert status(ring, ref) == PUBLISHED


def test_a_lent_slot_is_freed_once_no_tensor_refers_to_it():
    ring = ring_of()
    ref = fill(ring, 1)
    images, labels, params = ring.take(ref)
    keep = labels[1:]  # a view of the labels alone keeps the slot
    del images, labels, params
    ring.reclaim()
    assert status(ring, ref) == PUBLISHED
    assert keep.tolist() == [101, 102]
    del keep
    ring.reclaim()
    assert status(ring, ref) == FREE


def test_a_slot_let_go_of_is_written_again_only_after_its_fence():
    ring = ring_of(6)
    fences = Fences(ring, delay=3)
    ring.pin(fences.register, fences, pinned_copies=False)
    ring.pin(fences.register, fences, pinned_copies=False)
    assert len(fences.registered) == 6 == ring.registered  # page-locked once, each slot
    ref = fill(ring, 1)
    images = ring.take(ref)[0]
    del images
    ring.reclaim()  # let go of: a fence is recorded, the slot stays taken
    assert fences.made == 1 and status(ring, ref) == PUBLISHED
    ring.reclaim()
    assert status(ring, ref) == PUBLISHED  # the copy may still run
    ring.reclaim()
    assert status(ring, ref) == FREE and fences.done == 1 and fences.violations == []


def test_a_slot_written_before_its_fence_completes_is_reported():
    """The check the loader tests rely on can fail: a slot rewritten under a pending fence is seen."""
    ring = ring_of()
    fences = Fences(ring, delay=5)
    ring.pin(fences.register, fences, pinned_copies=False)
    ref = fill(ring, 1)
    ring.take(ref)
    ring.reclaim()
    ring.buffers[ref.slot].fill_(9)  # what a worker would do to a slot freed too early
    ring.reclaim()
    ring._held[ref.slot].synchronize()  # type: ignore[union-attr]
    assert fences.violations == [ref.slot]


def test_at_most_spare_slots_wait_on_fences_the_oldest_waited_for():
    ring = ring_of(8, spare=2)
    fences = Fences(ring, delay=100)
    ring.pin(fences.register, fences, pinned_copies=False)
    refs = [fill(ring, i) for i in range(4)]
    for ref in refs:
        ring.take(ref)  # each let go of at once
    ring.reclaim()
    assert fences.waited == 2  # 4 waiting, 2 allowed: the two oldest waited for
    assert [status(ring, r) for r in refs] == [FREE, FREE, PUBLISHED, PUBLISHED]
    assert fences.violations == []


def test_a_caller_holding_lend_batches_gets_the_next_one_copied():
    ring = ring_of(6, lend=2)
    held = [ring.take(fill(ring, i)) for i in (1, 2)]
    ref = fill(ring, 3)
    images, labels, params = ring.take(ref)
    assert ring.copies == 1 and status(ring, ref) == FREE  # its slot free at once
    base = ring.buffers[ref.slot].data_ptr()
    assert not base <= images.data_ptr() < base + ring.slot_bytes
    assert (images == 3).all() and labels.tolist() == [300, 301, 302] and params is not None and (params == 1.5).all()
    assert images.is_contiguous(memory_format=torch.channels_last)
    fill(ring, 4)  # a worker rewrites that slot; the copy stays as it was
    assert (images == 3).all() and all((h[0] == i).all() for h, i in zip(held, (1, 2)))


def test_batches_of_an_ended_iteration_are_freed_once_written():
    ring = ring_of(5)
    sent = fill(ring, 1, gen=1)  # written and sent, never received
    taken = fill(ring, 2, gen=1)
    images = ring.take(taken)[0]  # received and lent: not the iteration's to free
    writing = ring.acquire(SHAPE, gen=1)  # a worker still writing
    assert writing is not None
    current = fill(ring, 3, gen=2)  # the next iteration's
    ring.end(1)
    assert [status(ring, r) for r in (sent, taken, writing[0], current)] == [FREE, PUBLISHED, CLAIMED, PUBLISHED]
    ring.publish(writing[0])
    ring.reclaim()
    assert status(ring, writing[0]) == FREE  # freed once written
    assert (images == 2).all()
    ring.end(below=3)  # persistent workers reset: every earlier iteration ended
    assert status(ring, current) == FREE and status(ring, taken) == PUBLISHED


@pytest.mark.parametrize("claimed_before", [False, True])
def test_a_worker_that_asks_for_a_slot_after_its_iteration_ended_gets_none(claimed_before):
    """A worker still making a batch when its iteration is dropped (the DataLoader lets it finish while it
    shuts down) asks for a slot after the main process freed that iteration's slots: it gets none (its
    batch is for no one) though slots are free, and is not counted as waiting; once its workers are gone
    no slot is taken (before, the late claim was published under a generation the ring had forgotten:
    one slot of 9 taken for good, tests/test_loader.py failing under load in CI)."""
    ring = ring_of(3)
    early = ring.acquire(SHAPE, gen=1) if claimed_before else None  # a batch being written as it ends
    ring.end(1)
    assert ring.acquire(SHAPE, gen=1) is None and ring.waited.value == 0
    if early is not None:
        assert status(ring, early[0]) == CLAIMED
        ring.publish(early[0])
    ring.end()  # its workers shut down
    assert ring.free_slots() == 3
    assert ring.acquire(SHAPE, gen=2) is not None  # the next iteration's claims are served


def test_a_slot_claimed_by_a_worker_that_died_is_freed():
    ring = ring_of(3)
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(child.stdout)
    got = ring.acquire(SHAPE, gen=4)
    assert got is not None
    ring.state[got[0].slot, 2] = dead  # as if that process had claimed it and been killed
    ring.end(4)
    assert status(ring, got[0]) == FREE


def test_a_failed_batch_gives_its_slot_back(tmp_path, monkeypatch):
    """A transform that raises in a worker: the slot claimed for the batch is free again."""
    from conftest import convert_images

    from training_adapter import batch as batch_module
    from training_adapter import make_loader

    folder = convert_images(tmp_path, 12, size=8, shard_size=4)

    def boom(x):
        raise ValueError("a user's transform failed")

    ld = make_loader(folder, batch_size=4, train=False, num_workers=1, transform=boom)
    ds = ld.dataset
    ds.ring = ring = BatchRing(2, slot_layout(4 * 8 * 8 * 3, 4, False)[2])
    monkeypatch.setattr(batch_module, "get_worker_info", lambda: object())  # as in a worker
    rows = ds.index_plan(0, 1, 0)[0]
    with pytest.raises(ValueError, match="a user's transform failed"):
        ds.index_batch(rows, 0, 1, 0)
    assert ring.free_slots() == 2


def test_the_ring_travels_to_spawned_workers_without_its_main_process_state():
    import pickle

    from torch.multiprocessing.reductions import init_reductions

    init_reductions()
    ring = ring_of()
    ring.take(fill(ring, 5))
    state = ring.__getstate__()
    assert set(state) >= {"storages", "state", "lock", "gen"} and "_held" not in state and "_arrays" not in state
    with pytest.raises(RuntimeError, match="should only be shared between processes through inheritance"):
        pickle.dumps(ring)  # the lock goes only to processes being spawned (the DataLoader's workers)


def test_a_worker_of_an_ended_iteration_stops_waiting_for_a_slot(monkeypatch):
    """Its batch is for no one: it hands it over elsewhere at once (its DataLoader shuts down without
    waiting ``WAIT`` seconds for it), uncounted; a worker of a live iteration still waits."""
    monkeypatch.setattr(BatchRing, "WAIT", 0.2)
    ring = ring_of(2)
    for gen in (1, 2):
        assert ring.acquire(SHAPE, gen=gen) is not None
    ring.end(1)
    ring.end(below=2)  # and, persistent workers reset, every generation below 2
    for gen in (1, 0):
        t0 = time.monotonic()
        assert ring.acquire(SHAPE, gen=gen) is None
        assert time.monotonic() - t0 < 0.1 and ring.waited.value == 0
    t0 = time.monotonic()
    assert ring.acquire(SHAPE, gen=2) is None
    assert time.monotonic() - t0 >= 0.2 and ring.waited.value == 1


def _wait_for_a_slot(ring: BatchRing, q) -> None:
    """In a child process: wait for a slot of a full ring, past the look for the main process."""
    BatchRing.WAIT, BatchRing.ALIVE_EVERY = 1.3, 0.1  # past the 1 s the ring looked after before
    try:
        q.put(("handed over elsewhere", ring.acquire(SHAPE, gen=0) is None))
    except Exception as e:  # what a worker would raise
        q.put(("raised", repr(e)))


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_worker_waiting_for_a_slot_finds_its_main_process_under_every_start_method(method):
    """Under forkserver (Python 3.14's default on Linux) a worker's parent is the fork server, not the
    main process: a worker that waits for a slot must not take that for the main process gone."""
    import multiprocessing as mp

    ctx = mp.get_context(method)
    ring = ring_of(1, context=ctx)
    assert ring.acquire(SHAPE) is not None  # the ring is full: the child waits
    q = ctx.Queue()
    child = ctx.Process(target=_wait_for_a_slot, args=(ring, q))
    child.start()
    try:
        assert q.get(timeout=120) == ("handed over elsewhere", True)
    finally:
        child.join(30)
    assert ring.waited.value == 1


def test_a_worker_whose_main_process_is_gone_stops_waiting(monkeypatch):
    monkeypatch.setattr(BatchRing, "WAIT", 5.0)
    monkeypatch.setattr(BatchRing, "ALIVE_EVERY", 0.05)
    ring = ring_of(1)
    assert ring.acquire(SHAPE) is not None  # full; this first claim records this process's parent
    parent = os.getppid()
    monkeypatch.setattr(os, "getppid", lambda: parent + 1)  # reparented: the main process (or fork server) exited
    t0 = time.monotonic()
    with pytest.raises(ShardError, match=r"a loader worker's main process \(pid \d+\) is gone"):
        ring.acquire(SHAPE)
    assert time.monotonic() - t0 < 2
    monkeypatch.undo()
    ring = ring_of(1)
    assert ring.acquire(SHAPE) is not None
    ring._parent = _a_dead_pid()  # the main process's pid is gone
    monkeypatch.setattr(BatchRing, "ALIVE_EVERY", 0.05)
    with pytest.raises(ShardError, match="main process .* is gone"):
        ring.acquire(SHAPE)


def _a_dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def test_a_lock_held_by_a_killed_worker_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(BatchRing, "LOCK_WAIT", 0.2)
    ring = ring_of(2)
    fill(ring, 1, gen=1)
    ring.lock.acquire()  # as a worker killed between taking the lock and letting it go leaves it
    t0 = time.monotonic()
    with pytest.raises(ShardError, match=r"batch ring stayed locked for 0 s: a worker process was probably killed"):
        ring.acquire(SHAPE)
    with pytest.raises(ShardError, match="stayed locked"):
        ring.end(1)  # the main process does not hang either
    assert time.monotonic() - t0 < 2


def test_a_lent_slot_stays_taken_whatever_reference_count_the_interpreter_gives(monkeypatch):
    """An interpreter that counts one reference fewer (Python 3.14 borrows a call's argument): a slot
    the caller still holds is not freed, and one let go of is."""
    real = sys.getrefcount
    probe = [np.empty(0)]
    plain = real(probe[0])
    fewer = (lambda o: real(o))(probe[0]) - plain + 1  # the lambda's own reference, and one
    monkeypatch.setattr(sys, "getrefcount", lambda o: real(o) - fewer)
    counted = sys.getrefcount(probe[0])  # not in the assert, whose rewriting holds a reference of its own
    assert counted == plain - 1  # one fewer than this interpreter counts
    ring = ring_of()
    ref = fill(ring, 1)
    images = ring.take(ref)[0]
    ring.reclaim()
    assert status(ring, ref) == PUBLISHED and (images == 1).all()
    del images
    ring.reclaim()
    assert status(ring, ref) == FREE
    from training_adapter.buffers import BufferPool

    pool = BufferPool(2)
    a = pool.get((4, 4))
    b = pool.get((4, 4))
    assert a.data_ptr() != b.data_ptr()  # a is held: b is another buffer
    del a
    assert pool.get((4, 4)).data_ptr() != b.data_ptr()


def test_the_ring_is_made_on_the_cpu_whatever_the_default_device():
    with torch.device("meta"):  # as a trainer's torch.set_default_device("cuda") would
        ring = ring_of()
        images, labels, params = ring.take(fill(ring, 4))
        from training_adapter.buffers import shared

        fresh = shared((2, 3))
    assert images.device.type == "cpu" and (images == 4).all() and labels.tolist() == [400, 401, 402]
    assert fresh.device.type == "cpu" and fresh.is_shared()


def _child_reads(images: torch.Tensor, want: torch.Tensor, go, out) -> None:
    go.wait(60)
    out.put(bool(torch.equal(images, want)))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_batch_handed_to_a_forked_child_changes_once_the_parent_moves_on_unless_cloned(tmp_path, method):
    """Issue 38, point 5, as the training guide's Batch memory says: a batch from worker processes is a
    view of a ring slot (shared memory); a child forked with it shares that memory, so once this process
    lets go of the batch and a worker writes the slot again, the child reads the new batch. The remedy
    the guide gives, ``images.clone()`` handed over, keeps the child's batch as it was. Under spawn the
    batch is pickled: torch moves it into fresh shared memory, a copy, and it does not change."""
    import multiprocessing as mp

    from conftest import convert_images

    from training_adapter import make_loader

    folder = convert_images(tmp_path, 40, size=8, shard_size=5, val_fraction=0.0)
    loader = make_loader(folder, batch_size=2, train=False, split="train", num_workers=2, reader="stream")
    ctx = mp.get_context(method)
    seen = {}
    for remedy in (False, True):
        it = iter(loader)
        images, _ = next(it)
        want = images.clone()
        ring = loader.ring
        assert ring is not None
        slot = next(i for i, b in enumerate(ring.buffers) if b.data_ptr() <= images.data_ptr() < b.data_ptr() + len(b))
        go, out = ctx.Event(), ctx.Queue()
        child = ctx.Process(target=_child_reads, args=(images.clone() if remedy else images, want, go, out))
        child.start()
        del images
        for _ in range(20):  # until a worker has written another batch into that slot
            for _ in it:
                pass
            if not torch.equal(ring.buffers[slot][: want.numel()], want.permute(0, 2, 3, 1).reshape(-1)):
                break
            it = iter(loader)
        else:
            pytest.fail(f"slot {slot} was never written again")
        go.set()
        seen[remedy] = out.get(timeout=60)
        child.join(60)
    assert seen == {False: method != "fork", True: True}
