"""Tar read: a streaming ustar reader that does large reads and hands out zero-copy member views.

Python's ``tarfile`` reads every header and member with its own small ``read``; this reader fills
multi-MiB chunks and parses headers in place, so a 224 px ``.npy`` member costs one slice of an
existing buffer. Local paths are opened unbuffered and filled with ``readinto``; every other URL
(``pipe:``, ``http(s)://``, ``file:``...) is opened with webdataset's ``gopen``, as stock
webdataset opens it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np

from wds_tools.errors import ShardError
from wds_tools.tarscan import BLOCK as _BLOCK
from wds_tools.tarscan import TarChecksumError, TarHeaderError, decode_header

__all__ = ["DEFAULT_CHUNK", "open_url", "iter_members", "iter_samples", "split_name"]

DEFAULT_CHUNK = 8 << 20
_ZERO_BLOCK = bytes(_BLOCK)
_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext


def split_name(name: str) -> tuple[str | None, str | None]:
    """``dir/key.seg.npy`` -> (``dir/key``, ``seg.npy``), webdataset's convention (first dot of the basename)."""
    m = _NAME_RE.match(name)
    return (m.group(1), m.group(2)) if m else (None, None)


# Object-store reads: one ranged request per block; larger blocks amortize request latency.
REMOTE_BLOCK = 32 << 20

# Schemes webdataset's gopen opens itself (pipe: runs a command; http(s) streams with curl).
_GOPEN_SCHEMES = {"pipe", "http", "https", "sftp", "ftps", "scp", "ais", "hf", "htgs"}


def open_url(url: str):
    """Open a shard for reading: unbuffered for a local path, webdataset's ``gopen`` otherwise."""
    scheme = urlparse(url).scheme
    try:
        if scheme == "" or len(scheme) == 1:  # a plain path (len 1: a Windows drive letter)
            return open(url, "rb", buffering=0)
        if scheme == "file":
            return open(url2pathname(urlparse(url).path), "rb", buffering=0)
        if scheme not in _GOPEN_SCHEMES:  # s3://, gs://, az://...: stream through fsspec
            from wds_tools.storage import open_input

            return open_input(url, block_size=REMOTE_BLOCK)
        from webdataset.gopen import gopen

        return gopen(url, "rb", bufsize=DEFAULT_CHUNK)
    except (OSError, ValueError) as e:
        raise ShardError(f"{url}: cannot open shard: {e}") from None


class _Chunks:
    """A read buffer over a stream; each refill is a new array, so earlier views stay valid."""

    def __init__(self, stream, url: str, chunk_size: int):
        self.stream, self.url, self.chunk_size = stream, url, chunk_size
        self.readinto = getattr(stream, "readinto", None)  # webdataset's Pipe has only read()
        self.mv = memoryview(np.empty(0, np.uint8))
        self.start = 0  # parse position in mv
        self.end = 0  # valid bytes in mv
        self.base = 0  # stream offset of mv[0]
        self.eof = False

    def offset(self) -> int:
        return self.base + self.start

    def have(self, n: int) -> bool:
        """Make at least n bytes available from start; False when the stream ends first."""
        while self.end - self.start < n:
            if self.eof:
                return False
            self._refill(n)
        return True

    def _refill(self, n: int) -> None:
        tail = self.end - self.start
        size = max(self.chunk_size, n + _BLOCK)
        new = memoryview(np.empty(size, np.uint8))
        new[:tail] = self.mv[self.start:self.end]
        filled = tail
        while filled < size:
            if self.readinto is not None:
                got = self.readinto(new[filled:])
            else:
                data = self.stream.read(size - filled)
                got = len(data)
                new[filled:filled + got] = data
            if not got:
                self.eof = True
                break
            filled += got
        self.base += self.start
        self.mv, self.start, self.end = new, 0, filled


def _pax_path(data: memoryview) -> str | None:
    """The ``path`` record of a PAX extended header, if any; ``ValueError`` for a malformed one.

    Each record is ``"<length> <key>=<value>\\n"`` with ``length`` counting the whole record, so
    every record advances by at least its own length prefix: the walk always ends.
    """
    raw, pos, path = bytes(data), 0, None
    while pos < len(raw):
        if raw[pos] == 0 and not raw[pos:].strip(b"\0"):  # NUL padding after the last record
            break
        sp = raw.find(b" ", pos, pos + 21)
        if sp <= pos or not raw[pos:sp].isdigit():
            raise ValueError(f"bad PAX record length {raw[pos:pos + 20]!r}")
        length = int(raw[pos:sp])
        if length < sp - pos + 3 or pos + length > len(raw) or raw[pos + length - 1] != 0x0A:
            raise ValueError(f"PAX record of length {length} does not fit its header "
                             f"({len(raw) - pos} bytes left, or no newline at its end)")
        k, eq, v = raw[sp + 1:pos + length - 1].partition(b"=")
        if not eq:
            raise ValueError(f"PAX record {raw[pos:pos + length][:40]!r} has no '='")
        if k == b"path":
            path = v.decode("utf-8")
        pos += length
    return path


# A member larger than this is damage, not data: a 4096 px RGB .npy is 48 MiB.
MAX_MEMBER = 1 << 30


def iter_members(stream, url: str, *, chunk_size: int = DEFAULT_CHUNK) -> Iterator[tuple[str, int, memoryview]]:
    """Yield (member name, byte offset of its header, data view) for every regular file.

    A view stays valid as long as it is referenced. Raises ``ShardError`` naming ``url`` and the
    byte offset on a bad header checksum or a stream that ends before the end-of-archive blocks.
    """
    buf = _Chunks(stream, url, chunk_size)
    long_name: str | None = None
    while True:
        offset = buf.offset()
        if not buf.have(_BLOCK):
            raise ShardError(
                f"{url}: truncated at byte {offset}: the stream ended without the end-of-archive "
                f"blocks (incomplete download or copy? check its size and sha256 in index.json)"
            )
        s = buf.start
        hdr = buf.mv[s:s + _BLOCK]
        if hdr == _ZERO_BLOCK:
            return
        try:
            name, size, kind = decode_header(hdr, offset)
        except TarChecksumError:
            raise ShardError(f"{url}: corrupt tar header at byte {offset} (checksum mismatch); "
                             f"the shard is damaged: re-copy or re-convert it") from None
        except TarHeaderError as e:
            raise ShardError(f"{url}: corrupt tar header at byte {offset}: {e}") from None
        if size > MAX_MEMBER:
            raise ShardError(f"{url}: corrupt tar header at byte {offset}: member {name!r} claims {size} bytes "
                             f"(more than {MAX_MEMBER}); the shard is damaged")
        padded = (size + _BLOCK - 1) // _BLOCK * _BLOCK
        if not buf.have(_BLOCK + padded):
            have = buf.end - buf.start - _BLOCK
            raise ShardError(
                f"{url}: truncated at byte {offset}: member {name!r} needs "
                f"{size} bytes of data, the stream has {max(have, 0)} (incomplete download or copy?)"
            )
        s = buf.start
        data = buf.mv[s + _BLOCK:s + _BLOCK + size]
        buf.start = s + _BLOCK + padded
        if kind in (b"0", b"\0", b"7"):
            yield (long_name if long_name is not None else name), offset, data
            long_name = None
        elif kind in (b"L", b"x"):
            try:
                if kind == b"L":  # GNU long name for the next member
                    long_name = bytes(data).split(b"\0", 1)[0].decode("utf-8")
                else:  # PAX header for the next member
                    long_name = _pax_path(data) or long_name
            except ValueError as e:  # UnicodeDecodeError included
                what = "GNU long name" if kind == b"L" else "PAX header"
                raise ShardError(f"{url}: corrupt {what} at byte {offset}: {e}") from None
        # directories, links, global PAX headers: nothing to read


def iter_samples(url: str, *, chunk_size: int = DEFAULT_CHUNK) -> Iterator[tuple[str, dict[str, memoryview], int]]:
    """Yield (key, {ext: data view}, header offset of the sample's first member) for one shard.

    Members are grouped by consecutive key, as webdataset's ``group_by_keys`` does.
    """
    stream = open_url(url)
    finished = False
    try:
        key: str | None = None
        sample: dict[str, memoryview] = {}
        first = 0
        for name, offset, data in iter_members(stream, url, chunk_size=chunk_size):
            k, ext = split_name(name)
            if k is None:
                continue
            ext = ext.lower()
            if k != key:
                if sample:
                    yield key, sample, first
                key, sample, first = k, {}, offset
            elif ext in sample:
                raise ShardError(f"{url}: byte {offset}: duplicate member {name!r} in sample {k!r}")
            sample[ext] = data
        if sample:
            yield key, sample, first
        finished = True
    except OSError as e:  # a pipe or curl that failed mid-stream
        raise ShardError(f"{url}: read failed: {e}") from None
    finally:
        try:
            stream.close()
        except (OSError, ValueError) as e:
            # webdataset's Pipe raises here on a non-zero exit status (curl -f on HTTP 404, ...);
            # when the consumer stopped early or an error is already on its way, it says nothing new
            if finished:
                raise ShardError(f"{url}: {e}") from None
