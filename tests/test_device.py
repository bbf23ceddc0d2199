"""device: batches on the device, ready to train on, against the oracle of each batch moved by hand.

On the CPU, ``make_loader(device="cpu")`` runs the same feed as on CUDA (only ``Streams`` differs):
each batch must equal ``to_device`` of the plain loader's batch (and under ``device_augment``,
``augment_batch`` of it), sample by sample, with and without worker processes, persistent or not.
``FakeStreams`` checks the feed's stream discipline: the consumer waits for each batch's event before
it gets it, every tensor handed across is handed over, and a CPU batch is held until the event after
its copy completed. ``FakeCuda`` records what the page-locking code calls of torch.cuda (devices,
contexts, cudaHostRegister, events) on a machine without CUDA. The tests marked ``cuda`` run on a
GPU machine only (``scripts/gpu_check.sh``): among them, the feed's copies held back by a long
kernel on its side stream while the slots turn over, against the oracle.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import convert_images
from test_buffers import Fences

from training_adapter import AugmentConfig, augment_batch, make_loader, to_device
from training_adapter.device import DeviceFeed, Streams
from wds_tools.errors import OptionError

S = 16
B = 4
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a GPU machine)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """60 train and 12 val samples of 16 px in shards of 9."""
    return convert_images(tmp_path_factory.mktemp("device"), 72, size=S, shard_size=9, val_every=6)


def plain_and_device(folder, *, device="cpu", dtype=torch.float32, epochs=1, **opts):
    """The same loader's epochs with and without ``device``: (plain batches, device batches, loader)."""
    plain = make_loader(folder, batch_size=B, **opts)
    moved = make_loader(folder, batch_size=B, device=device, dtype=dtype, **opts)
    out_plain, out_moved = [], []
    for e in range(epochs):
        plain.set_epoch(e)
        moved.set_epoch(e)
        # the plain batches cloned as they come (the loader's memory is reused); the device's kept as given
        out_plain += [tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in b) for b in plain]
        out_moved += list(moved)
    return out_plain, out_moved, moved


def expected(batch, loader, dtype, device="cpu"):
    """The oracle: the plain batch moved and normalised by to_device, or augmented by augment_batch."""
    o = loader.dataset.options
    if o.on_device:
        x = augment_batch(
            batch[0].to(device), batch[2].to(device), config=o.augmentation, mean=loader.mean, std=loader.std
        )
        return x.to(dtype)
    return to_device(batch[0], device, loader.mean, loader.std, dtype=dtype)


CONFIGS = [
    pytest.param(dict(train=True, num_workers=0), id="train-w0"),
    pytest.param(dict(train=True, num_workers=2), id="train-w2"),
    pytest.param(dict(train=True, num_workers=2, persistent_workers=True), id="train-w2-persistent"),
    pytest.param(dict(train=True, num_workers=2, reader="stream", shuffle_buffer=0), id="train-w2-stream"),
    pytest.param(dict(train=False, num_workers=2, return_keys=True), id="eval-w2-threads"),
    pytest.param(dict(train=True, device_augment=True, num_workers=0, return_keys=True), id="device-augment-w0"),
    pytest.param(dict(train=True, device_augment=True, num_workers=2), id="device-augment-w2-threads"),
    pytest.param(
        dict(
            train=True, device_augment=True, num_workers=2, persistent_workers=True, metadata=["width"], processes=True
        ),
        id="device-augment-w2-persistent-processes",
    ),
    pytest.param(dict(train=False, num_workers=2, processes=True), id="eval-w2-processes"),
    pytest.param(dict(train=True, num_workers=1, metadata=["width", "height"], return_keys=True), id="metadata-keys"),
]


DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


@pytest.mark.parametrize(
    "opts, dtype",
    [pytest.param(p.values[0], torch.float32, id=p.id) for p in CONFIGS]
    + [pytest.param(CONFIGS[i].values[0], d.values[0], id=f"{CONFIGS[i].id}-{d.id}") for i in (1, 7) for d in DTYPES],
)
def test_device_batches_equal_each_plain_batch_moved_by_hand(folder, opts, dtype, monkeypatch):
    opts = dict(opts)
    if opts.pop("processes", False):  # copy-only workers as processes, as where CUDA is
        monkeypatch.setattr("training_adapter.shardloader._threads_allowed", lambda: False)
    plain, moved, loader = plain_and_device(folder, dtype=dtype, epochs=2, **opts)
    assert len(plain) == len(moved) > 2 * len(loader) - 1
    k = 3 if loader.dataset.options.on_device else 2
    for p, m in zip(plain, moved):
        assert len(m) == len(p) - (k - 2)  # the params are used up on the device
        images, labels = m[0], m[1]
        assert images.dtype == dtype and images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(images, expected(p, loader, dtype))
        assert torch.equal(labels, p[1]) and labels.dtype == torch.int64
        for a, b in zip(m[2:], p[k:]):  # metadata (numbers as tensors there too) and keys as they were
            if isinstance(a, dict):
                assert a.keys() == b.keys() and all(torch.equal(a[c], b[c]) for c in a)
            else:
                assert a == b


@pytest.mark.parametrize(
    "opts",
    [
        pytest.param(dict(num_workers=0, augment={"affine_p": 1.0}), id="cpu-augment-w0"),
        pytest.param(dict(num_workers=2, augment={"affine_p": 1.0}), id="cpu-augment-w2-processes"),
        pytest.param(dict(num_workers=0, device_augment=True), id="device-augment-w0"),
        pytest.param(dict(num_workers=2, device_augment=True, processes=True), id="device-augment-w2-processes"),
    ],
)
def test_device_batches_under_the_callers_autocast_equal_the_oracle(folder, opts, monkeypatch):
    """A training loop wrapped whole in torch.autocast: the loader's next() (the feed's preparation,
    augment_batch, and the workers forked in it) runs under it, and must still give the oracle's pixels."""
    opts = dict(opts)
    if opts.pop("processes", False):
        monkeypatch.setattr("training_adapter.shardloader._threads_allowed", lambda: False)
    plain = [tuple(x.clone() for x in b) for b in make_loader(folder, batch_size=B, train=True, seed=4, **opts)]
    loader = make_loader(folder, batch_size=B, device="cpu", train=True, seed=4, **opts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = list(loader)
        still = torch.is_autocast_enabled("cpu")
    assert still and len(got) == len(plain) > 2
    for p, m in zip(plain, got):
        assert m[0].dtype == torch.float32 and torch.equal(m[0], expected(p, loader, torch.float32))


def test_device_batches_share_no_memory_with_the_loader_and_never_change(folder):
    """Every batch kept to the end: the values seen when it was yielded, none in the ring's slots."""
    loader = make_loader(folder, batch_size=B, train=True, num_workers=2, device="cpu")
    kept, seen = [], []
    for _ in range(2):
        for batch in loader:
            kept.append(batch)
            seen.append([t.clone() for t in batch[:2]])
    ring = loader.ring
    assert ring is not None and len(kept) == 2 * len(loader) > len(ring)  # more batches than slots: slots reused
    slots = [(b.data_ptr(), b.data_ptr() + ring.slot_bytes) for b in ring.buffers]
    for batch, was in zip(kept, seen):
        assert all(torch.equal(t, w) for t, w in zip(batch[:2], was))
        assert not any(lo <= t.data_ptr() < hi for t in batch[:2] for lo, hi in slots)


class FakeStreams(Streams):
    """Records the feed's stream calls; events complete after ``delay`` queries."""

    asynchronous = True

    def __init__(self, delay: int = 3) -> None:
        self.delay, self.log, self.events = delay, [], []

    def record(self):
        e = FakeEvent()
        e.left, e.n = self.delay, len(self.events)
        self.events.append(e)
        self.log.append(("record", e.n))
        return e

    def wait(self, event):
        self.log.append(("wait", event.n))

    def hand_over(self, t):
        self.log.append(("hand_over", t.data_ptr()))


class FakeEvent:
    left = 0
    n = 0

    def query(self) -> bool:
        self.left -= 1
        return self.left <= 0

    def synchronize(self) -> None:
        self.left = 0


def test_the_feed_waits_for_each_batch_and_holds_its_source_until_copied():
    streams = FakeStreams(delay=4)
    sources = [(torch.full((2, 3, 4, 4), i, dtype=torch.uint8), torch.tensor([i, i])) for i in range(6)]
    refs = [weakref.ref(b[0]) for b in sources]
    feed = DeviceFeed(
        torch.device("cpu"), dtype=torch.float32, mean=[0.5] * 3, std=[0.25] * 3, ahead=2, streams=streams
    )

    def source():
        while sources:
            yield sources.pop(0)

    got = []
    for i, (images, labels) in enumerate(feed(source())):
        copied, ready = 2 * i, 2 * i + 1  # each batch records two events: after its copy, after its preparation
        assert ("wait", ready) in streams.log and streams.log.index(("wait", ready)) > streams.log.index(
            ("record", ready)
        )
        assert ("hand_over", images.data_ptr()) in streams.log and ("hand_over", labels.data_ptr()) in streams.log
        issued = [j for j in range(6) if ("record", 2 * j) in streams.log]
        assert issued == list(range(min(6, i + 3)))  # this batch and two more issued
        for j in issued:  # a source whose copy may still run is held
            if streams.events[2 * j].left > 0:
                assert refs[j]() is not None, f"batch {j} dropped before its copy completed"
        assert len(streams.events) == 2 * len(issued)  # two events per batch issued, none else: ``copied`` is 2 * i
        assert refs[i]() is not None or streams.events[copied].left <= 0  # this batch's source: held until copied
        assert torch.allclose(images, torch.full_like(images, (i / 255 - 0.5) / 0.25), atol=1e-6), "batch i, normalised"
        got.append(labels[0].item())
    assert got == list(range(6))
    assert all(e.left <= 0 for e in streams.events[0::2])  # at the end every copy was waited for


def test_an_abandoned_feed_waits_for_the_copies_still_running():
    streams = FakeStreams(delay=100)
    batches = iter([(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64))] * 4)
    feed = DeviceFeed(torch.device("cpu"), dtype=torch.float32, mean=[0.5] * 3, std=[0.5] * 3, streams=streams)
    it = feed(batches)
    next(it)
    it.close()
    assert all(e.left <= 0 for e in streams.events[0::2])


class SerialStreams(Streams):
    """A side stream that lags: one serial queue in which each recorded event completes ``delay`` seconds
    after the one before it (or after it is recorded, when the queue is idle)."""

    asynchronous = True

    def __init__(self, delay: float) -> None:
        self.delay, self.last = delay, 0.0

    def record(self):
        self.last = max(time.monotonic(), self.last) + self.delay
        return TimedEvent(self.last)


class TimedEvent:
    def __init__(self, at: float) -> None:
        self.at = at

    def query(self) -> bool:
        return time.monotonic() >= self.at

    def synchronize(self) -> None:
        time.sleep(max(0.0, self.at - time.monotonic()))


@pytest.mark.parametrize("persistent", [False, True])
def test_a_lagging_side_stream_copies_no_batch_out_of_the_ring(folder, persistent, monkeypatch):
    """Issue 38, point 6: events that complete 15 ms apart (the side stream behind the training step), 2
    worker processes, prefetch_factor=1, three epochs: the feed holds no more CPU batches than the ring
    lends (it waits for its oldest copy), so no batch is copied out of its slot (109 of 130 were), and
    every batch equals the plain one moved by hand."""
    monkeypatch.setattr("training_adapter.shardloader._threads_allowed", lambda: False)  # worker processes
    opts = dict(batch_size=B, train=True, num_workers=2, prefetch_factor=1, seed=9, persistent_workers=persistent)
    plain = make_loader(folder, **opts)
    loader = make_loader(folder, device="cpu", **opts)
    loader._streams = SerialStreams(0.015)
    want, got = [], []
    for e in range(3):
        plain.set_epoch(e)
        loader.set_epoch(e)
        want += [tuple(x.clone() for x in b) for b in plain]
        got += list(loader)
    assert loader.ring is not None and len(got) == len(want) == 3 * len(loader) > 2 * len(loader.ring)
    assert loader.ring.copies == 0
    for p, m in zip(want, got):
        assert torch.equal(m[0], expected(p, loader, torch.float32)) and torch.equal(m[1], p[1])


@pytest.mark.parametrize("persistent", [False, True])
def test_the_pinned_ring_lends_every_slot_and_waits_for_each_fence(folder, persistent, monkeypatch):
    """pin_memory=True as where CUDA is (fake events that check the slot is untouched until they complete):
    every batch is its slot, page-locked once, no batch copied, no slot written under a pending fence;
    a batch the caller keeps never changes."""
    from test_loader import stored

    ref = stored(folder, "train")
    fences = Fences(None, delay=3)  # type: ignore[arg-type]
    made: list[weakref.ref] = []

    def fence(slot):
        fences.ring = made[-1]().ring
        return fences(slot)

    monkeypatch.setattr("training_adapter.shardloader._threads_allowed", lambda: False)  # worker processes
    monkeypatch.setattr("training_adapter.shardloader._cuda_present", lambda: True)  # as where CUDA is
    monkeypatch.setattr(
        "training_adapter.shardloader.cuda_register", lambda s, device=None: 0 if fences.register(s) else 1
    )
    monkeypatch.setattr("training_adapter.shardloader.cuda_fence", fence)
    loader = make_loader(
        folder,
        batch_size=B,
        train=False,
        split="train",
        num_workers=2,
        persistent_workers=persistent,
        return_keys=True,
        prefetch_factor=1,
        pin_memory=True,
    )
    made.append(weakref.ref(loader))  # not the loader itself: its ring holds this fence, and a cycle would keep its
    assert loader.pin_memory  # persistent workers until the interpreter's exit (12 s more)
    kept = None
    for epoch in range(3):
        for n, (images, labels, keys) in enumerate(loader):
            ring = loader.ring
            assert ring is not None
            assert any(b.data_ptr() <= images.data_ptr() < b.data_ptr() + ring.slot_bytes for b in ring.buffers)
            for im, k in zip(images, keys):
                assert np.array_equal(im.permute(1, 2, 0).numpy(), ref[k])
            fences.check()
            if epoch == 1 and n == 0:  # a caller may keep a batch
                kept = (images, keys)
            del images, labels
    assert ring.copies == 0 and ring.registered == len(ring) == len(fences.registered)
    assert fences.made >= 3 * len(loader) - 2 > len(ring)  # every batch let go of: all but the kept one and the last
    assert fences.done > 0 and fences.violations == []
    assert kept is not None
    for im, k in zip(*kept):
        assert np.array_equal(im.permute(1, 2, 0).numpy(), ref[k])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_resume_through_the_device_path(folder, device):
    """state_dict after 3 device batches, then a new loader: exactly the rest of the uninterrupted epoch."""
    opts = dict(batch_size=B, train=True, num_workers=2, device=device, device_augment=True, seed=3)
    whole = [b[0] for b in make_loader(folder, **opts)]
    first = make_loader(folder, **opts)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    del it
    rest = make_loader(folder, **opts)
    rest.load_state_dict(state)
    got = [b[0] for b in rest]
    assert len(got) == len(whole) - 3 and all(torch.equal(a, b) for a, b in zip(got, whole[3:]))


def test_device_options_are_checked(folder):
    with pytest.raises(OptionError, match=r"device='gpu0': not a device"):
        make_loader(folder, batch_size=B, train=True, device="gpu0")
    with pytest.raises(OptionError, match=r"dtype='int8': expected torch.float32, torch.bfloat16 or torch.float16"):
        make_loader(folder, batch_size=B, train=True, device="cpu", dtype="int8")
    with pytest.raises(OptionError, match=r"dtype=torch.uint8: expected"):
        make_loader(folder, batch_size=B, train=True, device="cpu", dtype=torch.uint8)
    with pytest.raises(OptionError, match="normalize=True normalises in the workers.*drop normalize"):
        make_loader(folder, batch_size=B, train=True, device="cpu", normalize=True)
    with pytest.raises(OptionError, match="device= normalises the images there and needs mean and std"):
        make_loader(f"pipe:cat {folder}/val-000000.tar", batch_size=2, train=False, num_workers=0, device="cpu")
    with pytest.raises(OptionError, match=r"pin_memory='yes': expected True, False or None"):
        make_loader(folder, batch_size=B, train=True, pin_memory="yes")
    if not torch.cuda.is_available():
        with pytest.raises(OptionError, match=r"device='cuda': CUDA is not available here"):
            make_loader(folder, batch_size=B, train=True, device="cuda")
    named = make_loader(folder, batch_size=B, train=True, num_workers=0, device="cpu", dtype="bfloat16")
    assert next(iter(named))[0].dtype == torch.bfloat16


def test_a_config_sets_device_and_dtype(folder, tmp_path):
    from training_adapter import load_config

    cfg = tmp_path / "train.yaml"
    cfg.write_text(
        f"dataset:\n  train_urls: {folder}\n  batch_size: 4\n  num_workers: 0\n  device: cpu\n  dtype: float16\n"
    )
    images, labels = next(iter(load_config(cfg).dataset.train_loader()))
    assert images.dtype == torch.float16 and images.is_floating_point() and labels.dtype == torch.int64


# --- page-locking and devices on a fake CUDA (what the loader calls of torch.cuda, recorded) ---------------
class FakeCuda:
    """torch.cuda as the page-locking code sees it: ``count`` devices, those with a context, the current
    one, ``cudaHostRegister``/``cudaHostUnregister`` (refusing the calls numbered in ``refuse``),
    ``synchronize``, streams and events; each call recorded in ``calls`` with the device then current."""

    def __init__(self, count: int = 4, current: int = 0, contexts=(0,), refuse=()) -> None:
        self.count, self.current, self.contexts, self.refuse = count, current, set(contexts), set(refuse)
        self.calls: list[tuple] = []
        self.registers = 0
        self.unregister_rc = 0
        self.events: list[FakeCuda.Event] = []

    def install(self, monkeypatch) -> FakeCuda:
        for name, value in {
            "is_available": lambda: True,
            "device_count": lambda: self.count,
            "current_device": lambda: self.current,
            "device": self.device,
            "cudart": lambda: self,
            "synchronize": lambda d=None: self.calls.append(("synchronize", d)),
            "current_stream": lambda d=None: ("stream", self.current if d is None else d),
            "Event": lambda: self.Event(self),
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", lambda d: d in self.contexts, raising=False)
        monkeypatch.setattr("training_adapter.device._clear_cuda_error", lambda: self.calls.append(("clear",)))
        return self

    @contextlib.contextmanager
    def device(self, d):
        before, self.current = self.current, torch.device(d).index
        self.contexts.add(self.current)  # a call in a device's context makes one
        try:
            yield
        finally:
            self.current = before

    def cudaHostRegister(self, ptr, size, flags):
        self.registers += 1
        self.calls.append(("register", ptr, self.current))
        return 712 if self.registers in self.refuse else 0

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr, self.current))
        return self.unregister_rc

    def cudaError(self, rc):
        return rc

    def cudaGetErrorString(self, rc):
        return "part or all of the requested memory range is already mapped"

    class Event:
        def __init__(self, owner) -> None:
            self.owner, self.done, self.stream = owner, False, None
            owner.events.append(self)

        def record(self, stream) -> None:
            self.stream = stream

        def query(self) -> bool:
            return self.done

        def synchronize(self) -> None:
            self.done = True


def test_a_slot_is_page_locked_in_the_given_devices_context_and_a_refusal_is_cleared(monkeypatch):
    from training_adapter.device import cuda_error, cuda_register

    fake = FakeCuda(refuse={2}).install(monkeypatch)
    taken, refused = torch.UntypedStorage._new_shared(4096), torch.UntypedStorage._new_shared(4096)
    assert cuda_register(taken, torch.device("cuda", 3)) == 0
    assert fake.calls == [("register", taken.data_ptr(), 3)] and fake.current == 0  # in cuda:3's context, not 0's
    assert cuda_register(refused, torch.device("cuda", 3)) == 712
    assert fake.calls[-1] == ("clear",)  # CUDA's last error taken, so no later kernel launch raises it
    assert cuda_error(712) == "cudaError 712: part or all of the requested memory range is already mapped"
    fake.calls.clear()
    del refused  # freed at once (no cycle holds a storage): its finalizer, if any, runs now
    assert fake.calls == []  # never page-locked: nothing to undo
    del taken
    assert fake.calls[-1][0] == "unregister"


def test_a_slot_is_unregistered_once_every_device_with_a_context_is_done(monkeypatch, caplog):
    """A copy out of a slot the caller let go of may still be queued on any device when the slot's memory
    goes: each device with a context is synchronised before cudaHostUnregister; a failure is said and cleared."""
    from training_adapter.device import cuda_register

    fake = FakeCuda(count=4, contexts={0, 2}).install(monkeypatch)
    storage = torch.UntypedStorage._new_shared(4096)
    ptr = storage.data_ptr()
    assert cuda_register(storage, torch.device("cuda", 1)) == 0
    fake.calls.clear()
    fake.unregister_rc = 1
    del storage
    assert fake.calls == [
        ("synchronize", 0),
        ("synchronize", 1),
        ("synchronize", 2),
        ("unregister", ptr, 1),
        ("clear",),
    ]
    assert "cudaHostUnregister of a loader's batch slot failed (cudaError 1: " in caplog.text


def test_the_fence_is_recorded_on_every_device_with_a_context(monkeypatch):
    from training_adapter.device import cuda_fence

    fake = FakeCuda(count=3, contexts={0, 2}).install(monkeypatch)
    fence = cuda_fence(5)
    assert [e.stream for e in fake.events] == [("stream", 0), ("stream", 2)]  # a copy on cuda:2 is waited for too
    assert not fence.query()
    fake.events[0].done = True
    assert not fence.query()
    fake.events[1].done = True
    assert fence.query()


def test_cuda_is_the_current_device_when_the_loader_is_made(folder, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    fake = FakeCuda(count=4, current=2).install(monkeypatch)
    loader = make_loader(folder, batch_size=B, train=True, num_workers=0, device="cuda")
    fake.current = 0  # a set_device after make_loader moves nothing
    assert loader.device == torch.device("cuda", 2)
    assert make_loader(folder, batch_size=B, train=True, num_workers=0, device="cuda:1").device == torch.device(
        "cuda", 1
    )
    with pytest.raises(OptionError, match=r"device='cuda:7': this machine has 4 CUDA device\(s\), cuda:0 to cuda:3"):
        make_loader(folder, batch_size=B, train=True, device="cuda:7")


@pytest.mark.parametrize(
    "current, local_rank, count, device, want",
    [
        (0, "2", 4, "cuda", 2),  # the rank did not call set_device: its own device, not cuda:0
        (2, "2", 4, "cuda", 2),  # it did
        (0, "3", 1, "cuda", 0),  # one device visible per rank (CUDA_VISIBLE_DEVICES): that one
        (0, "2", 4, "cuda:1", 1),  # a device named is the device named
        (0, None, 4, "cuda", 0),  # no torchrun: the current device
        (1, "2", 4, "cuda", r"LOCAL_RANK=2 but the current CUDA device is cuda:1 \(of 4\): name the rank's device"),
        (0, "5", 4, "cuda", r"LOCAL_RANK=5 but the current CUDA device is cuda:0 \(of 4\)"),
        (0, "x", 4, "cuda", r"LOCAL_RANK='x' is not an integer; pass device='cuda:N'"),
    ],
)
def test_a_bare_cuda_is_this_ranks_device_under_torchrun(folder, monkeypatch, current, local_rank, count, device, want):
    """Issue 38, point 7: under torchrun every rank that forgot torch.cuda.set_device fed and page-locked
    on cuda:0; a bare 'cuda' is cuda:LOCAL_RANK there, or a mismatch is refused by name."""
    FakeCuda(count=count, current=current).install(monkeypatch)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    if isinstance(want, int):
        loader = make_loader(folder, batch_size=B, train=True, num_workers=0, device=device)
        assert loader.device == torch.device("cuda", want)
    else:
        with pytest.raises(OptionError, match=rf"^device='cuda'.*{want}"):
            make_loader(folder, batch_size=B, train=True, num_workers=0, device=device)


@pytest.mark.parametrize(
    "device, name",
    [("mps", r"MPS \(Apple GPUs\)"), ("xpu", r"XPU \(Intel GPUs\)"), ("cuda", "CUDA"), ("cuda:1", "CUDA")],
)
def test_a_device_this_machine_lacks_is_one_line_before_any_work(tmp_path, device, name):
    """Issue 38, point 8: mps and xpu failed at the first batch with torch's RuntimeError, and to_device to
    'cuda' on a CPU machine with an AssertionError; each is an OptionError naming the device, raised by
    make_loader before it looks at the shards (these do not exist)."""
    module = torch.backends.mps if device == "mps" else getattr(torch, device.split(":")[0])
    if module.is_available():
        pytest.skip(f"this machine has {device}")
    with pytest.raises(
        OptionError, match=rf"^device='{device}': {name} is not available here \(torch .*\); use device='cpu'$"
    ):
        make_loader(tmp_path / "no-such-shards", batch_size=B, train=True, device=device)
    images = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    with pytest.raises(OptionError, match=rf"^to_device: device='{device}': {name} is not available here"):
        to_device(images, device)
    assert to_device(images, "cpu").dtype == torch.float32


def test_train_example_says_a_missing_device_in_one_line(tmp_path, folder):
    """scripts/train_example.py with a config asking for a device this machine lacks: the message alone on
    stderr, exit 2 (a usage error, docs/exit-codes.md), no traceback."""
    import subprocess
    import sys

    device = "xpu" if not torch.xpu.is_available() else "mps"
    config = tmp_path / "train.yaml"
    config.write_text(f"dataset:\n  train_urls: {folder}\n  batch_size: 4\n  num_workers: 0\n  device: {device}\n")
    script = Path(__file__).resolve().parents[1] / "scripts" / "train_example.py"
    done = subprocess.run(
        [sys.executable, str(script), "--config", str(config)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"train_example.py: error: device='{device}': ") and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_ring_is_page_locked_on_the_loaders_device_and_only_what_the_driver_took_is_lent(
    folder, monkeypatch, caplog
):
    """device='cuda:3' with cuda:0 current: every slot registered in cuda:3's context (no context made on
    cuda:0); the driver refuses one slot: it is said, not counted, and its batches are copied out."""
    fake = FakeCuda(count=4, current=0, contexts=(), refuse={2}).install(monkeypatch)
    loader = make_loader(folder, batch_size=B, train=True, num_workers=2, device="cuda:3")
    ring = loader._ring()
    ring._pinned_copies = False  # the CPU has no page-locked allocator: plain copies stand in
    registers = [c for c in fake.calls if c[0] == "register"]
    assert len(registers) == len(ring) and {c[2] for c in registers} == {3} and fake.contexts == {3}
    assert ring.registered == len(ring) - 1
    assert (
        f"cudaHostRegister refused 1 of the loader's {len(ring)} batch slots (cudaError 712: part or all" in caplog.text
    )
    refused = ring.storages.index(next(s for s in ring.storages if s.data_ptr() == registers[1][1]))
    shape = (B, S, S, 3)
    refs = []
    for value in range(len(ring)):  # a batch in each slot, as workers write them
        got = ring.acquire(shape, gen=0, params=False)
        assert got is not None
        got[1].fill_(value)
        ring.publish(got[0])
        refs.append((got[0], value))
    for ref, value in refs:  # every slot but the refused one is lent; that one is copied out
        images = ring.take(ref)[0]
        base = ring.buffers[ref.slot].data_ptr()
        lent = base <= images.data_ptr() < base + ring.slot_bytes
        assert lent == (ref.slot != refused) and (images == value).all()
        del images
        ring.reclaim()
    assert ring.copies == 1
    del loader, ring, refs, got  # the slots unregistered while the fake is in place
    assert len([c for c in fake.calls if c[0] == "unregister"]) == len(registers) - 1


def test_pin_memory_is_off_unless_asked_without_device(folder, monkeypatch):
    """Where CUDA is, the default (None) leaves batches pageable as before issue 30: a slot is then written
    again as soon as no tensor refers to it, and nothing the caller's copies do can read a rewritten slot."""
    from test_buffers import Fences

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fences = Fences(None, delay=1)  # type: ignore[arg-type]
    made: list[weakref.ref] = []

    def fence(slot):
        fences.ring = made[-1]().ring
        return fences(slot)

    monkeypatch.setattr(
        "training_adapter.shardloader.cuda_register", lambda s, device=None: 0 if fences.register(s) else 1
    )
    monkeypatch.setattr("training_adapter.shardloader.cuda_fence", fence)
    for pin, locked in ((None, False), (False, False), (True, True)):
        loader = make_loader(folder, batch_size=B, train=True, num_workers=2, pin_memory=pin)
        made.append(weakref.ref(loader))
        n = sum(1 for _ in loader)
        ring = loader.ring
        assert ring is not None and n == len(loader)
        assert loader.pin_memory is locked and (ring.registered == len(ring)) is locked
        assert (fences.made >= n - 1) is locked
        fences.made = 0


def test_rocm_copies_batches_into_page_locked_memory_instead_of_registering(folder, monkeypatch):
    fake = FakeCuda().install(monkeypatch)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    loader = make_loader(folder, batch_size=B, train=True, num_workers=2, pin_memory=True, seed=5)
    want = [b[0].clone() for b in make_loader(folder, batch_size=B, train=True, num_workers=0, seed=5)]
    loader._ring()._pinned_copies = False  # the CPU has no page-locked allocator: plain copies stand in
    got = [b[0].clone() for b in loader]
    ring = loader.ring
    assert ring is not None and not [c for c in fake.calls if c[0] == "register"] and ring.registered == 0
    assert ring.copies == len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_ring_larger_than_the_shared_memory_free_is_refused(folder, monkeypatch):
    monkeypatch.setattr("training_adapter.shardloader.shared_memory_free", lambda: 2**20)
    loader = make_loader(folder, batch_size=B, train=True, num_workers=2, prefetch_factor=4)
    monkeypatch.setattr(loader, "_slot_bytes", 2**20)  # 1 MB batches
    with pytest.raises(
        OptionError,
        match=r"the loader's batch ring needs 13 MB of shared memory \(13 batches of 1.0 MB: prefetch_factor=4 x "
        r"num_workers=2, and 5 this process may hold\), but /dev/shm has 1 MB free: lower prefetch_factor, "
        r"num_workers or batch_size",
    ):
        next(iter(loader))


# --- on a GPU machine -----------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("side_stream", [False, True])
@pytest.mark.parametrize("persistent", [False, True])
def test_cuda_pinned_ring_copies_nothing_and_slots_wait_for_the_copies(folder, persistent, side_stream):
    """pin_memory=True: each batch is its page-locked slot; copied with non_blocking=True behind a long
    kernel (so the copy is still queued when the CPU batch is let go of) while the slots turn over, on
    the current stream or (the documented rule) on another one the current stream then waits for,
    every copy equals the plain batch."""
    opts = dict(batch_size=B, train=True, num_workers=2, persistent_workers=persistent, seed=1, prefetch_factor=1)
    want = [
        b[0].clone()
        for b in make_loader(folder, num_workers=0, **{k: v for k, v in opts.items() if k != "num_workers"})
    ]
    loader = make_loader(folder, pin_memory=True, **opts)
    other = torch.cuda.Stream()
    copies = []
    for images, _labels in loader:
        assert images.is_pinned()
        with torch.cuda.stream(other) if side_stream else contextlib.nullcontext():
            torch.cuda._sleep(20_000_000)  # the copy below queues behind this
            copies.append(images.to("cuda", non_blocking=True))
        if side_stream:
            torch.cuda.current_stream().wait_stream(other)  # before the next batch, as the guide says
        del images
    torch.cuda.synchronize()
    ring = loader.ring
    assert ring is not None and ring.copies == 0 and ring.registered == len(ring) < len(copies)
    assert len(copies) == len(want) and all(torch.equal(c.cpu(), w) for c, w in zip(copies, want))


@cuda
@pytest.mark.parametrize("device_augment", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_cuda_device_batches_equal_the_oracle(folder, device_augment, workers):
    opts = dict(train=True, num_workers=workers, device_augment=device_augment, seed=2)
    plain, moved, loader = plain_and_device(folder, device="cuda", dtype=torch.bfloat16, epochs=2, **opts)
    assert len(plain) == len(moved)
    for p, m in zip(plain, moved):
        assert m[0].is_cuda and m[1].is_cuda and m[0].dtype == torch.bfloat16
        assert m[0].is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(m[0], expected(p, loader, torch.bfloat16, "cuda"))
        assert torch.equal(m[1].cpu(), p[1])


@cuda
def test_cuda_feed_does_not_synchronise_in_the_steady_state(folder):
    """No step of the device path makes the host wait for the GPU (torch's sync debug mode raises)."""
    loader = make_loader(folder, batch_size=B, train=True, num_workers=2, device_augment=True, device="cuda")
    it = iter(loader)
    next(it)  # the first batch makes the constants (mean, std, the augmentation's tables) once
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            images, labels = next(it)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    it.close()


@cuda
def test_cuda_augment_batch_equals_the_cpu_result():
    cfg = AugmentConfig(affine_p=1.0, saturation=0.3)
    x = torch.randint(0, 256, (16, 3, 64, 64), dtype=torch.uint8)
    keys = [f"k{i}" for i in range(16)]
    cpu = augment_batch(x, keys, config=cfg, seed=1, epoch=2, mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3])
    gpu = augment_batch(x.cuda(), keys, config=cfg, seed=1, epoch=2, mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3])
    assert (gpu.cpu() - cpu).abs().max() <= 1e-4


@contextlib.contextmanager
def _slow_side(real, self):
    """The feed's side stream with a long kernel queued first: its copies run well after the host issued them."""
    with real(self):
        torch.cuda._sleep(30_000_000)
        yield


def _slowed(monkeypatch) -> None:
    from training_adapter.device import CudaStreams

    real = CudaStreams.side
    monkeypatch.setattr(CudaStreams, "side", lambda self: _slow_side(real, self))


@cuda
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("device_augment", [False, True])
def test_cuda_a_slow_side_stream_never_lets_a_slot_be_written_under_its_copy(
    folder, device_augment, persistent, monkeypatch
):
    """The copies out of the ring's slots held back by a long kernel on the side stream, 2 workers with a
    slot each ahead (prefetch_factor=1), two epochs: a slot freed before its copy ran would be rewritten by a
    worker and the copy read the next batch. Every batch equals the oracle."""
    _slowed(monkeypatch)
    opts = dict(train=True, num_workers=2, prefetch_factor=1, persistent_workers=persistent)
    opts.update(device_augment=device_augment, seed=6)
    plain, moved, loader = plain_and_device(folder, device="cuda", epochs=2, **opts)
    assert len(plain) == len(moved) == 2 * len(loader) and loader.ring is not None
    assert loader.ring.registered == len(loader.ring) and loader.ring.copies == 0
    for p, m in zip(plain, moved):
        assert torch.equal(m[0], expected(p, loader, torch.float32, "cuda")) and torch.equal(m[1].cpu(), p[1])


@cuda
def test_cuda_an_epoch_broken_off_with_copies_in_flight_then_the_next(folder, monkeypatch):
    _slowed(monkeypatch)
    opts = dict(batch_size=B, train=True, num_workers=2, prefetch_factor=1, seed=7)
    plain = make_loader(folder, **opts)
    want = []
    for e in range(2):
        plain.set_epoch(e)
        want.append([tuple(x.clone() for x in b) for b in plain])
    loader = make_loader(folder, device="cuda", **opts)
    loader.set_epoch(0)
    first = []
    for i, batch in enumerate(loader):  # two batches taken, two more being copied: broken off
        first.append(batch)
        if i == 1:
            break
    loader.set_epoch(1)
    second = list(loader)
    assert len(second) == len(want[1])
    for got, exp in ((first, want[0][:2]), (second, want[1])):
        for m, p in zip(got, exp):
            assert torch.equal(m[0], expected(p, loader, torch.float32, "cuda")) and torch.equal(m[1].cpu(), p[1])


@cuda
def test_cuda_a_loop_under_autocast_gets_the_oracles_batches(folder):
    opts = dict(batch_size=B, train=True, num_workers=2, device_augment=True, seed=8)
    plain = [tuple(x.clone() for x in b) for b in make_loader(folder, **opts)]
    loader = make_loader(folder, device="cuda", dtype=torch.bfloat16, **opts)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = list(loader)
    assert len(got) == len(plain)
    for p, m in zip(plain, got):
        assert m[0].dtype == torch.bfloat16 and torch.equal(m[0], expected(p, loader, torch.bfloat16, "cuda"))


@cuda
def test_cuda_a_refused_registration_leaves_no_error_for_the_next_kernel():
    """cudaHostRegister of memory registered already is refused; CUDA's last error it leaves must not
    come out of the next, unrelated kernel launch."""
    from training_adapter.device import cuda_register

    storage = torch.UntypedStorage._new_shared(1 << 20)
    here = torch.device("cuda", torch.cuda.current_device())
    assert cuda_register(storage, here) == 0
    assert cuda_register(storage, here) != 0  # cudaErrorHostMemoryAlreadyRegistered
    x = torch.ones(4, device="cuda") * 2
    torch.cuda.synchronize()
    assert x.sum().item() == 8
    del storage  # unregistered once, by the first registration's finalizer
    torch.cuda.synchronize()


@cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cuda_a_loader_on_the_second_device_makes_no_context_on_the_first(folder):
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from training_adapter import make_loader\n"
        f"loader = make_loader({str(folder)!r}, batch_size=4, train=True, num_workers=2, device='cuda:1')\n"
        "images, labels = next(iter(loader))\n"
        "assert images.device == torch.device('cuda', 1)\n"
        "print(torch._C._cuda_hasPrimaryContext(0))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "False"
