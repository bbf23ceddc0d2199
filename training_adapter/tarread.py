"""Tar read: a shard URL opened and streamed as samples, with zero-copy member views.

The bytes are parsed by ``wds_tools.format.tar`` (multi-MiB reads, headers parsed in place, so a
224 px ``.npy`` member costs one slice of an existing buffer); ``wds_tools.format.layout`` opens
the URL (local files unbuffered, ``pipe:`` and ``http(s)://`` through webdataset's ``gopen``,
object stores through fsspec).
"""

from __future__ import annotations

from collections.abc import Iterator

from wds_tools.errors import ShardError
from wds_tools.format.layout import open_stream
from wds_tools.format.tar import DEFAULT_CHUNK, group_samples, iter_members, split_name

__all__ = ["DEFAULT_CHUNK", "open_url", "iter_members", "iter_samples", "split_name"]


def open_url(url: str):
    """Open a shard for streaming (``format.layout.open_stream``); ``ShardError`` when it cannot be."""
    try:
        return open_stream(url)
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
