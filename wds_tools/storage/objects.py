"""Where output goes: a local folder, or any fsspec URL (s3://, gs://, file://...), with the operations a
conversion needs; writes are atomic (local: a temporary name renamed; an object store PUT is all-or-nothing)."""

from __future__ import annotations

import os
import shutil

from .fsutil import atomic_write_bytes
from .transport import filesystem, is_remote, join, local_path, open_file, read_bytes

__all__ = ["Store", "open_input"]


open_input = open_file  # a source or shard, local or any fsspec URL


class Store:
    """A folder, local or remote, addressed by paths made with ``join``."""

    def __init__(self, root: str | os.PathLike) -> None:
        local = None if is_remote(root) else local_path(root)
        self.root: str = local if local is not None else os.fspath(root)
        self.remote = is_remote(self.root)

    def __repr__(self) -> str:
        return f"Store({self.root!r})"

    def join(self, *parts: str) -> str:
        """A path under the root."""
        return join(self.root, *parts)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return filesystem(path).exists(path) if self.remote else os.path.exists(path)

    def read_bytes(self, path: str) -> bytes:
        """The whole file."""
        return read_bytes(path)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file: atomically (renamed into place) when local."""
        if self.remote:
            filesystem(path).pipe_file(path, data)
        else:
            atomic_write_bytes(path, data)

    def upload(self, local_file: str, path: str) -> None:
        """Move a finished local file to ``path``; remote: upload it whole, then delete it."""
        if self.remote:
            try:
                filesystem(path).put_file(local_file, path)
            finally:
                os.unlink(local_file)
        else:
            os.replace(local_file, path)

    def size(self, path: str) -> int | None:
        """A file's size in bytes; None when it is missing."""
        try:
            return int(filesystem(path).size(path)) if self.remote else os.path.getsize(path)
        except (FileNotFoundError, OSError):
            return None

    def names(self, folder: str) -> list[str]:
        """Entry names in a folder; [] when it does not exist."""
        if self.remote:
            fs = filesystem(folder)
            try:
                return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False, refresh=True))
            except FileNotFoundError:
                return []
        try:
            return sorted(os.listdir(folder))
        except FileNotFoundError:
            return []

    def remove(self, path: str) -> None:
        """Delete a file; nothing when it is missing."""
        try:
            filesystem(path).rm_file(path) if self.remote else os.unlink(path)
        except FileNotFoundError:
            pass

    def rmtree(self, folder: str) -> None:
        """Delete a folder and everything in it; nothing when it is missing."""
        if self.remote:
            try:
                filesystem(folder).rm(folder, recursive=True)
            except FileNotFoundError:
                pass
        else:
            shutil.rmtree(folder, ignore_errors=True)

    def makedirs(self, folder: str) -> None:
        """Make a folder and its parents (object storage has none to make)."""
        if not self.remote:
            os.makedirs(folder, exist_ok=True)
