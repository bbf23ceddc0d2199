"""Small filesystem helpers: atomic writes, and the folder sync that makes a rename durable."""

from __future__ import annotations

import errno
import json
import os

__all__ = ["atomic_write_bytes", "dumps_canonical", "sync_folder"]

_NO_FOLDER_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}  # filesystems that cannot sync a folder


def sync_folder(path: str | os.PathLike) -> None:
    """fsync the folder holding ``path`` after a rename into it: the new name lives in the folder, so
    without this a power cut can lose a file already renamed into place (POSIX). Where a folder cannot
    be opened (no read permission, Windows) or synced (some network filesystems), nothing more can be done."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _NO_FOLDER_SYNC:
            raise
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, rename over ``path``, sync the folder."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    sync_folder(path)


def dumps_canonical(obj: object) -> str:
    """JSON with sorted keys and fixed separators, so equal data gives equal bytes."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False)
