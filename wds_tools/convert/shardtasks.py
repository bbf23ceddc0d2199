"""What writing a shard works on and gives back: the plan's shard and sample tasks (with where a
sample's pixels may already sit), a written sample's row, and a batch's result (write.py makes it,
shard.py puts it in its shard)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .decode import DecodeSettings

__all__ = ["Reuse", "SampleTask", "ShardTask", "SampleRow", "SpillRow", "Encoded"]


@dataclass(frozen=True)
class Reuse:
    """Where a sample's pixels already sit (a base version's shard, or a spill file), and how to
    check them."""

    shard_path: str
    shard_bytes: int
    npy_offset: int
    npy_length: int
    npy_xxh3: int
    width: int
    height: int
    fingerprint: bytes
    relabeled: bool
    spilled: bool = False  # decoded in this run for another size's shards: counts as decoded
    phash: tuple[int, ...] | None = None  # the stored pixels' perceptual hashes when the base records them (version 3)


@dataclass(frozen=True)
class SampleTask:
    """One sample of a shard's plan: its source, label, and where its pixels may already sit."""

    key: str
    path: str
    source_path: str
    label: int
    label_name: str
    line: int
    original_key: str | None
    reuse: Reuse | None = None
    src_nbytes: int = 0  # the source's size, from the scan; used when the pixels are copied, not read
    src_mtime_ns: int = 0
    content_hash: str | None = None  # the manifest's "algo:hex": checked whenever the file is read
    also: tuple[int, ...] = ()  # other sides of a multi-size run to decode from the same read
    meta: tuple | None = None  # (column, value) pairs of the manifest's metadata, for the .json's "meta"


@dataclass(frozen=True)
class ShardTask:
    """One shard of the plan: where it goes, how its pixels are made, and its samples in order."""

    dest: str
    work: str
    name: str
    split: str
    digest: str
    side: int  # pixels
    resize: str
    settings: DecodeSettings
    samples: tuple[SampleTask, ...]
    spill: tuple[tuple[int, str], ...] = ()  # (side, folder) for the sides in the samples' ``also``
    dataset_version: str = ""  # each .json names its dataset: --version and the class list's digest
    classes_digest: str = ""


class SampleRow(NamedTuple):
    """A written sample's index fields (named as its samples.npz columns), and its members' places."""

    key: str
    label: int
    fingerprint: bytes
    width: int
    height: int
    src_size: int  # the source file's bytes
    src_mtime_ns: int
    npy_xxh3: int
    source_path: str
    phash: tuple[int, ...] = ()  # format.phash of the stored pixels (WINDOWS hashes)
    placed: tuple[tuple[int, int], ...] = ()  # (offset, length) of each of MEMBERS in the tar


class SpillRow(NamedTuple):
    """A sample's pixels at another size of the run, as ``encode_batch`` hands them to ``SpillWriter``
    (the .npy itself travels in the batch's fragment)."""

    key: str
    source_path: str
    fingerprint: bytes
    width: int  # the source image's, as its .json records them
    height: int
    src_nbytes: int  # the source file's size and mtime when it was decoded
    src_mtime_ns: int
    npy_xxh3: int
    npy_length: int  # header and pixels


@dataclass
class Encoded:
    """A batch of a shard's samples, laid out: where its tar fragment is, its index fields and counts.

    The bytes are ``nbytes`` of tar members (fragment.py), then for each side of ``spill_nbytes``, in
    ascending order, that many bytes of the ``.npy`` of ``spilled[side]``, one after the other. They sit
    in slot ``slot`` of the pool's shared memory, or in ``data``.
    """

    rows: list[SampleRow] = field(default_factory=list)  # placed: offsets from the fragment's start
    nbytes: int = 0
    spill_nbytes: dict[int, int] = field(default_factory=dict)
    slot: int | None = None
    data: bytearray | None = None
    hist: np.ndarray = field(default_factory=lambda: np.zeros(768, dtype=np.int64))
    failed: list[dict] = field(default_factory=list)
    narrow: list[dict] = field(default_factory=list)  # samples written whose pixels span under 16 levels
    failed_stat: dict[str, list[int]] = field(default_factory=dict)  # key -> the source's [size, mtime_ns]
    problems: list[dict] = field(default_factory=list)
    counts: dict = field(default_factory=lambda: {"decoded": 0, "reused": 0, "relabeled": 0})
    decodes: int = 0  # libjpeg/Pillow decodes done (a multi-size sample may need one per draft scale)
    spilled: dict[int, list[SpillRow]] = field(default_factory=dict)  # side -> rows, see _spill_row
