"""Device: batches moved to the accelerator ahead of the training step, ready to train on.

``DeviceFeed`` copies and prepares each batch on a side stream ahead of the step (``Streams``: all
that differs between devices, so the same code runs on the CPU); ``to_device`` moves one batch by
hand; ``cuda_register`` and ``cuda_fence`` page-lock the ring's slots and fence their reuse
(docs/guide/loader-internals.md, Workers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from wds_tools.errors import OptionError

from .augment import AugmentConfig, augment_batch, no_autocast, normalize
from .buffers import Fence

__all__ = [
    "DeviceFeed",
    "Streams",
    "CudaStreams",
    "to_device",
    "cuda_register",
    "cuda_error",
    "cuda_fence",
    "cuda_devices_in_use",
    "as_device",
    "parse_device",
    "as_dtype",
]

log = logging.getLogger("training_adapter")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The image dtypes ``make_loader(device=...)`` yields, by name."""


_NAMES = {"cuda": "CUDA", "mps": "MPS (Apple GPUs)", "xpu": "XPU (Intel GPUs)"}


def parse_device(device: Any, what: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` (as given: a bare ``"cuda"`` stays the current device), if this
    machine has it; an ``OptionError`` naming it (``what``: the argument) when it is malformed or absent."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise OptionError(f"{what}={device!r}: not a device ({e}); expected e.g. 'cuda', 'cuda:1' or 'cpu'") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        here = mps is not None and mps.is_available()
    else:  # cuda, xpu and backends registered as torch.<type> answer is_available()
        available = getattr(getattr(torch, dev.type, None), "is_available", None)
        here = callable(available) and bool(available())
    if not here:
        raise OptionError(
            f"{what}={device!r}: {_NAMES.get(dev.type, repr(dev.type))} is not available here (torch "
            f"{torch.__version__}); use device='cpu'"
        )
    return dev


def as_device(device: Any) -> torch.device:
    """The loader's device: ``device`` (``parse_device``) with its index; an ``OptionError`` naming it
    when it is malformed, absent, or (a bare ``"cuda"`` under torchrun) not this rank's."""
    dev = parse_device(device)
    count_of = getattr(getattr(torch, dev.type, None), "device_count", None)
    if dev.type == "cpu" or not callable(count_of):
        return dev
    count = int(count_of())
    if dev.type != "cuda":
        index = 0 if dev.index is None else dev.index
    elif dev.index is not None:
        index = dev.index
    else:
        # 'cuda' is this rank's device now, when the loader is made, for its whole life (resolved later, a
        # set_device in between would move its copies and its page-locking to another device)
        index = _cuda_of_this_rank(device, count)
    if not 0 <= index < count:
        raise OptionError(
            f"device={device!r}: this machine has {count} {_NAMES.get(dev.type, dev.type)} device(s), "
            f"{dev.type}:0 to {dev.type}:{count - 1}"
        )
    return torch.device(dev.type, index)


def _cuda_of_this_rank(device: Any, count: int) -> int:
    """The CUDA device a bare ``"cuda"`` names: the current one; under torchrun (``LOCAL_RANK``) with
    several devices visible, ``cuda:LOCAL_RANK`` where the current one is still the default cuda:0 (a
    rank that did not call ``torch.cuda.set_device`` would otherwise feed and page-lock on cuda:0)."""
    current = torch.cuda.current_device()
    local = os.environ.get("LOCAL_RANK")
    if local is None or count == 1:  # one device visible: each rank sees its own (CUDA_VISIBLE_DEVICES)
        return current
    try:
        rank = int(local)
    except ValueError:
        raise OptionError(f"device={device!r}: LOCAL_RANK={local!r} is not an integer; pass device='cuda:N'") from None
    if rank == current or (current == 0 and 0 <= rank < count):
        return rank
    raise OptionError(
        f"device={device!r} under torchrun: LOCAL_RANK={rank} but the current CUDA device is cuda:{current} "
        f"(of {count}): name the rank's device, device=f'cuda:{{local_rank}}', or call "
        f"torch.cuda.set_device(local_rank) before make_loader"
    )


def as_dtype(dtype: Any) -> torch.dtype:
    """The images' dtype: a floating ``torch.dtype`` or one of ``DTYPES``' names."""
    got = DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    if not isinstance(got, torch.dtype) or got not in DTYPES.values():
        raise OptionError(f"dtype={dtype!r}: expected torch.float32, torch.bfloat16 or torch.float16 (or their names)")
    return got


class _Done:
    """A fence for work done when issued."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class Streams:
    """Where the feed's work runs: here, at once (the CPU and any device without streams)."""

    asynchronous = False

    def side(self) -> contextlib.AbstractContextManager[Any]:
        """The context the copy and preparation are issued in."""
        return contextlib.nullcontext()

    def record(self) -> Fence:
        """An event after the work issued so far in ``side``."""
        return _Done()

    def wait(self, event: Fence) -> None:
        """Make the consumer's (current) stream wait for ``event``."""

    def hand_over(self, t: torch.Tensor) -> None:
        """Tell the allocator ``t``, made in ``side``, is used on the consumer's stream."""

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in page-locked memory, if the copy from it is to be asynchronous."""
        return t


class CudaStreams(Streams):
    """A CUDA device's side stream and events."""

    asynchronous = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        """The side stream, on the feed's device."""
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield

    def record(self) -> Fence:
        """An event recorded on the side stream."""
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: Fence) -> None:
        """The current stream waits for ``event`` (not the host)."""
        torch.cuda.current_stream(self.device).wait_event(event)  # type: ignore[arg-type]

    def hand_over(self, t: torch.Tensor) -> None:
        """``record_stream`` on the current stream: its memory is not reused before that stream is done with it."""
        t.record_stream(torch.cuda.current_stream(self.device))

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` itself when page-locked (a ring slot), else a page-locked copy."""
        # a copy from pageable memory would wait for the side stream's earlier work; torch's own
        # page-locked copy is tracked by its caching host allocator
        return t if t.is_pinned() else t.pin_memory()


def streams_for(device: torch.device) -> Streams:
    """CUDA's streams for a CUDA device, else work done when issued."""
    return CudaStreams(device) if device.type == "cuda" else Streams()


class DeviceFeed:
    """The loader's batches on ``device``, ``ahead`` batches copied and prepared ahead (docs/guide/loader-internals.md).

    At most ``hold`` CPU batches are held for their copies as the next is asked for: when the side
    stream lags that far behind, the feed waits for the oldest copy (the loader's ring lends no more
    slots, and would copy each further batch out of its slot). A batch ``(images, labels[, params][,
    metadata][, keys])`` comes out as ``(images, labels[, metadata][, keys])``: images uint8 ``[B, 3, H, W]`` normalised with ``mean``/``std`` (or, with
    ``params`` and ``augment``, through ``augment_batch``) as ``dtype``, channels-last; images a
    ``transform`` made floating are moved and cast as they are. Labels and the metadata's numbers
    go to the device too; nothing handed over shares memory with the loader's.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        dtype: torch.dtype,
        mean: Sequence[float],
        std: Sequence[float],
        params: bool = False,
        augment: AugmentConfig | None = None,
        ahead: int = 2,
        streams: Streams | None = None,
        hold: int | None = None,
    ) -> None:
        self.device, self.dtype, self.mean, self.std = device, dtype, list(mean), list(std)
        self.params, self.augment, self.ahead = params, augment, max(1, ahead)
        self.streams = streams if streams is not None else streams_for(device)
        # the most CPU batches held (their copies issued, not known done) as the next is asked for: the ring
        # lends that many slots, and copies a batch out of its slot beyond them
        self.hold = max(self.ahead + 1, hold if hold is not None else self.ahead + 1)

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        src = iter(batches)
        ready: deque[tuple[Any, Fence]] = deque()  # issued: (the batch on the device, its ready event)
        held: deque[tuple[Any, Fence]] = deque()  # (a CPU batch, the event after its copy): held until done
        s = self.streams
        ended = False
        try:
            while True:
                while not ended and len(ready) <= self.ahead:  # this batch and ``ahead`` more issued
                    while len(held) >= self.hold:  # the side stream lags: wait for the oldest copy, not hold more
                        held.popleft()[1].synchronize()
                    try:
                        batch = next(src)
                    except StopIteration:
                        ended = True
                        break
                    out, copied, done = self._issue(batch)
                    held.append((batch, copied))
                    ready.append((out, done))
                if not ready:
                    return
                out, done = ready.popleft()
                s.wait(done)
                for t in _tensors(out):
                    s.hand_over(t)
                while held and held[0][1].query():
                    held.popleft()
                yield out
        finally:
            for _, copied in held:  # a slot must not be written while a copy out of it may still run
                copied.synchronize()

    def _issue(self, batch: Any) -> tuple[Any, Fence, Fence]:
        """Issue ``batch``'s copy and preparation in the side stream: (the batch on the device, the
        event after the copies, the event after the preparation)."""
        s, dev = self.streams, self.device
        k = 3 if self.params else 2
        images, labels = batch[0], batch[1]
        params = batch[2] if self.params else None
        rest = batch[k:]
        nb = s.asynchronous
        with s.side(), no_autocast(dev):  # the caller's next() may run under its torch.autocast
            x = s.pinned(images).to(dev, non_blocking=nb)
            y = s.pinned(labels).to(dev, non_blocking=nb, copy=True)
            p = None if params is None else s.pinned(params).to(dev, non_blocking=nb, copy=True)
            moved = tuple(_moved(v, s, dev) for v in rest)
            copied = s.record()
            x = self.prepare(x, p)
            if x.data_ptr() == images.data_ptr():  # the same memory (a float batch on the CPU): copy
                x = x.clone(memory_format=torch.channels_last if x.dim() == 4 else torch.preserve_format)
            done = s.record()
        return (x, y, *moved), copied, done

    def prepare(self, x: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
        """A batch on the device, ready to train on: augmented (params) and normalised, as ``dtype``, channels-last."""
        if params is not None and self.augment is not None:
            x = augment_batch(x, params, config=self.augment, mean=self.mean, std=self.std)
        elif x.dtype == torch.uint8:
            x = normalize(x.float(), self.mean, self.std)
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


def _moved(v: Any, s: Streams, dev: torch.device) -> Any:
    """A batch's metadata dict (its tensors moved) or keys (as they are)."""
    if isinstance(v, dict):
        return {
            k: s.pinned(t).to(dev, non_blocking=s.asynchronous, copy=True) if isinstance(t, torch.Tensor) else t
            for k, t in v.items()
        }
    return v


def _tensors(out: tuple) -> Iterator[torch.Tensor]:
    for v in out:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, dict):
            yield from (t for t in v.values() if isinstance(t, torch.Tensor))


def to_device(
    images: torch.Tensor,
    device: torch.device | str | int,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    *,
    non_blocking: bool = True,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Move a uint8 batch to ``device`` and return it as float there, normalised when mean/std are given.

    Args:
        images: A uint8 batch ``[B, 3, H, W]`` as the loader yields it.
        device: Where to move it (``"cuda"``, ``torch.device("cuda", 1)``, a device index).
        mean: Per-channel means in 0-1 units (``loader.mean``); None with ``std``: no normalisation.
        std: Per-channel standard deviations in 0-1 units (``loader.std``).
        non_blocking: Copy asynchronously (from pinned memory).
        dtype: The floating dtype returned: float32, or bfloat16/float16 for AMP (normalised in
            float32 first, then cast).

    Returns:
        The batch on ``device`` as ``dtype``: values 0-255, or normalised with ``mean``/``std``.

    Raises:
        OptionError: ``dtype`` is not a floating dtype, or ``device`` is not there.
    """
    if not dtype.is_floating_point:
        raise OptionError(f"to_device: dtype={dtype}: expected a floating dtype (torch.float32, bfloat16, float16)")
    if not isinstance(device, torch.device) or device.type != images.device.type:  # absent: one line, not an assert
        parse_device(device, "to_device: device")
    x = images.to(device, non_blocking=non_blocking).float()
    if mean is not None and std is not None:
        x = normalize(x, mean, std)
    return x if dtype == torch.float32 else x.to(dtype)


# --- what BatchRing.pin needs on CUDA --------------------------------------------------------------
def cuda_register(storage: torch.UntypedStorage, device: torch.device | None = None) -> int:
    """Page-lock ``storage`` (shared memory) with ``cudaHostRegister`` in ``device``'s context (None:
    the current device's), undone when it is freed: 0, or the CUDA error where the driver refuses
    (CUDA's last error then cleared, so that no later kernel launch raises it)."""
    ptr, size = storage.data_ptr(), storage.nbytes()
    with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
        rc = int(torch.cuda.cudart().cudaHostRegister(ptr, size, 1))  # 1: cudaHostRegisterPortable, as torch's own
        if rc != 0:
            _clear_cuda_error()
            return rc
    # not at exit: after the CUDA context is gone
    weakref.finalize(storage, _unregister, ptr, os.getpid(), device).atexit = False
    return 0


def cuda_error(rc: int) -> str:
    """A CUDA error code with CUDA's name for it."""
    try:
        cudart = torch.cuda.cudart()
        return f"cudaError {rc}: {cudart.cudaGetErrorString(cudart.cudaError(rc))}"
    except Exception:  # a binding without the enum's value: the number alone
        return f"cudaError {rc}"


def _clear_cuda_error() -> None:
    """Take the error a refused ``cudart`` call leaves as CUDA's last error of this thread: PyTorch's
    bindings of ``cudaHostRegister``/``cudaHostUnregister`` return it without clearing it, and
    PyTorch reads the last error after its next kernel launch, which would then raise it. A launch
    here (on the current device) reads it and raises it, caught."""
    try:
        torch.ones(1, device="cuda")
    except RuntimeError:
        pass


def cuda_devices_in_use() -> list[int]:
    """The CUDA devices with a context in this process (those work can be queued on)."""
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    return [d for d in range(torch.cuda.device_count()) if has_context is None or has_context(d)]


def _unregister(ptr: int, pid: int, device: torch.device | None) -> None:
    if os.getpid() != pid:  # not in a forked worker, which inherits the finalizer but not the registration
        return
    for d in cuda_devices_in_use():  # a non-blocking copy out of the slot may still be queued on any of them
        torch.cuda.synchronize(d)
    with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
        rc = int(torch.cuda.cudart().cudaHostUnregister(ptr))
        if rc != 0:
            _clear_cuda_error()
            log.warning("cudaHostUnregister of a loader's batch slot failed (%s)", cuda_error(rc))


class _Events:
    """Events recorded on several devices' streams: done when each is."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def query(self) -> bool:
        return all(e.query() for e in self.events)

    def synchronize(self) -> None:
        for e in self.events:
            e.synchronize()


def cuda_fence(slot: int) -> Fence:
    """Events recorded on the current stream of every device with a CUDA context: a copy out of a slot
    queued on any of those streams before the caller let go of its batch is done when they are."""
    events = []
    for d in cuda_devices_in_use():
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(d))
        events.append(event)
    return _Events(events)
