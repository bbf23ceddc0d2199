"""Read a tar's member table without an index: a small streaming ustar header walker.

``TarWalker`` is fed consecutive buffers of a shard (the same buffers a caller hashes, so a file
is read once) and records every member's name, data offset and size, plus the first bytes of the
members a ``capture`` function asks for. ``walk_headers`` jumps from header to header with small
reads instead, for checks that need the member table but not the data.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .tarwrite import BLOCK

__all__ = ["BLOCK", "CHUNK", "Member", "TarWalker", "TarHeaderError", "TarChecksumError", "decode_header",
           "parse_header", "walk_headers", "scan_file", "read_full", "iter_chunks"]

# Reads of 1 MiB: on a cold page cache the kernel's read-ahead overlaps them with the caller's
# work, where one 16 MiB read waits for all its pages; hashlib still releases the GIL on each.
# (verify, 2 cores, cold cache: 0.86 of cat's speed with 1 MiB reads and 0.81 with 2 MiB on 4
# threads, 0.73 with 4 MiB on 6 threads)
CHUNK = 1 << 20
_REGULAR = (b"0", b"\0")


class TarHeaderError(ValueError):
    """A 512-byte block where a ustar header should be is not one."""


class TarChecksumError(TarHeaderError):
    """A header's checksum does not match its bytes."""


@dataclass(slots=True)
class Member:
    """One regular file in a tar: ``offset`` is where its data starts in the file."""

    name: str
    offset: int
    size: int
    data: bytes = b""  # the first bytes of the data, when the walker was asked to capture them


def _octal(field: bytes, what: str, pos: int) -> int:
    if field[0] & 0x80:  # GNU base-256, for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    digits = field.rstrip(b"\0 ").lstrip(b" ")
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise TarHeaderError(f"bad {what} field {field!r} in the header at offset {pos}") from None


def _byte_sum(block: bytes) -> int:
    """Sum of a 512-byte block's bytes, 10x faster than ``sum``: adler32's low half is 1 + the byte
    sum mod 65521, exact for a 256-byte half (at most 256 * 255 = 65280)."""
    return (zlib.adler32(block[:256]) & 0xFFFF) + (zlib.adler32(block[256:]) & 0xFFFF) - 2


def decode_header(block: bytes | memoryview, pos: int = 0) -> tuple[str, int, bytes] | None:
    """(name, size, type flag) of any tar header at file offset ``pos``, checksum verified;
    None for a zero block. The name includes the ustar prefix."""
    block = bytes(block)
    if len(block) < BLOCK:
        raise TarHeaderError(f"the header at offset {pos} is cut short ({len(block)} of {BLOCK} bytes)")
    if block.count(0) == BLOCK:
        return None
    if _octal(block[148:156], "checksum", pos) != _byte_sum(block) - sum(block[148:156]) + 256:
        raise TarChecksumError(f"the header at offset {pos} fails its checksum")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:262] == b"ustar":
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "replace"), _octal(block[124:136], "size", pos), block[156:157]


def parse_header(block: bytes | memoryview, pos: int = 0) -> tuple[str, int] | None:
    """(name, size) of the ustar header of a regular file at file offset ``pos``; None for a zero block.

    Strict, for shards wds-tools wrote: anything but a plain ustar regular file is an error.
    """
    if len(block) >= BLOCK and bytes(block[257:262]) != b"ustar" and bytes(block).count(0) != BLOCK:
        raise TarHeaderError(f"no ustar header at offset {pos} (magic {bytes(block[257:265])!r})")
    head = decode_header(block, pos)
    if head is None:
        return None
    name, size, kind = head
    if kind not in _REGULAR:
        raise TarHeaderError(
            f"member {name!r} at offset {pos} has type {kind!r}; shards hold regular files only "
            "(no PAX, GNU or link records)"
        )
    return name, size


@dataclass
class TarWalker:
    """Push parser: ``feed`` consecutive buffers (multiples of 512 bytes except the last), then ``finish``.

    ``capture(name)`` says how many leading data bytes of a member to keep in ``Member.data``
    (0: none; -1: all). After ``finish``, ``error`` describes the first structural problem
    (bad header, data or end marker cut off) or is None; members up to it are listed.
    """

    capture: Callable[[str], int] | None = None
    members: list[Member] = field(default_factory=list)
    error: str | None = None
    error_offset: int | None = None
    ended: bool = False  # reached the zero block that ends the archive
    pos: int = 0  # bytes fed so far
    _next: int = 0  # file offset of the next header
    _want: int = 0  # data bytes still to capture for members[-1]

    def feed(self, buf: bytes | bytearray | memoryview) -> None:
        mv = memoryview(buf).cast("B")
        base = self.pos
        end = base + len(mv)
        if base % BLOCK:
            raise ValueError("TarWalker.feed: only the last buffer may be a partial block")
        self.pos = end
        if self._want:
            m = self.members[-1]
            start = m.offset + len(m.data)
            take = min(self._want, end - start)
            m.data += mv[start - base:start - base + take]
            self._want -= take
        while not self.ended and self.error is None and self._next + BLOCK <= end:
            at = self._next
            got = self._header(mv[at - base:at - base + BLOCK], at)
            if got is None:
                return
            m, want = got
            self._next = m.offset + m.size + (-m.size % BLOCK)
            if want:
                take = min(want, max(0, end - m.offset))
                m.data = bytes(mv[m.offset - base:m.offset - base + take])
                self._want = want - take
                if self._want:
                    return  # the member runs past this buffer

    def _header(self, block: bytes | memoryview, at: int) -> tuple[Member, int] | None:
        """Record the member whose header block is at ``at``; return it and how many data bytes to
        capture, or None where the walk stops (a bad header, recorded as ``error``, or the end)."""
        try:
            head = parse_header(block, at)
        except TarHeaderError as e:
            self.error, self.error_offset = str(e), at
            return None
        if head is None:
            self.ended = True
            return None
        name, size = head
        m = Member(name, at + BLOCK, size)
        self.members.append(m)
        want = self.capture(name) if self.capture else 0
        return m, (size if want < 0 else min(want, size))

    @property
    def reached(self) -> int:
        """File offset where the data of the last member found ends (0: none found)."""
        return self.members[-1].offset + self.members[-1].size if self.members else 0

    def finish(self) -> TarWalker:
        """Record a missing end marker, or a member whose data runs past the end, as ``error``."""
        if self.error is None and not self.ended:
            if self.reached > self.pos:
                m = self.members[-1]
                self.error = (f"truncated: member {m.name!r} needs bytes up to {m.offset + m.size}, "
                              f"the file ends at {self.pos}")
                self.error_offset = m.offset
            elif self._next < self.pos:
                self.error = (f"truncated: the file ends at {self.pos}, inside the header at {self._next}")
                self.error_offset = self._next
            else:
                self.error = f"truncated: no end-of-archive block (the file ends at {self.pos})"
                self.error_offset = self.pos
        return self


def walk_headers(path: str | os.PathLike, capture: Callable[[str], int] | None = None,
                 *, window: int = 64 << 10) -> TarWalker:
    """Walk a tar's headers with small positioned reads, skipping the data of large members."""
    walker = TarWalker(capture)
    size = os.path.getsize(path)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        win_start, win = 0, b""
        at = 0
        while True:
            if at + BLOCK > win_start + len(win):
                win_start, win = at, os.pread(fd, window, at)
            rel = at - win_start
            block = win[rel:rel + BLOCK]
            if len(block) < BLOCK:
                break
            got = walker._header(block, at)
            if got is None:
                break
            m, want = got
            if want:
                if m.offset + want <= win_start + len(win):
                    m.data = win[m.offset - win_start:m.offset - win_start + want]
                else:
                    m.data = os.pread(fd, want, m.offset)
            at = m.offset + m.size + (-m.size % BLOCK)
    walker.pos, walker._next = size, at
    return walker.finish()


def scan_file(path: str | os.PathLike, capture: Callable[[str], int] | None = None,
              on_chunk: Callable[[memoryview], None] | None = None, *, chunk: int = CHUNK,
              walker: TarWalker | None = None) -> TarWalker:
    """Read a whole tar in large chunks, feeding each to a walker, then to ``on_chunk`` (e.g. a hash;
    the walker already lists the members that start in it). Pass ``walker`` to keep what it saw
    when the read fails (``walker.pos``: the bytes read)."""
    walker = walker if walker is not None else TarWalker(capture)
    for part in iter_chunks(path, chunk):
        walker.feed(part)
        if on_chunk is not None:
            on_chunk(part)
    return walker.finish()


def iter_chunks(path: str | os.PathLike, chunk: int = CHUNK) -> Iterator[memoryview]:
    """Yield a file's bytes start to end as consecutive views of ``chunk`` bytes (the last may be short).

    The views share one buffer: each is valid until the next is yielded, so a caller keeps bytes
    by copying them.
    """
    if chunk % BLOCK:
        raise ValueError(f"chunk must be a multiple of {BLOCK} bytes, got {chunk}")
    buf = memoryview(bytearray(chunk))
    with open(path, "rb", buffering=0) as f:
        while n := read_full(f, buf):
            yield buf[:n]


def read_full(f, view: memoryview) -> int:
    """Fill ``view`` unless the file ends first (so only the last chunk is short)."""
    got = 0
    while got < len(view) and (n := f.readinto(view[got:])):
        got += n
    return got
