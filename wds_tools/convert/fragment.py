"""Tar fragments: a batch of samples laid out as whole tar members, appended to its shard in one write.

Laid out in a slot of the memory the pool shares with the converter's process (``runner.shared_memory``),
else in a ``bytearray`` returned in the result; its rows hold offsets from its start, so it does not depend
on where its shard puts it. A multi-size run's other sizes follow the members (spill.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from ..format.tarwrite import BLOCK, member_header, padded, write_at
from .runner import orphaned, shared_memory

__all__ = ["SLOT_BYTES", "Member", "members_bytes", "put_members", "put_block", "write_slots", "Ranges"]

SLOT_BYTES = 16 << 20
"""A shared-memory slot: a batch's pixels are at most 8 MiB (schedule.py), plus headers, .json and padding."""

_ZEROS = bytes(BLOCK)


class Member(NamedTuple):
    """One sample's members before layout: the four of ``format.sample.MEMBERS`` (.npy in two parts)."""

    key: bytes
    cls: bytes
    i32: bytes
    json: bytes
    npy_header: bytes
    pixels: memoryview  # C-order uint8 bytes


def members_bytes(m: Member) -> int:
    """The bytes ``m`` takes in a tar: four headers, the data, each padded to 512."""
    npy = len(m.npy_header) + len(m.pixels)
    return 4 * BLOCK + padded(len(m.cls)) + padded(len(m.i32)) + padded(len(m.json)) + padded(npy)


def _put(buf: memoryview, pos: int, name: bytes, parts: tuple[bytes | memoryview, ...]) -> tuple[int, int, int]:
    """Lay out one member at ``pos``: (next position, data offset, data length)."""
    size = sum(len(p) for p in parts)
    buf[pos : pos + BLOCK] = member_header(name, size)
    start = pos = pos + BLOCK
    for p in parts:
        buf[pos : pos + len(p)] = p
        pos += len(p)
    pad = -size % BLOCK
    if pad:
        buf[pos : pos + pad] = _ZEROS[:pad]
        pos += pad
    return pos, start, size


def put_members(buf: memoryview, pos: int, m: Member) -> tuple[int, tuple[tuple[int, int], ...]]:
    """Lay out ``m``'s members at ``pos`` of ``buf``; return the next position and each member's
    (data offset, data length) in ``buf``, in ``MEMBERS`` order."""
    key = m.key
    pos, a, na = _put(buf, pos, key + b".cls", (m.cls,))
    pos, b, nb = _put(buf, pos, key + b".i32", (m.i32,))
    pos, c, nc = _put(buf, pos, key + b".json", (m.json,))
    pos, d, nd = _put(buf, pos, key + b".npy", (m.npy_header, m.pixels))
    return pos, ((a, na), (b, nb), (c, nc), (d, nd))


def put_block(buf: memoryview, pos: int, parts: tuple[bytes | memoryview, ...]) -> int:
    """Copy ``parts`` one after the other at ``pos``; return the next position."""
    for p in parts:
        buf[pos : pos + len(p)] = p
        pos += len(p)
    return pos


Ranges = Sequence[tuple[str, int, int, int]]
"""Byte ranges of a slot to write into files: (file, offset in it, offset in the slot, length)."""


def write_slots(writes: Sequence[tuple[int, Ranges]]) -> int:
    """In a pool worker: write each (slot, ranges) of the shared memory into their files; return the
    bytes written. The files exist (their assembler made them), and ranges of one file never overlap,
    so any worker may write any, in any order."""
    if not writes:
        return 0
    shared = shared_memory()
    if shared is None:
        raise RuntimeError("write_slots runs in a worker of a pool with shared memory")
    if orphaned():  # the converter is gone: its partial files are a rerun's to remove
        raise SystemExit(1)
    done = 0
    with memoryview(shared) as whole:
        for slot, ranges in writes:
            base = slot * SLOT_BYTES
            for path, at, start, n in ranges:
                fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    write_at(fd, whole[base + start : base + start + n], at)
                finally:
                    os.close(fd)
                done += n
    return done
