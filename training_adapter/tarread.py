"""Tar read: the streaming reader, shard URLs opened and streamed as checked samples.

``SampleStream`` is one worker's reader: its shards -> samples with a checked ``.npy`` and ``.cls``
-> lists of ``batch_size``, in stream order or through a shuffle buffer.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from wds_tools.errors import ShardError
from wds_tools.format.npy import NPY_HEADER_BYTES, image_side
from wds_tools.format.sample import identity_prefix
from wds_tools.format.tar import DEFAULT_CHUNK, group_samples, iter_members, split_name
from wds_tools.storage.transport import open_stream

from .shardlist import WorkerPlan

if TYPE_CHECKING:  # (loader imports this module)
    from .loader import LoaderOptions

__all__ = [
    "DEFAULT_CHUNK",
    "open_url",
    "iter_members",
    "iter_samples",
    "split_name",
    "Sample",
    "Views",
    "SampleStream",
    "npy_shape",
    "Identity",
    "sample_identity",
    "first_identity",
]

log = logging.getLogger("training_adapter")


def open_url(url: str) -> BinaryIO:
    """Open a shard for streaming (``storage.transport.open_stream``); ``ShardError`` when it cannot be."""
    try:
        return open_stream(url)
    except (OSError, ValueError) as e:
        raise ShardError(f"{url}: cannot open shard: {e}", url=url) from None


def iter_samples(url: str, *, chunk_size: int = DEFAULT_CHUNK) -> Iterator[tuple[str, dict[str, memoryview], int]]:
    """Yield (key, {ext: data view}, header offset of the sample's first member) for one shard.

    Members are grouped by consecutive key, as webdataset's ``group_by_keys`` does.
    """
    stream = open_url(url)
    finished = False
    try:
        yield from group_samples(iter_members(stream, url, chunk_size=chunk_size), url)
        finished = True
    except OSError as e:  # a pipe or curl that failed mid-stream
        raise ShardError(f"{url}: read failed: {e}", url=url) from None
    finally:
        try:
            stream.close()
        except (OSError, ValueError) as e:
            # webdataset's Pipe raises here on a non-zero exit status (curl -f on HTTP 404, ...);
            # when the consumer stopped early or an error is already on its way, it says nothing new
            if finished:
                raise ShardError(f"{url}: {e}", url=url) from None


@dataclass
class Sample:
    """One streamed sample: its key, label and stored pixels."""

    key: str
    label: int
    pixels: memoryview | np.ndarray  # S*S*3 uint8, C order


class Views:
    """Stored pixels of streamed samples: views of the read chunks or of shuffle-buffer rows."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def arrays(self, S: int) -> Iterator[np.ndarray]:
        """Each sample's pixels as a [S, S, 3] view."""
        return (np.frombuffer(s.pixels, np.uint8).reshape(S, S, 3) for s in self.samples)

    def copy_into(self, flat: np.ndarray) -> None:
        """Copy the samples into ``flat`` (the call of ``offsetread.Located.copy_into``)."""
        for i, s in enumerate(self.samples):
            flat[i] = np.frombuffer(s.pixels, np.uint8)


def npy_shape(header: bytes, url: str, key: str, offset: int) -> tuple[int, ...]:
    """The [S, S, 3] an image's NPY header gives; ``ShardError`` naming the sample for another header."""
    try:
        side = image_side(header)
    except ValueError as e:
        raise ShardError(
            f"{url}: byte {offset}: sample {key!r}: bad .npy header: {e}", url=url, offset=offset
        ) from None
    return side, side, 3


@dataclass(frozen=True)
class Identity:
    """Which dataset a sample says it belongs to (its .json's ``dataset_version`` and
    ``classes_digest``, format version 2; both None for version 1), and where that was read."""

    dataset_version: str | None
    classes_digest: str | None
    url: str
    key: str

    def same(self, other: Identity) -> bool:
        """Whether ``other`` names the same dataset (wherever it was read)."""
        return (self.dataset_version, self.classes_digest) == (other.dataset_version, other.classes_digest)

    def describe(self) -> str:
        """The dataset fields, for messages."""
        if self.dataset_version is None and self.classes_digest is None:
            return "a sample without dataset fields (format version 1)"
        return f"dataset_version {self.dataset_version!r}, classes_digest {self.classes_digest!r}"


def sample_identity(meta: bytes | memoryview | None, url: str, key: str) -> Identity:
    """The ``Identity`` a sample's .json gives (None fields when it has none or is not a JSON object)."""
    try:
        obj = json.loads(bytes(meta)) if meta is not None else None
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        obj = {}
    return Identity(obj.get("dataset_version"), obj.get("classes_digest"), url, key)


def first_identity(url: str, *, chunk_size: int = 1 << 16) -> Identity | None:
    """The ``Identity`` of the first sample of shard ``url`` (None: the shard has none); reads only
    as far as that sample."""
    for key, members, _ in iter_samples(url, chunk_size=chunk_size):
        return sample_identity(members.get("json"), url, key)
    return None


class SampleStream:
    """One worker's streaming reader (see the module docstring); ``shape`` is the samples' [S, S, 3]
    once the first is read (every later one must match).

    Unless ``allow_mixed``, every sample must name the dataset ``expect`` names (the first sample of
    the first shard, found before the workers start; None: this stream's own first sample): a
    sample of another version or class list is refused, naming both shards.
    """

    def __init__(self, urls: list[str], options: LoaderOptions, *, expect: Identity | None = None) -> None:
        self.urls, self.batch_size, self.shuffle_buffer = urls, options.batch_size, options.buffer
        self.on_error, self.resampled, self.read_size = options.on_error, options.resampled, options.read_size
        self.shape: tuple[int, ...] | None = None
        self.allow_mixed, self.expect = options.allow_mixed, expect
        self._prefix: bytes | None = None  # set once a sample of the expected dataset has been parsed

    def _check_identity(self, meta: bytes | memoryview | None, url: str, key: str, offset: int) -> None:
        prefix = self._prefix
        if prefix is not None and meta is not None and meta[: len(prefix)] == prefix:
            return  # begins with the expected dataset's fields as the converter writes them (no parse)
        got = sample_identity(meta, url, key)
        if self.expect is None:
            self.expect = got
        if got.same(self.expect):
            if got.dataset_version is not None and got.classes_digest is not None and self._prefix is None:
                self._prefix = identity_prefix(str(got.dataset_version), str(got.classes_digest))
        else:
            e = self.expect
            raise ShardError(
                f"{url}: byte {offset}: sample {key!r} has {got.describe()}, but the first sample "
                f"({e.key!r} in {e.url}) has {e.describe()}: these shards are of different datasets "
                f"(a version that added a class shifts every label); give the shards of one "
                f"conversion, or pass allow_mixed=True to read them as one set anyway",
                url=url,
                offset=offset,
            )

    def read_shard(self, url: str) -> Iterator[Sample]:
        """The samples of shard ``url``; a damaged shard raises, or with ``on_error="skip"`` ends with a warning."""
        header: bytes | None = None
        expect = 0
        try:
            for key, members, offset in iter_samples(url, chunk_size=self.read_size):
                npy, cls = members.get("npy"), members.get("cls")
                if npy is None or cls is None:
                    raise ShardError(
                        f"{url}: byte {offset}: sample {key!r} has {sorted(members)}; expected .npy and .cls members",
                        url=url,
                        offset=offset,
                    )
                if not self.allow_mixed:  # first: another dataset is the likelier reason for any odd sample
                    self._check_identity(members.get("json"), url, key, offset)
                h = bytes(npy[:NPY_HEADER_BYTES])
                if h != header:
                    shape = npy_shape(h, url, key, offset)
                    if self.shape is None:
                        self.shape = shape
                    elif shape != self.shape:
                        raise ShardError(
                            f"{url}: byte {offset}: sample {key!r} has shape {shape}, "
                            f"earlier samples {self.shape}; a batch needs one size",
                            url=url,
                            offset=offset,
                        )
                    header, expect = h, NPY_HEADER_BYTES + math.prod(shape)
                if len(npy) != expect:
                    raise ShardError(
                        f"{url}: byte {offset}: sample {key!r}: .npy member is {len(npy)} bytes; its "
                        f"header says {expect} (a damaged or hand-edited shard)",
                        url=url,
                        offset=offset,
                    )
                digits = bytes(cls).strip()
                if not digits.isdigit() or len(digits) > 9:  # ASCII digits only; a class index fits int32
                    raise ShardError(
                        f"{url}: byte {offset}: sample {key!r}: .cls is {bytes(cls)[:20]!r}, "
                        f"expected a class index of at most 9 decimal digits",
                        url=url,
                        offset=offset,
                    )
                label = int(digits)
                yield Sample(key, label, npy[NPY_HEADER_BYTES:])
        except ShardError as e:
            if self.on_error == "raise":
                raise
            log.warning("skipping the rest of a shard: %s", e)

    def samples(self, plan: WorkerPlan, rng: np.random.Generator, need: int | None) -> Iterator[Sample]:
        """The worker's samples: its own shards; then, while skipped damage leaves it short of the
        ``need`` samples its batches take, its spare shards (several ranks only, see ``plan_epoch``)."""
        urls = self.urls
        if self.resampled:
            yield from self._resampled(rng)
            return
        got = 0
        for i in plan.shards:
            for s in self.read_shard(urls[i]):
                got += 1
                yield s
        if need is None or got >= need or self.on_error != "skip":
            return
        for i in plan.spares:
            log.warning("topping up %d samples lost to skipped damage from spare shard %s", need - got, urls[i])
            for s in self.read_shard(urls[i]):
                if got >= need:
                    return
                got += 1
                yield s

    def _resampled(self, rng: np.random.Generator) -> Iterator[Sample]:
        """Shards drawn with replacement, for ever; stops with an error when every draw comes up empty."""
        urls, empty = self.urls, 0
        while True:
            got = 0
            for s in self.read_shard(urls[int(rng.integers(len(urls)))]):
                got += 1
                yield s
            empty = 0 if got else empty + 1
            if empty > 2 * len(urls) + 8:  # skipped errors everywhere: would loop for ever
                raise ShardError(
                    f"resampled: {empty} shard draws in a row gave no sample (every shard damaged "
                    f"or empty?), e.g. {urls[0]}"
                )

    def _plain_groups(self, samples: Iterator[Sample]) -> Iterator[list[Sample]]:
        """Samples in lists of ``batch_size`` (the last may be short), in stream order."""
        group: list[Sample] = []
        for s in samples:
            group.append(s)
            if len(group) == self.batch_size:
                yield group
                group = []
        if group:
            yield group

    def _shuffled_groups(self, samples: Iterator[Sample], rng: np.random.Generator) -> Iterator[list[Sample]]:
        """Lists of ``batch_size`` samples drawn through a shuffle buffer of ``shuffle_buffer`` samples,
        their pixels copied into rows of one array (views would pin the read chunks): an incoming sample
        takes a free row, never one handed out, so ``shuffle_buffer + batch_size`` rows suffice."""
        n, B = self.shuffle_buffer, self.batch_size
        rows: np.ndarray | None = None
        free: list[int] = []
        buf: list[tuple[str, int, int]] = []  # (key, label, row)
        group: list[Sample] = []
        lent: list[int] = []
        for s in samples:
            if rows is None:
                rows = np.empty((n + B, len(s.pixels)), np.uint8)
                free = list(range(n + B - 1, -1, -1))
            r = free.pop()
            rows[r] = np.frombuffer(s.pixels, np.uint8)
            if len(buf) < n:
                buf.append((s.key, s.label, r))
                continue
            j = int(rng.integers(n))
            key, label, out = buf[j]
            buf[j] = (s.key, s.label, r)
            group.append(Sample(key, label, rows[out]))
            lent.append(out)
            if len(group) == B:
                yield group
                group = []
                free.extend(lent)  # the caller is done with the list it was given
                lent = []
        held = rows if rows is not None else np.empty((0, 0), np.uint8)  # None: no sample came
        for j in rng.permutation(len(buf)):
            key, label, out = buf[j]
            group.append(Sample(key, label, held[out]))
            if len(group) == B:
                yield group
                group = []
        if group:
            yield group

    def groups(self, samples: Iterator[Sample], rng: np.random.Generator) -> Iterator[list[Sample]]:
        """Samples in lists of ``batch_size`` (the last may be short): in stream order, or drawn
        through the shuffle buffer when it holds more than one sample."""
        if self.shuffle_buffer > 1:
            return self._shuffled_groups(samples, rng)
        return self._plain_groups(samples)
