"""Deterministic ustar shard writing: fixed headers, known offsets, atomic rename."""

from __future__ import annotations

import hashlib
import os
import tarfile
from types import TracebackType

__all__ = ["ShardWriter", "MTIME", "partial_path"]

BLOCK = 512
"""The tar block size."""
RECORD = 10240  # tar record size; GNU tar and Python's tarfile pad archives to it
MTIME = 0
"""Every member's mtime (with uid/gid 0, no user/group names, mode 0644): the bytes do not depend on when or who."""


def _member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = MTIME
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="ascii", errors="strict")


def partial_path(path: str) -> str:
    """Where a shard is written before it is complete: a hidden name no '*.tar' glob matches.

    The process id keeps two writers of the same shard (a rerun racing a leftover worker)
    from writing into one file; both produce the same bytes and rename atomically.
    """
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.partial-{os.getpid()}")


class ShardWriter:
    """Write one tar shard under a temporary name; ``close()`` renames it into place.

    ``add`` returns the byte offset of the member's data, so the index can point at it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.tmp = partial_path(path)
        self._f = open(self.tmp, "wb")
        self._sha = hashlib.sha256()
        self.offset = 0

    def _write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._sha.update(data)
        self.offset += len(data)

    def add(self, name: str, *parts: bytes | memoryview) -> tuple[int, int]:
        """Add a regular file made of ``parts``; return (data offset, data length)."""
        size = sum(len(p) for p in parts)
        self._write(_member_header(name, size))
        start = self.offset
        for p in parts:
            self._write(p)
        pad = -size % BLOCK
        if pad:
            self._write(bytes(pad))
        return start, size

    def close(self) -> tuple[int, str]:
        """Finish the archive, fsync, rename into place; return (bytes, sha256 hex)."""
        self._write(bytes(2 * BLOCK))
        pad = -self.offset % RECORD
        if pad:
            self._write(bytes(pad))
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self.tmp, self.path)
        return self.offset, self._sha.hexdigest()

    def abort(self) -> None:
        """Remove the partial file, also after a failed write (disk full: closing may fail again)."""
        if not self._f.closed:
            try:
                self._f.close()
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
        elif not self._f.closed:  # the block ended without close(): finish the shard, as a file would
            self.close()
