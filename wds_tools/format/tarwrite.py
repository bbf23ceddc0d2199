"""Deterministic ustar shard writing: fixed headers, known offsets, atomic and durable rename.

A member's header comes from one template (docs/FORMAT.md, "Shards": only the name, the size and the checksum
vary), byte for byte what ``tarfile`` writes with ``format=USTAR_FORMAT``, at about a tenth of its cost; so a
sample's members can be laid out anywhere (``convert.fragment``) and appended with one write.
"""

from __future__ import annotations

import hashlib
import os
from types import TracebackType

from ..storage.fsutil import sync_folder

__all__ = [
    "ShardWriter",
    "BLOCK",
    "NAME_MAX",
    "SIZE_MAX",
    "member_header",
    "partial_path",
    "seal",
    "padded",
    "write_at",
]

BLOCK = 512
"""The tar block size."""
RECORD = 10240  # tar record size; GNU tar and Python's tarfile pad archives to it
NAME_MAX = 100
"""The longest member name, in bytes: ustar's name field (the converter never uses the prefix field)."""
SIZE_MAX = 8**11 - 1
"""The largest member a ustar header can hold: 11 octal digits (8 GiB - 1 bytes)."""


def _template() -> tuple[bytes, int]:
    """The header of a member with an empty name and size 0 (size field zeroed), and the sum of its
    bytes with the checksum field counted as spaces and the size field as zeros."""
    head = bytearray(BLOCK)
    head[100:108] = b"0000644\0"  # mode
    head[108:116] = b"0000000\0"  # uid
    head[116:124] = b"0000000\0"  # gid
    head[136:148] = b"00000000000\0"  # mtime
    head[148:156] = b"        "  # checksum, as spaces while summing
    head[156:157] = b"0"  # regular file
    head[257:265] = b"ustar\x0000"
    return bytes(head), sum(head)


_HEAD, _HEAD_SUM = _template()
_ZEROS = bytes(BLOCK)


def padded(n: int) -> int:
    """``n`` rounded up to whole 512-byte blocks."""
    return -(-n // BLOCK) * BLOCK


def member_header(name: str | bytes, size: int) -> bytes:
    """The 512-byte ustar header of a regular file ``name`` of ``size`` bytes (mode 0644, uid/gid 0,
    no user or group names, mtime 0), as ``tarfile`` writes it; ValueError for a name that is not
    ASCII or longer than 100 bytes, or a size ustar cannot hold."""
    raw = name.encode("ascii") if isinstance(name, str) else name
    if not raw or len(raw) > NAME_MAX or not raw.isascii() or 0 in raw:
        raise ValueError(f"tar member name {name!r}: 1 to {NAME_MAX} ASCII bytes without NUL")
    if not 0 <= size <= SIZE_MAX:
        raise ValueError(f"tar member {name!r} of {size} bytes: a ustar member holds 0 to {SIZE_MAX} bytes")
    octal = b"%011o\0" % size
    head = bytearray(_HEAD)
    head[: len(raw)] = raw
    head[124:136] = octal
    # the template's checksum already counts its spaces and zeros; the size digits replace zero bytes
    head[148:155] = b"%06o\0" % (_HEAD_SUM + sum(raw) + sum(octal))
    return bytes(head)


def partial_path(path: str) -> str:
    """Where a shard is written before it is complete: a hidden name no '*.tar' glob matches.

    The process id keeps two writers of the same shard (a rerun racing a leftover worker)
    from writing into one file; both produce the same bytes and rename atomically.
    """
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.partial-{os.getpid()}")


def write_at(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd`` (``os.pwrite`` may write less than asked)."""
    with memoryview(data) as whole, whole.cast("B") as view:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)


class ShardWriter:
    """Write one tar shard under a temporary name; ``close()`` renames it into place.

    ``add`` returns the byte offset of the member's data, so the index can point at it; ``append``
    takes whole members laid out elsewhere; ``reserve`` leaves room for members another process
    writes at that offset (``write_at`` on the file ``tmp``). With ``digest=False`` nothing is hashed
    here: ``end`` finishes the file and ``seal`` (in any process) hashes, syncs and renames it.
    """

    def __init__(self, path: str, *, digest: bool = True) -> None:
        self.path = path
        self.tmp = partial_path(path)
        self._fd: int | None = os.open(
            self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666
        )
        self._sha = hashlib.sha256() if digest else None
        self.offset = 0

    @property
    def closed(self) -> bool:
        """Whether the file is closed (finished or aborted)."""
        return self._fd is None

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        if self._fd is None:
            raise ValueError(f"{self.tmp} is closed")
        write_at(self._fd, data, self.offset)
        if self._sha is not None:
            self._sha.update(data)
        self.offset += len(data)

    def add(self, name: str, *parts: bytes | memoryview) -> tuple[int, int]:
        """Add a regular file made of ``parts``; return (data offset, data length)."""
        size = sum(len(p) for p in parts)
        self._write(member_header(name, size))
        start = self.offset
        for p in parts:
            self._write(p)
        pad = -size % BLOCK
        if pad:
            self._write(_ZEROS[:pad])
        return start, size

    def append(self, members: bytes | bytearray | memoryview) -> int:
        """Append whole members (headers, data, padding: a multiple of 512 bytes) in one write;
        return the offset they start at."""
        if len(members) % BLOCK:
            raise ValueError(f"{len(members)} bytes of tar members: not whole 512-byte blocks")
        start = self.offset
        self._write(members)
        return start

    def reserve(self, nbytes: int) -> int:
        """Leave ``nbytes`` of whole members (a multiple of 512) to be written by others; return their offset."""
        if nbytes % BLOCK:
            raise ValueError(f"{nbytes} bytes of tar members: not whole 512-byte blocks")
        if self._sha is not None:
            raise ValueError("a hashing ShardWriter cannot leave bytes to others")
        start = self.offset
        self.offset += nbytes
        return start

    def end(self) -> int:
        """Write the end-of-archive blocks and close the file, unsynced, under its temporary name;
        return its length (``seal`` finishes it)."""
        self._write(bytes(2 * BLOCK + (-(self.offset + 2 * BLOCK) % RECORD)))
        fd, self._fd = self._fd, None
        assert fd is not None  # _write checked it
        os.close(fd)
        return self.offset

    def close(self) -> tuple[int, str]:
        """Finish the archive, fsync, rename into place, sync the folder; return (bytes, sha256 hex)."""
        if self._sha is None:
            raise ValueError("a ShardWriter made with digest=False is finished with end() and seal()")
        self._write(bytes(2 * BLOCK + (-(self.offset + 2 * BLOCK) % RECORD)))
        fd, self._fd = self._fd, None
        assert fd is not None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.tmp, self.path)
        sync_folder(self.path)  # the shard's name, not only its bytes, survives a power cut
        return self.offset, self._sha.hexdigest()

    def abort(self) -> None:
        """Remove the partial file, also after a failed write (disk full: closing may fail again)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.closed:  # the block ended without close(): finish the shard, as a file would
            self.close()


def seal(tmp: str, path: str | None, nbytes: int, chunk: int = 1 << 20) -> str:
    """Hash the finished file ``tmp`` (``ShardWriter.end``), fsync it, rename it to ``path`` and sync
    that folder (None: leave it where it is); return its sha256 hex. Refuses a file whose length is not ``nbytes``."""
    sha = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    seen = 0
    with open(tmp, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            sha.update(view[:n])
            seen += n
        if seen != nbytes:
            raise OSError(f"{tmp} is {seen} bytes, {nbytes} were written")
        os.fsync(f.fileno())
    if path is not None:
        os.replace(tmp, path)
        sync_folder(path)  # the shard's name, not only its bytes, survives a power cut
    return sha.hexdigest()
