"""Worker side of the scan: is each source a readable image, and is it unchanged since the base?

``scan_files`` reads headers only. ``check_sources`` decides "unchanged" as cheaply as it can:
a manifest hash the base already holds needs a stat only; a path whose size and mtime equal the
base's (the quick check) needs a stat only; anything else is read whole and fingerprinted
(XXH3-128), as is everything with ``--checksum``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import xxhash

from ..storage.objects import open_input
from ..storage.transport import filesystem, is_remote
from .decode import DecodeError, DecodeSettings, probe_image

__all__ = [
    "HASH_ALGORITHMS",
    "Check",
    "Scanned",
    "Checked",
    "SourceStat",
    "NotRegularFileError",
    "open_source",
    "os_reason",
    "scan_files",
    "check_sources",
    "content_hasher",
    "hash_mismatch",
]

HASH_ALGORITHMS = {"sha256": 64, "md5": 32}
"""Manifest checksum columns and their hex digits."""
_CHUNK = 4 << 20


class Scanned(NamedTuple):
    """A source's header check (``scan_files``)."""

    error: str | None  # why the file is unusable, or None
    src_nbytes: int  # the file's size in bytes (0 on error)
    src_mtime_ns: int  # 0 for a URL, or on error


class Checked(NamedTuple):
    """A source checked against a base (``check_sources``)."""

    error: str | None
    fingerprint: bytes | None  # XXH3-128 of the bytes read; None when not read or not as the manifest says
    src_nbytes: int
    src_mtime_ns: int
    read: bool  # False when a stat decided: the caller takes the base's fingerprint


class SourceStat(NamedTuple):
    """What the scan keeps of each source for the plan: its fingerprint (when known), size and mtime."""

    fingerprint: bytes | None
    src_nbytes: int
    src_mtime_ns: int


class Hasher(Protocol):
    """A hashlib object, as ``content_hasher`` gives one."""

    def update(self, data: bytes | memoryview, /) -> None:
        """Feed bytes."""

    def hexdigest(self) -> str:
        """The digest so far, in hex."""


class NotRegularFileError(OSError):
    """A source path names a FIFO, a device, a socket or a folder: skipped, never read."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _require_regular(mode: int, path: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise NotRegularFileError(errno.EINVAL, kind, path)


def os_reason(e: OSError) -> str:
    """Why a source could not be read, in the words errors.jsonl uses."""
    if isinstance(e, NotRegularFileError):
        return f"is {e.strerror}, not a regular file: skipped, never read"
    if isinstance(e, FileNotFoundError):
        return "missing file"
    if isinstance(e, PermissionError):
        return "unreadable file: permission denied"
    if isinstance(e, IsADirectoryError):
        return "is a directory, not a file"
    return f"unreadable file: {e.strerror or e}"


def open_source(path: str) -> tuple[Any, int, int]:
    """(binary file, size in bytes, mtime_ns) of a local file (unbuffered) or an fsspec URL (mtime 0)."""
    if is_remote(path):
        f: Any = open_input(path)  # an fsspec file, which knows its size
        return f, int(f.size), 0
    _require_regular(os.stat(path).st_mode, path)  # a FIFO would block open(), a device never end
    # O_NONBLOCK: should the path turn into a FIFO after the stat, open() still returns at once
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _require_regular(st.st_mode, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb", buffering=0), st.st_size, st.st_mtime_ns


def content_hasher(content_hash: str | None) -> Hasher | None:
    """A fresh hashlib object for a manifest hash ``"sha256:<hex>"`` / ``"md5:<hex>"``, or None."""
    if content_hash is None:
        return None
    return hashlib.new(content_hash.split(":", 1)[0])


def hash_mismatch(content_hash: str | None, hasher: Hasher | None) -> str | None:
    """Why the bytes fed to ``hasher`` are not what the manifest says, or None when they are."""
    if hasher is None or content_hash is None:
        return None
    algo, want = content_hash.split(":", 1)
    got = hasher.hexdigest()
    if got == want:
        return None
    return f"the file's {algo} is {got}, the manifest's {algo} column says {want}: fix the manifest or the file"


def _stat(path: str) -> tuple[int, int]:
    """(size in bytes, mtime_ns) without reading: a stat, or one HEAD request for a URL (mtime 0, as read)."""
    if is_remote(path):
        return int(filesystem(path).info(path)["size"]), 0
    st = os.stat(path)
    _require_regular(st.st_mode, path)
    return st.st_size, st.st_mtime_ns


def scan_files(paths: list[str], settings: DecodeSettings) -> list[Scanned]:
    """Each file's header check, size and mtime; reads headers only."""
    out: list[Scanned] = []
    for path in paths:
        try:
            f, nbytes, mtime = open_source(path)
            with io.BufferedReader(f, 1 << 16) if not is_remote(path) else f:
                if nbytes == 0:
                    raise DecodeError("empty file")
                probe_image(f, settings)  # reads only as far as the header
            out.append(Scanned(None, nbytes, mtime))
        except OSError as e:
            out.append(Scanned(os_reason(e), 0, 0))
        except DecodeError as e:
            out.append(Scanned(str(e), 0, 0))
    return out


@dataclass(frozen=True)
class Check:
    """One source to check against a base."""

    path: str
    trusted: tuple[int, int] | None = None  # (size, mtime_ns) the base recorded for this path
    stat_only: bool = False  # the manifest hash is one the base holds: only size and mtime are needed
    content_hash: str | None = None  # the manifest's "algo:hex", checked when the file is read


def check_sources(items: list[Check], settings: DecodeSettings) -> list[Checked]:
    """Each item checked against the base, reading it only when a stat cannot decide.

    ``read`` is False when a stat decided (the caller takes the base's fingerprint). A file that
    was read but whose bytes do not match the manifest hash gets fingerprint None and no error: it
    is then decoded, and fails there with the reason, as it does in a conversion without a base.
    """
    out: list[Checked] = []
    buf = bytearray(_CHUNK)  # reused: a fresh multi-MB bytes per file costs page faults
    view = memoryview(buf)
    for item in items:
        path = item.path
        try:
            if item.stat_only or (item.trusted is not None and not is_remote(path)):
                nbytes, mtime = _stat(path)
                if nbytes == 0:
                    raise DecodeError("empty file")
                if item.stat_only or (nbytes, mtime) == item.trusted:
                    out.append(Checked(None, None, nbytes, mtime, False))
                    continue
            raw, nbytes, mtime = open_source(path)
            with raw:
                if nbytes == 0:
                    raise DecodeError("empty file")
                h, check = xxhash.xxh3_128(), content_hasher(item.content_hash)
                while n := raw.readinto(buf):
                    h.update(view[:n])
                    if check is not None:
                        check.update(view[:n])
                raw.seek(0)
                probe_image(io.BufferedReader(raw, 1 << 16) if not is_remote(path) else raw, settings)
            digest = None if hash_mismatch(item.content_hash, check) else h.digest()
            out.append(Checked(None, digest, nbytes, mtime, True))
        except OSError as e:
            out.append(Checked(os_reason(e), None, 0, 0, False))
        except DecodeError as e:
            out.append(Checked(str(e), None, 0, 0, False))
    return out
