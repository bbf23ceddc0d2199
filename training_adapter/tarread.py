"""Tar read: a shard URL opened and streamed as samples, with zero-copy member views.

The bytes are parsed by ``wds_tools.format.tar`` (multi-MiB reads, headers parsed in place, so a
224 px ``.npy`` member costs one slice of an existing buffer). Local paths are opened unbuffered
and filled with ``readinto``; every other URL (``pipe:``, ``http(s)://``, ``file:``...) is opened
with webdataset's ``gopen``, as stock webdataset opens it; object stores through fsspec.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlparse
from urllib.request import url2pathname


from wds_tools.errors import ShardError
from wds_tools.format.tar import DEFAULT_CHUNK, group_samples, iter_members, split_name

__all__ = ["DEFAULT_CHUNK", "open_url", "iter_members", "iter_samples", "split_name"]

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
        raise ShardError(f"{url}: cannot open shard: {e}", url=url) from None


def iter_samples(url: str, *, chunk_size: int = DEFAULT_CHUNK) -> Iterator[tuple[str, dict[str, memoryview], int]]:
    """Yield (key, {ext: data view}, header offset of the sample's first member) for one shard.

    Members are grouped by consecutive key, as webdataset's ``group_by_keys`` does.
    """
    stream = open_url(url)
    finished = False
    try:
        yield from group_samples(iter_members(stream, url, chunk_size=chunk_size), url)
        finished = True
    except OSError as e:  # a pipe or curl that failed mid-stream
        raise ShardError(f"{url}: read failed: {e}", url=url) from None
    finally:
        try:
            stream.close()
        except (OSError, ValueError) as e:
            # webdataset's Pipe raises here on a non-zero exit status (curl -f on HTTP 404, ...);
            # when the consumer stopped early or an error is already on its way, it says nothing new
            if finished:
                raise ShardError(f"{url}: {e}", url=url) from None
