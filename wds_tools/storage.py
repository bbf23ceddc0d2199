"""Where output goes: a local folder, or any fsspec URL (s3://, gs://, file://...).

Just the operations a conversion needs. Writes are atomic: local files are written to a
temporary name and renamed; an object store PUT is all-or-nothing by itself.
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache

from .errors import OptionError
from .fsutil import atomic_write_bytes

__all__ = ["Store", "is_remote", "join", "open_input", "read_input"]


def is_remote(path: str | os.PathLike) -> bool:
    """True for a URL other than file:// (those go through fsspec)."""
    text = os.fspath(path)
    return "://" in text and not text.startswith("file://")


def _local(path: str | os.PathLike) -> str:
    text = os.fspath(path)
    return text[len("file://"):] if text.startswith("file://") else text


def join(root: str | os.PathLike, *parts: str) -> str:
    root = os.fspath(root)
    if is_remote(root):
        return "/".join([root.rstrip("/"), *parts])
    return os.path.join(_local(root), *parts)


@lru_cache(maxsize=16)
def _filesystem(protocol: str):
    try:
        import fsspec
    except ImportError:
        raise OptionError(f"{protocol}:// paths need fsspec: pip install 'wds-tools[s3]'") from None
    try:
        return fsspec.filesystem(protocol)
    except (ImportError, ValueError) as e:
        raise OptionError(f"{protocol}:// paths need their fsspec backend ({e}); for s3:// "
                          "pip install 'wds-tools[s3]'") from None


def _fs(path: str):
    return _filesystem(path.split("://", 1)[0])


def open_input(path: str, block_size: int | None = None):
    """Open a source or shard for reading: a local path, or a URL through fsspec.

    A URL is read in ranged requests of ``block_size`` as the reader goes (no whole-file
    download first).
    """
    if not is_remote(path):
        return open(_local(path), "rb")
    kw = {"block_size": block_size, "cache_type": "readahead"} if block_size else {}
    return _fs(path).open(path, "rb", **kw)


def read_input(path: str) -> bytes:
    if is_remote(path):
        return _fs(path).cat_file(path)
    with open(_local(path), "rb") as f:
        return f.read()


class Store:
    """A folder, local or remote, addressed by paths made with ``join``."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root) if is_remote(root) else _local(root)
        self.remote = is_remote(self.root)

    def __repr__(self) -> str:
        return f"Store({self.root!r})"

    def join(self, *parts: str) -> str:
        return join(self.root, *parts)

    def exists(self, path: str) -> bool:
        return _fs(path).exists(path) if self.remote else os.path.exists(path)

    def read_bytes(self, path: str) -> bytes:
        return read_input(path)

    def write_bytes(self, path: str, data: bytes) -> None:
        if self.remote:
            _fs(path).pipe_file(path, data)
        else:
            atomic_write_bytes(path, data)

    def upload(self, local_file: str, path: str) -> None:
        """Move a finished local file to ``path``; remote: upload it whole, then delete it."""
        if self.remote:
            try:
                _fs(path).put_file(local_file, path)
            finally:
                os.unlink(local_file)
        else:
            os.replace(local_file, path)

    def size(self, path: str) -> int | None:
        try:
            return int(_fs(path).size(path)) if self.remote else os.path.getsize(path)
        except (FileNotFoundError, OSError):
            return None

    def names(self, folder: str) -> list[str]:
        """Entry names in a folder; [] when it does not exist."""
        if self.remote:
            fs = _fs(folder)
            try:
                return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False, refresh=True))
            except FileNotFoundError:
                return []
        try:
            return sorted(os.listdir(folder))
        except FileNotFoundError:
            return []

    def remove(self, path: str) -> None:
        try:
            _fs(path).rm_file(path) if self.remote else os.unlink(path)
        except FileNotFoundError:
            pass

    def rmtree(self, folder: str) -> None:
        if self.remote:
            try:
                _fs(folder).rm(folder, recursive=True)
            except FileNotFoundError:
                pass
        else:
            shutil.rmtree(folder, ignore_errors=True)

    def makedirs(self, folder: str) -> None:
        if not self.remote:
            os.makedirs(folder, exist_ok=True)
