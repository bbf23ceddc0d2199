"""storage.transport: the one reader of bytes, on local folders, file:// URLs, S3 (moto on 127.0.0.1)
and http (http.server on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import convert_images, upload

from wds_tools.storage import transport
from wds_tools.storage.transport import (
    file_size,
    is_local,
    is_remote,
    list_tars,
    open_ranged,
    open_stream,
    read_bytes,
    read_ranges,
    scheme,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """25 train samples in 7 shards of up to 4, 5 val samples in 2 shards, and the index."""
    return convert_images(tmp_path_factory.mktemp("transport"), 30, size=16, shard_size=4, val_every=6)


def test_the_scheme_names_the_store():
    """One test of a path's scheme, which every reader and the converter's output ask."""
    paths = ("/a/b", "a/b", "/a/b://c", "file:///a", "S3://b/k", "https://h/x", "pipe:cat x")
    assert [scheme(p) for p in paths] == ["", "", "", "file", "s3", "https", "pipe"]
    assert [is_local(p) for p in paths] == [True, True, True, True, False, False, False]
    assert all(is_remote(p) != is_local(p) for p in paths)


@pytest.fixture
def places(folder, bucket, serve_http) -> dict[str, str]:
    """The same folder: local, file://, S3, http with and without Range support."""
    fs, url = bucket
    return {
        "local": str(folder),
        "file": f"file://{folder}",
        "s3": upload(fs, folder, f"{url}/v1/16"),
        "http": serve_http(folder),
        "http-ranges": serve_http(folder, ranges=True),
    }


def test_every_store_gives_the_same_bytes(folder, places):
    name = "train-000001.tar"
    data = (folder / name).read_bytes()
    index = (folder / "index.json").read_bytes()
    for where, base in places.items():
        url = transport.join(base, name)
        assert file_size(url) == len(data), where
        assert read_bytes(transport.join(base, "index.json")) == index, where
        with open_stream(url) as f:
            got = bytearray()
            while chunk := f.read(5000):
                got += chunk
        assert got == data, where
        with open_ranged(url) as f:
            assert f.size == len(data)
            assert f.read(512, 100) == data[512:612] and f.read(len(data) - 10, 100) == data[-10:], where
            assert f.read(len(data), 10) == b"", where
        spans = [(0, 512), (1024, 1500), (len(data) - 512, len(data))]
        assert read_ranges([url] * 3, *zip(*spans)) == [data[a:b] for a, b in spans], where


def test_missing_files_and_listing(folder, places):
    for where, base in places.items():
        gone = transport.join(base, "train-000099.tar")
        with pytest.raises(FileNotFoundError):
            file_size(gone)
        with pytest.raises(FileNotFoundError):
            read_bytes(gone)
        with pytest.raises(FileNotFoundError):
            open_ranged(gone)
        assert not transport.exists(gone) and transport.exists(transport.join(base, "index.json")), where
        tars = list_tars(base)
        if where.startswith("http"):
            assert tars is None  # a web server cannot list a folder
        else:
            assert tars == sorted(p.name for p in folder.glob("*.tar")), where


def test_a_url_without_fsspec_or_its_backend_names_the_package_to_install(monkeypatch):
    import sys

    from wds_tools.errors import ExtraNotInstalledError, OptionError

    transport._filesystem.cache_clear()
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if the s3 extra were not installed
    with pytest.raises(ExtraNotInstalledError, match=r"s3:// paths need fsspec: pip install s3fs==2026\.9\.0"):
        transport._filesystem("s3")
    monkeypatch.undo()
    transport._filesystem.cache_clear()
    import fsspec

    def without_backend(protocol):  # fsspec there, its s3 backend not (as fsspec says it: ImportError)
        raise ImportError("Install s3fs to access S3")

    monkeypatch.setattr(fsspec, "filesystem", without_backend)
    with pytest.raises(OptionError, match=r"need their fsspec backend .*for s3:// pip install s3fs==2026\.9\.0"):
        transport._filesystem("s3")
    monkeypatch.undo()
    transport._filesystem.cache_clear()
