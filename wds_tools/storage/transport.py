"""Transport: the bytes of a file named by a local path or a URL (``file://``, fsspec such as ``s3://``,
``http(s)://``; ``pipe:CMD`` for the loader only), by its ``scheme``, which every other module asks.

``open_stream`` reads sequentially (local files unbuffered; ``pipe:`` and http through webdataset's ``gopen``,
as stock webdataset opens them; fsspec with large readahead blocks), ``open_file`` seekably, ``read_bytes`` a
whole small file, ``open_ranged`` and ``read_ranges`` bytes at offsets, ``list_tars`` a folder (not over http).
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import lru_cache
from http.client import HTTPResponse
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import urlparse
from urllib.request import url2pathname

from ..errors import ExtraNotInstalledError, OptionError, install_hint

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = [
    "NOT_RANGED",
    "readable_by_offset",
    "REMOTE_BLOCK",
    "scheme",
    "is_local",
    "is_remote",
    "local_path",
    "join",
    "parent",
    "basename",
    "filesystem",
    "open_stream",
    "open_file",
    "read_bytes",
    "file_size",
    "exists",
    "list_tars",
    "RangedFile",
    "open_ranged",
    "read_ranges",
]

REMOTE_BLOCK = 32 << 20
"""Object-store reads: one ranged request per block of this many bytes; larger blocks amortize latency."""
GOPEN_BUFFER = 8 << 20
# Schemes webdataset's gopen opens itself (pipe: runs a command; http(s) streams with curl).
GOPEN_SCHEMES = frozenset({"pipe", "http", "https", "sftp", "ftps", "scp", "ais", "hf", "htgs"})
HTTP_SCHEMES = frozenset({"http", "https"})
HTTP_TIMEOUT = 60  # seconds to connect or to wait for the next bytes

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


NOT_RANGED = ("pipe", "http", "https")
"""Schemes whose objects cannot be read by byte range (the index reader cannot read them by offset)."""


def readable_by_offset(url: str) -> bool:
    """Whether the index reader can read ``url`` by offset: a local path or an object store, not pipe: or http(s)."""
    return scheme(url) not in NOT_RANGED


def scheme(url: str | os.PathLike) -> str:
    """``""`` for a local path, ``pipe`` for ``pipe:CMD``, else the URL's scheme (file, s3, https...)."""
    text = os.fspath(url)
    if text.startswith("pipe:"):
        return "pipe"
    m = _URL.match(text)
    return m.group(1).lower() if m else ""


def is_local(url: str | os.PathLike) -> bool:
    """A plain path or a ``file://`` URL."""
    return scheme(url) in ("", "file")


def is_remote(url: str | os.PathLike) -> bool:
    """Any other URL (an object store, ``http(s)://``, ``pipe:``): not a file on this machine."""
    return not is_local(url)


def local_path(url: str | os.PathLike) -> str | None:
    """The file a local path or ``file://`` URL names; None for any other URL."""
    kind = scheme(url)
    if kind == "":
        return os.fspath(url)
    if kind == "file":
        return url2pathname(urlparse(os.fspath(url)).path)
    return None


def join(base: str | os.PathLike, *names: str) -> str:
    """``base/name``: an OS path for a local folder, ``/``-joined for a URL."""
    local = local_path(base)
    if local is not None:
        return os.path.join(local, *names)
    return "/".join([os.fspath(base).rstrip("/"), *names])


def parent(url: str) -> str:
    """The folder holding ``url``."""
    return url.rsplit("/", 1)[0] if scheme(url) else os.path.dirname(url)


def basename(url: str) -> str:
    """The file name in ``url``."""
    return url.rsplit("/", 1)[-1] if scheme(url) else os.path.basename(url)


def filesystem(url: str) -> AbstractFileSystem:
    """The fsspec filesystem of ``url``'s scheme (s3, gs...), made once per scheme."""
    return _filesystem(scheme(url))


@lru_cache(maxsize=16)
def _filesystem(protocol: str) -> AbstractFileSystem:
    try:
        import fsspec
    except ImportError:
        raise ExtraNotInstalledError(f"{protocol}:// paths need fsspec: {install_hint('s3')}") from None
    try:
        return fsspec.filesystem(protocol)
    except (ImportError, ValueError) as e:
        raise OptionError(
            f"{protocol}:// paths need their fsspec backend ({e}); for s3:// {install_hint('s3')}"
        ) from None


def open_stream(url: str) -> BinaryIO:
    """Open a file for reading start to end: unbuffered for a local file (fill buffers with
    ``readinto``), webdataset's ``gopen`` for pipe: and http(s), fsspec in ``REMOTE_BLOCK`` ranged
    requests for an object store. A missing file raises ``FileNotFoundError`` where the scheme
    tells (not through gopen: there the first read fails)."""
    local = local_path(url)
    if local is not None:
        return open(local, "rb", buffering=0)
    if scheme(url) in GOPEN_SCHEMES:
        from webdataset.gopen import gopen

        return gopen(url, "rb", bufsize=GOPEN_BUFFER)
    return open_file(url, block_size=REMOTE_BLOCK)


def open_file(url: str, block_size: int | None = None) -> BinaryIO:
    """Open a seekable binary file: a local one, or any URL fsspec knows (its file objects have
    ``size``), read in ranged requests of ``block_size`` as the reader goes (no download first)."""
    local = local_path(url)
    if local is not None:
        return open(local, "rb")
    kw = {"block_size": block_size, "cache_type": "readahead"} if block_size else {}
    return filesystem(url).open(url, "rb", **kw)


def read_bytes(url: str) -> bytes:
    """A whole (small) file."""
    local = local_path(url)
    if local is not None:
        with open(local, "rb") as f:
            return f.read()
    kind = scheme(url)
    if kind in HTTP_SCHEMES:
        with _http(url) as r:
            return r.read()
    if kind in GOPEN_SCHEMES:
        with open_stream(url) as f:
            return f.read()
    return filesystem(url).cat_file(url)


def file_size(url: str) -> int:
    """The size of a file in bytes; ``FileNotFoundError`` when there is none."""
    local = local_path(url)
    if local is not None:
        return os.path.getsize(local)
    kind = scheme(url)
    if kind in HTTP_SCHEMES:
        with _http(url, "HEAD") as r:
            length = r.headers.get("Content-Length")
        if length is None:
            raise OSError(f"{url}: the server gives no Content-Length")
        return int(length)
    if kind in GOPEN_SCHEMES:
        raise OSError(f"{url}: the size of a {kind}: URL is not known before it is read")
    return int(filesystem(url).size(url))


def exists(url: str) -> bool:
    """Whether a file is there."""
    local = local_path(url)
    if local is not None:
        return os.path.isfile(local)
    try:
        file_size(url)
    except FileNotFoundError:
        return False
    return True


def list_tars(folder: str) -> list[str] | None:
    """Names of the ``*.tar`` files in a folder, sorted; None where the store cannot list (http)."""
    local = local_path(folder)
    if local is not None:
        return sorted(e.name for e in os.scandir(local) if e.name.endswith(".tar") and e.is_file())
    if scheme(folder) in GOPEN_SCHEMES:
        return None
    try:
        found = filesystem(folder).ls(folder, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    return sorted(n for n in (p.rstrip("/").rsplit("/", 1)[-1] for p in found) if n.endswith(".tar"))


def _http(url: str, method: str = "GET", start: int | None = None, end: int | None = None) -> HTTPResponse:
    """An open urllib response (bytes ``start:end`` when given); HTTP 404 raises ``FileNotFoundError``,
    other failures ``OSError``."""
    req = urllib.request.Request(url, method=method)
    if start is not None and end is not None:
        req.add_header("Range", f"bytes={start}-{end - 1}")
    try:
        return urllib.request.urlopen(req, timeout=HTTP_TIMEOUT)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code in (404, 410):
            raise FileNotFoundError(2, f"HTTP {e.code} {e.reason}", url) from None
        raise OSError(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise OSError(f"cannot reach the server: {e.reason}") from None


class RangedFile:
    """A file read at offsets: ``pread`` on a local file, ranged requests elsewhere.

    An http server that ignores ``Range`` sends the whole file: it is kept and sliced.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._kind = scheme(url)
        self._fd: int | None = None
        self._whole: bytes | None = None
        local = local_path(url)
        if local is not None:
            self._fd = os.open(local, os.O_RDONLY)
            self.size = os.fstat(self._fd).st_size
        elif self._kind in GOPEN_SCHEMES - HTTP_SCHEMES:
            raise OSError(f"{url}: a {self._kind}: URL cannot be read at offsets")
        else:
            self.size = file_size(url)

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end of the file)."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        if self._fd is not None:
            return os.pread(self._fd, end - offset, offset)
        if self._whole is not None:
            return self._whole[offset:end]
        if self._kind in HTTP_SCHEMES:
            with _http(self.url, start=offset, end=end) as r:
                data = r.read()
                if r.status == 206:
                    return data
            self._whole = data  # 200: the server sent the whole file
            return data[offset:end]
        return filesystem(self.url).cat_file(self.url, start=offset, end=end)

    def close(self) -> None:
        """Close the local file (a remote one holds nothing open)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._whole = None

    def __enter__(self) -> RangedFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def open_ranged(url: str) -> RangedFile:
    """Open a file for reads at offsets (``RangedFile``); ``FileNotFoundError`` when there is none."""
    return RangedFile(url)


def read_ranges(urls: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> list[bytes | BaseException]:
    """Bytes ``starts[i]:ends[i]`` of ``urls[i]`` (one store), or the exception that read raised.

    Object stores get concurrent requests (fsspec ``cat_ranges``); a local or http file is opened once.
    """
    if not urls:
        return []
    if not is_local(urls[0]) and scheme(urls[0]) not in GOPEN_SCHEMES:
        return filesystem(urls[0]).cat_ranges(list(urls), list(starts), list(ends), on_error="return")
    files: dict[str, RangedFile | BaseException] = {}
    out: list[bytes | BaseException] = []
    try:
        for url, s, e in zip(urls, starts, ends):
            f = files.get(url)
            if f is None:
                try:
                    f = files[url] = RangedFile(url)
                except OSError as err:
                    f = files[url] = err
            if isinstance(f, BaseException):
                out.append(f)
                continue
            try:
                out.append(f.read(s, e - s))
            except OSError as err:
                out.append(err)
    finally:
        for f in files.values():
            if isinstance(f, RangedFile):
                f.close()
    return out
