"""Object storage: conversion into, resume in, and loading from an S3-compatible server on 127.0.0.1."""

import os
from pathlib import Path

import pytest
import torch
from conftest import make_images, write_manifest

import wds_tools.storage.objects as storage
from wds_tools.convert import convert
from wds_tools.errors import OptionError


def _local_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _remote_files(fs, url: str) -> dict[str, bytes]:
    return {
        p.rsplit("/", 1)[-1]: fs.cat_file(p)
        for p in sorted(fs.ls(url, detail=False, refresh=True))
        if not p.rsplit("/", 1)[-1].startswith(".")
    }


def _convert(manifest, out, **kw):
    return convert(manifest, version="v1", size=32, out=out, workers=1, shard_size=6, progress=False, **kw)


def test_conversion_into_s3_equals_local(bucket, corpus, tmp_path):
    fs, url = bucket
    remote = _convert(corpus, f"{url}/shards")
    local = _convert(corpus, tmp_path / "local")
    assert remote.samples_written == local.samples_written == 40
    assert remote.splits["train"]["urls"].startswith(f"{url}/shards/v1/32/train-")
    assert _remote_files(fs, f"{url}/shards/v1/32") == _local_files(tmp_path / "local/v1/32")
    assert _convert(corpus, f"{url}/shards").already_complete


def test_interrupted_conversion_resumes_in_s3(bucket, corpus, tmp_path, interrupt_writes):
    fs, url = bucket
    written = interrupt_writes(2)
    with pytest.raises(KeyboardInterrupt):
        _convert(corpus, f"{url}/shards")
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{url}/shards/v1/32", detail=False, refresh=True)]
    assert "index.json" not in names and sorted(n for n in names if n.endswith(".tar")) == sorted(written)
    written.restore()
    res = _convert(corpus, f"{url}/shards")
    assert res.shards_resumed == 2
    _convert(corpus, tmp_path / "local")
    assert _remote_files(fs, f"{url}/shards/v1/32") == _local_files(tmp_path / "local/v1/32")


def test_failed_upload_leaves_no_index_entry(bucket, corpus, monkeypatch):
    fs, url = bucket
    real, calls = storage.Store.upload, []

    def flaky(self, local_file, path):
        if len(calls) == 2:
            os.unlink(local_file)
            raise OSError("connection reset during upload")
        calls.append(path)
        return real(self, local_file, path)

    monkeypatch.setattr(storage.Store, "upload", flaky)
    with pytest.raises(OSError, match="connection reset"):
        _convert(corpus, f"{url}/shards")
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{url}/shards/v1/32", detail=False, refresh=True)]
    assert "index.json" not in names and "samples.npz" not in names
    assert sorted(n for n in names if n.endswith(".tar")) == sorted(p.rsplit("/", 1)[-1] for p in calls)
    monkeypatch.setattr(storage.Store, "upload", real)
    assert _convert(corpus, f"{url}/shards").samples_written == 40


def test_manifest_and_sources_in_s3(bucket, tmp_path):
    fs, url = bucket
    root = tmp_path / "c"
    rows = make_images(root, 8)
    for r in rows:
        fs.put_file(str(root / r["path"]), f"{url}/corpus/{r['path']}")
    write_manifest(root / "m.csv", rows)
    fs.put_file(str(root / "m.csv"), f"{url}/corpus/m.csv")
    remote = _convert(f"{url}/corpus/m.csv", tmp_path / "from-s3")
    local = _convert(root / "m.csv", tmp_path / "from-disk")
    assert remote.samples_written == local.samples_written == 8
    a, b = _local_files(tmp_path / "from-s3/v1/32"), _local_files(tmp_path / "from-disk/v1/32")
    assert [n for n in a if n.endswith(".tar")] == [n for n in b if n.endswith(".tar")]
    assert all(a[n] == b[n] for n in a if n.endswith(".tar"))  # same pixels, labels and json


def test_reuse_from_object_storage_is_refused_clearly(bucket, corpus):
    _, url = bucket
    with pytest.raises(OptionError, match="--from v0: reusing pixels from object storage"):
        _convert(corpus, f"{url}/shards", base="v0")


def test_loader_reads_s3_shards_by_offset_and_streaming(bucket, corpus, tmp_path):
    from training_adapter import make_loader

    fs, url = bucket
    remote = _convert(corpus, f"{url}/shards", val_fraction=0.0)
    local = _convert(corpus, tmp_path / "local", val_fraction=0.0)

    def read_all(urls, reader="auto"):
        loader = make_loader(
            urls, batch_size=4, train=False, num_workers=0, return_keys=True, split="train", reader=reader
        )
        assert (loader.dataset.index is not None) == (reader == "auto")  # an index lists them: read by offset
        out = {}
        for batch in loader:
            images, labels, keys = batch
            for k, im in zip(keys, images):
                out[k] = im.clone()
        return out

    from_s3 = read_all(remote.splits["train"]["urls"])
    from_disk = read_all(local.splits["train"]["urls"])
    assert len(from_s3) == 40 and from_s3.keys() == from_disk.keys()
    assert all(torch.equal(from_s3[k], from_disk[k]) for k in from_s3)
    assert len(read_all(f"{url}/shards/v1/32")) == 40  # the folder, through its index.json
    streamed = read_all(f"{url}/shards/v1/32", reader="stream")  # ranged reads vs streaming the tars
    assert streamed.keys() == from_s3.keys() and all(torch.equal(streamed[k], from_s3[k]) for k in from_s3)


def test_multi_size_conversion_into_s3_equals_local(bucket, corpus, tmp_path):
    """The spill goes through object storage too (staged, uploaded, read back by range)."""
    fs, url = bucket
    remote = convert(corpus, version="v1", size="32,48", out=f"{url}/shards", workers=2, shard_size=6, progress=False)
    assert [r.samples_written for r in remote.results] == [40, 40]
    for size in (32, 48):
        convert(corpus, version="v1", size=size, out=tmp_path / "local", workers=1, shard_size=6, progress=False)
        assert _remote_files(fs, f"{url}/shards/v1/{size}") == _local_files(tmp_path / f"local/v1/{size}")
    hidden = [p for p in fs.find(f"{url}/shards") if "/." in p]
    assert hidden == []  # no spill or work files left behind


def test_sources_in_s3_are_compared_by_manifest_hash_not_by_mtime(bucket, tmp_path):
    """Object stores give no mtime here: without a hash column every S3 source is read to compare;
    with one, a HEAD request (size) is all an unchanged source costs."""
    import hashlib

    from conftest import write_manifest as write

    fs, url = bucket
    root = tmp_path / "c"
    rows = make_images(root, 6)
    for r in rows:
        fs.put_file(str(root / r["path"]), f"{url}/corpus/{r['path']}")
        r["sha256"] = hashlib.sha256((root / r["path"]).read_bytes()).hexdigest()
    plain = [{k: v for k, v in r.items() if k != "sha256"} for r in rows]
    for name, table, fields in (
        ("plain", plain, ("key", "path", "label")),
        ("hashed", rows, ("key", "path", "label", "sha256")),
    ):
        write(root / f"{name}.csv", table, fields)
        fs.put_file(str(root / f"{name}.csv"), f"{url}/corpus/{name}.csv")
        out = tmp_path / name
        convert(f"{url}/corpus/{name}.csv", version="v1", size=32, out=out, workers=1, progress=False)
        v2 = convert(f"{url}/corpus/{name}.csv", version="v2", size=32, out=out, workers=1, progress=False)
        assert v2.decoded == 0 and v2.reused == 6
        expected = (6, 0, 0) if name == "plain" else (0, 0, 6)
        assert (v2.sources_read, v2.unchanged_by_stat, v2.unchanged_by_hash) == expected
