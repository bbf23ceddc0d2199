"""device: batches on the device, ready to train on, against the oracle of each batch moved by hand.

On the CPU, ``make_loader(device="cpu")`` runs the same feed as on CUDA (only ``Streams`` differs):
each batch must equal ``to_device`` of the plain loader's batch (and under ``device_augment``,
``augment_batch`` of it), sample by sample, with and without worker processes, persistent or not.
``FakeStreams`` checks the feed's stream discipline: the consumer waits for each batch's event before
it gets it, every tensor handed across is handed over, and a CPU batch is held until the event after
its copy completed. The tests marked ``cuda`` run on a GPU machine only (``scripts/gpu_check.sh``).
"""

from __future__ import annotations

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
        monkeypatch.setattr("training_adapter.loader._threads_allowed", lambda: False)
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
        assert copied == 2 * i
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


@pytest.mark.parametrize("persistent", [False, True])
def test_the_pinned_ring_lends_every_slot_and_waits_for_each_fence(folder, persistent, monkeypatch):
    """pin_memory as where CUDA is (fake events that check the slot is untouched until they complete):
    every batch is its slot, page-locked once, no batch copied, no slot written under a pending fence;
    a batch the caller keeps never changes."""
    from test_loader import stored

    ref = stored(folder, "train")
    fences = Fences(None, delay=3)  # type: ignore[arg-type]

    def fence(slot):
        fences.ring = loader.ring
        return fences(slot)

    monkeypatch.setattr("training_adapter.loader._threads_allowed", lambda: False)  # worker processes
    monkeypatch.setattr("training_adapter.loader.cuda_register", fences.register)
    monkeypatch.setattr("training_adapter.loader.cuda_fence", fence)
    loader = make_loader(
        folder,
        batch_size=B,
        train=False,
        split="train",
        num_workers=2,
        persistent_workers=persistent,
        return_keys=True,
        prefetch_factor=1,
    )
    loader.pin_memory = True  # as make_loader sets it where CUDA is
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


def test_resume_through_the_device_path(folder):
    """state_dict after 3 device batches, then a new loader: exactly the rest of the uninterrupted epoch."""
    opts = dict(batch_size=B, train=True, num_workers=2, device="cpu", device_augment=True, seed=3)
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


# --- on a GPU machine -----------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("persistent", [False, True])
def test_cuda_pinned_ring_copies_nothing_and_slots_wait_for_the_copies(folder, persistent):
    """Each batch is its page-locked slot; copied with non_blocking=True behind a long kernel (so the
    copy is still queued when the CPU batch is let go of) while the slots turn over, every copy
    equals the plain batch."""
    opts = dict(batch_size=B, train=True, num_workers=2, persistent_workers=persistent, seed=1)
    want = [
        b[0].clone()
        for b in make_loader(folder, num_workers=0, **{k: v for k, v in opts.items() if k != "num_workers"})
    ]
    loader = make_loader(folder, pin_memory=True, **opts)
    busy = torch.randn(2048, 2048, device="cuda")
    copies = []
    for images, _labels in loader:
        assert images.is_pinned()
        for _ in range(20):
            busy = busy @ busy / busy.norm()  # the copy below queues behind these
        copies.append(images.to("cuda", non_blocking=True))
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


@cuda
def test_cuda_resume_through_the_device_path(folder):
    opts = dict(batch_size=B, train=True, num_workers=2, device="cuda", device_augment=True, seed=3)
    whole = [b[0] for b in make_loader(folder, **opts)]
    first = make_loader(folder, **opts)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    it.close()
    rest = make_loader(folder, **opts)
    rest.load_state_dict(state)
    got = [b[0] for b in rest]
    assert len(got) == len(whole) - 3 and all(torch.equal(a, b) for a, b in zip(got, whole[3:]))
