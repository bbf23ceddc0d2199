import hashlib
import json
import os
import re
import shutil
import sys
import tarfile

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner
from conftest import convert_images, upload
from hypothesis import given, settings
from hypothesis import strategies as st
from shardkit import build_dataset, copy_tars, member, rewrite_tar

from wds_tools.cli import cli
from wds_tools.errors import IndexFormatError
from wds_tools.format.index import load_index, read_npz, write_npz
from wds_tools.format.packed import pack_strings
from wds_tools.inspect.verify import verify
from wds_tools.inspect.verify.problems import PROBLEM_KINDS, SCHEMA
from wds_tools.inspect.verify.table import SampleColumns
from wds_tools.storage.fsutil import dumps_canonical


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return convert_images(tmp_path_factory.mktemp("verify"), 30, size=32, shard_size=10, val_fraction=0.0)


@pytest.fixture
def shards(pristine, tmp_path):
    """A fresh copy of the converted set (3 train shards of 10) to damage."""
    return shutil.copytree(pristine, tmp_path / "shards")


def _kinds(report, shard):
    return {p.kind for p in report.problems if p.shard == shard}


def _row(folder, shard_pos, i):
    s = load_index(folder).samples
    rows = np.nonzero(s["shard"] == shard_pos)[0]
    return s.keys[rows[i]], {
        m: (int(s[f"{m}_offset"][rows[i]]), int(s[f"{m}_length"][rows[i]])) for m in ("cls", "json", "npy")
    }


def test_intact_set_passes_every_mode(shards, tmp_path):
    for kw in ({}, {"quick": True}, {"scan": True}, {"scan": True, "quick": True}):
        r = verify(shards, **kw)
        assert r.ok, (kw, r.to_text())
        assert r.shards == 3 and r.samples == 30
    r = verify(shards)
    assert r.bytes_read == r.bytes == sum(p.stat().st_size for p in shards.glob("*.tar"))
    assert "OK: every shard is intact." in r.to_text()
    assert verify(copy_tars(shards, tmp_path / "bare"), scan=True).ok


def test_missing_shard(shards):
    (shards / "train-000001.tar").unlink()
    for quick in (False, True):
        r = verify(shards, quick=quick)
        assert not r.ok and r.bad_shards == ["train-000001.tar"] and _kinds(r, "train-000001.tar") == {"missing"}
        assert "train-000001.tar [missing]" in r.to_text()


def test_truncated_shard(shards):
    p = shards / "train-000002.tar"
    p.write_bytes(p.read_bytes()[:9000])
    for quick in (False, True):
        r = verify(shards, quick=quick)
        assert r.bad_shards == ["train-000002.tar"]
        assert {"size", "truncated"} <= _kinds(r, "train-000002.tar")
        assert any("truncated: 9,000 bytes" in p.message for p in r.problems)
    r = verify(copy_tars(shards, shards.parent / "bare"), scan=True)
    assert r.bad_shards == ["train-000002.tar"] and "truncated" in _kinds(r, "train-000002.tar")


def test_flipped_pixel_byte_names_the_sample(shards):
    key, at = _row(shards, 1, 4)
    p = shards / "train-000001.tar"
    data = bytearray(p.read_bytes())
    data[at["npy"][0] + 128 + 77] ^= 0x01
    p.write_bytes(bytes(data))
    r = verify(shards)
    assert r.bad_shards == ["train-000001.tar"] and r.bad_samples == [key]
    assert _kinds(r, "train-000001.tar") == {"sha256", "sample_data"}
    assert f"key {key}" in r.to_text()
    # --quick reads sizes and headers only: a changed pixel is out of its reach
    assert verify(shards, quick=True).ok


def test_npy_header_with_another_shape(shards):
    key, at = _row(shards, 0, 2)
    p = shards / "train-000000.tar"
    data = p.read_bytes()
    off = at["npy"][0]
    header = data[off : off + 128]
    assert b"(32, 32, 3)" in header
    p.write_bytes(data[:off] + header.replace(b"(32, 32, 3)", b"(32, 96, 1)") + data[off + 128 :])
    for quick in (False, True):
        r = verify(shards, quick=quick)
        npy = [x for x in r.problems if x.kind == "npy_header"]
        assert len(npy) == 1 and npy[0].key == key and npy[0].offset == off
        assert "shape [32, 96, 1]; expected dtype |u1, shape [32, 32, 3]" in npy[0].message
    r = verify(copy_tars(shards, shards.parent / "bare"), scan=True)
    assert [x.key for x in r.problems if x.kind == "npy_header"] == [key]


def test_extra_member(shards):
    rewrite_tar(shards / "train-000000.tar", lambda ms: ms[:3] + [member("intruder.txt", b"hello")] + ms[3:])
    r = verify(shards)
    assert r.bad_shards == ["train-000000.tar"]
    extra = [x for x in r.problems if x.kind == "extra_member"]
    assert [(x.key, x.shard) for x in extra] == [("intruder", "train-000000.tar")]
    assert "intruder.txt (5 B) is not in the index" in r.to_text()
    assert "member_offset" in _kinds(r, "train-000000.tar")  # later members moved by the insert
    r = verify(copy_tars(shards, shards.parent / "bare"), scan=True)
    assert [(x.kind, x.key) for x in r.problems] == [("incomplete_sample", "intruder")]


def test_read_error_mid_file_is_reported_by_name(shards, monkeypatch):
    import errno

    import wds_tools.format.tar as tar

    real = tar.iter_chunks

    def failing(path, *a, **kw):
        for i, part in enumerate(real(path, 4096)):
            if str(path).endswith("train-000001.tar") and i == 3:
                raise OSError(errno.EIO, "Input/output error")
            yield part

    monkeypatch.setattr(tar, "iter_chunks", failing)
    for kw in ({}, {"scan": True}):
        r = verify(shards, **kw)
        assert not r.ok and r.bad_shards == ["train-000001.tar"], kw
        assert _kinds(r, "train-000001.tar") == {"unreadable"}
        assert "Input/output error" in r.to_text()


def test_missing_member(shards):
    key, _ = _row(shards, 2, 1)
    rewrite_tar(shards / "train-000002.tar", lambda ms: [m for m in ms if m[0].name != f"{key}.json"])
    for quick in (False, True):
        r = verify(shards, quick=quick)
        miss = [x for x in r.problems if x.kind == "missing_member"]
        assert [(x.key, x.shard) for x in miss] == [(key, "train-000002.tar")]
        assert f"{key}.json is in the index but not in the tar" in r.to_text()
    r = verify(copy_tars(shards, shards.parent / "bare"), scan=True)
    assert [(x.kind, x.key) for x in r.problems] == [("incomplete_sample", key)]


def test_flipped_header_byte(shards):
    key, at = _row(shards, 1, 0)
    p = shards / "train-000001.tar"
    data = bytearray(p.read_bytes())
    data[at["json"][0] - 512 + 3] ^= 0x20  # inside the name field of the .json member's header
    p.write_bytes(bytes(data))
    for quick in (False, True):
        r = verify(shards, quick=quick)
        hdr = [x for x in r.problems if x.kind == "tar_header"]
        assert len(hdr) == 1 and hdr[0].key == key and hdr[0].offset == at["json"][0] - 512
        assert "fails its checksum" in hdr[0].message and "not reached" in hdr[0].message


def test_duplicate_key_across_shards(shards):
    key, _ = _row(shards, 0, 0)
    import tarfile

    with tarfile.open(shards / "train-000000.tar") as tf:
        copies = [(m, tf.extractfile(m).read()) for m in tf.getmembers() if m.name.startswith(key + ".")]
    rewrite_tar(shards / "train-000002.tar", lambda ms: ms + copies)
    r = verify(shards)
    assert {(x.kind, x.key) for x in r.problems if x.shard == "train-000002.tar"} >= {("extra_member", key)}
    r = verify(copy_tars(shards, shards.parent / "bare"), scan=True)
    dup = [x for x in r.problems if x.kind == "duplicate_key"]
    assert {x.shard for x in dup} == {"train-000000.tar", "train-000002.tar"} and {x.key for x in dup} == {key}


def test_damaged_sample_table(shards):
    p = shards / "samples.npz"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    r = verify(shards)
    assert [x.kind for x in r.problems][:1] == ["index"] and r.bad_shards[0] == "samples.npz"


def test_pattern_and_unindexed_tar(shards):
    r = verify(str(shards / "train-{000000..000001}.tar"))
    assert r.ok and r.shards == 2 and r.samples == 20
    shutil.copy(shards / "train-000000.tar", shards / "train-000099.tar")
    r = verify(shards)
    assert r.ok and any("train-000099.tar" in w for w in r.warnings)


def test_unbalanced_hand_built_set_verifies(tmp_path):
    folder = build_dataset(tmp_path / "hb", {"train": [[0, 1, 2], [1]], "val": [[2, 2]]}, size=6)
    assert verify(folder).ok and verify(folder, quick=True).ok and verify(folder, scan=True).ok


def test_errors_are_named(tmp_path, shards):
    with pytest.raises(IndexFormatError, match=r"no index at .*bare/index.json; pass --scan"):
        verify(copy_tars(shards, tmp_path / "bare"))
    with pytest.raises(IndexFormatError, match="no converted dataset under"):
        verify(out=tmp_path / "empty")
    assert set(PROBLEM_KINDS) >= {"missing", "size", "sha256", "truncated", "extra_member", "missing_member"}


# ------------------------------------------------------------------ CLI


def test_cli_exit_status_and_json_schema(shards, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(cli, ["verify", str(shards)])
    assert ok.exit_code == 0 and "OK: every shard is intact." in ok.output
    (shards / "train-000001.tar").unlink()
    bad = runner.invoke(cli, ["verify", str(shards)])
    assert bad.exit_code == 3 and "train-000001.tar [missing]" in bad.output and "Traceback" not in bad.output
    res = runner.invoke(cli, ["verify", str(shards), "--json", "--quick"])
    assert res.exit_code == 3
    d = json.loads(res.stdout)
    assert d["schema"] == SCHEMA == "wds-tools-verify/1"
    assert set(d) == {
        "schema",
        "path",
        "root",
        "index",
        "mode",
        "ok",
        "shards",
        "samples",
        "bytes",
        "bytes_read",
        "seconds",
        "read_mb_per_s",
        "bad_shards",
        "bad_samples",
        "problems",
        "warnings",
    }
    assert d["ok"] is False and d["mode"] == "quick" and d["bad_shards"] == ["train-000001.tar"]
    assert set(d["problems"][0]) == {"shard", "kind", "message", "key", "offset"}
    res = runner.invoke(cli, ["verify", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no such shards folder" in res.output


# ------------------------------------------------------------------ object storage and http


def _where_independent(report) -> dict:
    """A report's dict without what names the place it was read from (the folder in messages too)."""
    d = report.to_dict()
    problems = [{**p, "message": p["message"].replace(d["root"], "ROOT")} for p in d["problems"]]
    return {k: v for k, v in d.items() if k not in ("path", "root", "index", "seconds", "read_mb_per_s")} | {
        "problems": problems
    }


@pytest.fixture
def damaged(shards):
    """The set with train-000000 missing, train-000001 with a flipped pixel byte, train-000002 cut short,
    and a tar the index does not list."""
    key, at = _row(shards, 1, 4)
    p = shards / "train-000001.tar"
    data = bytearray(p.read_bytes())
    data[at["npy"][0] + 128 + 77] ^= 0x01
    p.write_bytes(bytes(data))
    p = shards / "train-000002.tar"
    p.write_bytes(p.read_bytes()[:9000])
    shutil.copy(shards / "train-000000.tar", shards / "train-000099.tar")
    (shards / "train-000000.tar").unlink()
    return shards, key


def test_s3_and_http_report_damage_as_locally(damaged, bucket, serve_http):
    shards, key = damaged
    fs, url = bucket
    s3 = upload(fs, shards, f"{url}/v1/32")
    webs = [serve_http(shards), serve_http(shards, ranges=True)]
    for quick in (False, True):
        local = verify(shards, quick=quick)
        flipped = [] if quick else ["train-000001.tar"]  # --quick does not read pixels
        assert local.bad_shards == ["train-000000.tar", *flipped, "train-000002.tar"]
        assert {"missing", "truncated", "size"} <= {p.kind for p in local.problems}
        assert (key in local.bad_samples) is not quick
        assert any("train-000099.tar" in w for w in local.warnings)
        expected = _where_independent(local)
        for path in (s3, f"{s3}/index.json"):
            assert _where_independent(verify(path, quick=quick)) == expected, (path, quick)
        for web in webs:  # a web server cannot list the folder: no warning about tars the index lacks
            got = _where_independent(verify(f"{web}/index.json", quick=quick))
            assert got == {**expected, "warnings": []}, (web, quick)
        pattern = "train-{000001..000002}.tar"
        part = _where_independent(verify(str(shards / pattern), quick=quick))
        assert part["bad_shards"] == [*flipped, "train-000002.tar"]
        assert _where_independent(verify(f"{s3}/{pattern}", quick=quick)) == part
        assert _where_independent(verify(f"{webs[0]}/{pattern}", quick=quick)) == part


def test_s3_and_http_scan_as_locally(damaged, bucket, serve_http, tmp_path):
    shards, _ = damaged
    fs, url = bucket
    bare = copy_tars(shards, tmp_path / "bare")
    s3 = upload(fs, bare, f"{url}/bare")
    web = serve_http(bare)
    for quick in (False, True):
        local = verify(bare, scan=True, quick=quick)
        assert "truncated" in _kinds(local, "train-000002.tar")
        expected = _where_independent(local)
        assert _where_independent(verify(s3, scan=True, quick=quick)) == expected
        pattern = "train-{000001,000002,000099}.tar"
        assert _where_independent(verify(f"{web}/{pattern}", scan=True, quick=quick)) == _where_independent(
            verify(str(bare / pattern), scan=True, quick=quick)
        )
    missing = verify(f"{web}/train-{{000000..000001}}.tar", scan=True)
    assert _kinds(missing, "train-000000.tar") == {"missing"}


def test_cli_reads_urls(damaged, bucket):
    shards, _ = damaged
    fs, url = bucket
    s3 = upload(fs, shards, f"{url}/v1/32")
    res = CliRunner().invoke(cli, ["verify", s3, "--json"])
    assert res.exit_code == 3 and json.loads(res.stdout)["root"] == s3
    assert json.loads(res.stdout)["bad_shards"] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    res = CliRunner().invoke(cli, ["stats", f"{s3}/index.json"])
    assert res.exit_code == 0 and f"{s3}  (" in res.output


def test_s3_and_http_are_verified_as_locally(shards, bucket, serve_http):
    fs, url = bucket
    s3 = upload(fs, shards, f"{url}/v1/32")
    web = serve_http(shards, ranges=True)
    for path in (s3, f"{s3}/index.json", web, f"{web}/index.json"):
        for quick in (False, True):
            r = verify(path, quick=quick)
            assert r.ok and r.shards == 3 and r.samples == 30, (path, quick, r.to_text())
    key, at = _row(shards, 1, 4)  # one flipped pixel byte, uploaded: named from the bucket and the web server
    p = shards / "train-000001.tar"
    data = bytearray(p.read_bytes())
    data[at["npy"][0] + 128 + 5] ^= 0x10
    p.write_bytes(bytes(data))
    fs.put_file(str(p), f"{s3}/train-000001.tar")
    for path in (s3, web):
        r = verify(path)
        assert r.bad_shards == ["train-000001.tar"] and r.bad_samples == [key], path


# ------------------------------------------------------------------ the index against itself and the data


@pytest.fixture(scope="module")
def two_splits(tmp_path_factory):
    """30 JPEGs at 16 px: train 22 samples in 5 shards, val 8 in 2 (every 4th row), classes a, b, c."""
    return convert_images(tmp_path_factory.mktemp("splits"), 30, size=16, shard_size=5, val_every=4)


@pytest.fixture
def split_set(two_splits, tmp_path):
    return shutil.copytree(two_splits, tmp_path / "set")


def _edit_index(folder, edit) -> None:
    meta = json.loads((folder / "index.json").read_text())
    edit(meta)
    (folder / "index.json").write_text(dumps_canonical(meta) + "\n")


def _edit_table(folder, edit) -> None:
    """Rewrite samples.npz columns and record the new file's size and sha256 in index.json (a
    consistent rewrite: only the shards' bytes can tell)."""
    cols = {k: v.copy() for k, v in read_npz(folder / "samples.npz").items()}
    meta = json.loads((folder / "index.json").read_text())
    edit(cols, meta)
    data = write_npz(cols)
    (folder / "samples.npz").write_bytes(data)
    meta["samples_file"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "index.json").write_text(dumps_canonical(meta) + "\n")


def _found(report, kind, pattern, shard=None):
    hits = [
        p
        for p in report.problems
        if p.kind == kind and re.search(pattern, p.message) and (shard is None or p.shard == shard)
    ]
    assert hits, (kind, pattern, report.to_text())
    return hits


def _bump(path, by):
    def edit(meta):
        *parents, last = path
        obj = meta
        for p in parents:
            obj = obj[p]
        obj[last] = obj[last] + by

    return edit


def _set(path, value):
    def edit(meta):
        *parents, last = path
        obj = meta
        for p in parents:
            obj = obj[p]
        obj[last] = value

    return edit


def _swap_shards(meta):
    meta["shards"][0], meta["shards"][1] = meta["shards"][1], meta["shards"][0]


# (edit of index.json, problem kind, message pattern naming the field, caught by --quick too)
INDEX_EDITS = {
    "samples": (_bump(["samples"], 1), "count", r"^samples is 31; samples.npz has 30$", True),
    "class_counts": (
        _bump(["class_counts", 0], 1),
        "count",
        r"^class_counts\[0\] \('a'\) is 11; samples.npz has 10 samples with label 0$",
        True,
    ),
    "splits.train.class_counts": (
        _set(["splits", "train", "class_counts", 1], 99),
        "count",
        r"^splits\.train\.class_counts\[1\] \('b'\) is 99; samples.npz has \d+",
        True,
    ),
    "splits.train.samples": (
        _set(["splits", "train", "samples"], 1),
        "count",
        r"^splits\.train\.samples is 1; samples.npz has 22 in its shards$",
        True,
    ),
    "splits.val.shards": (
        _set(["splits", "val", "shards"], 3),
        "count",
        r"^splits\.val\.shards is 3; shards lists 2 val shard\(s\)$",
        True,
    ),
    "classes order": (
        lambda m: m["classes"].reverse(),
        "class_name",
        r"^classes\[0\] is 'c', but the \.json of the 10 sample\(s\) with label 0 say 'a' "
        r"\(that is classes\[2\]: reordered\?\)$",
        True,
    ),
    "classes renamed": (
        _set(["classes", 1], "zebra"),
        "class_name",
        r"^classes\[1\] is 'zebra', but the \.json of the 10 sample\(s\) with label 1 say 'b'$",
        True,
    ),
    "classes duplicated": (
        _set(["classes", 1], "a"),
        "field",
        r"^classes\[1\] is 'a', the same name as classes\[0\]$",
        True,
    ),
    "mean": (
        _bump(["mean", 0], 0.01),
        "pixel_stats",
        r"^mean is \[[0-9., ]+\]; the pixels of split train give \[",
        r"^mean is .*; splits\.train\.mean/std \(stats_split is train\) give",
    ),
    "std": (
        _bump(["std", 2], -0.01),
        "pixel_stats",
        r"^std is \[[0-9., ]+\]; the pixels of split train give \[",
        r"^std is .*; splits\.train\.mean/std",
    ),
    "splits.val.mean": (
        _set(["splits", "val", "mean", 1], 0.5),
        "pixel_stats",
        r"^splits\.val\.mean is \[[0-9.]+, 0\.5, [0-9.]+\]; the pixels of its 2 shard\(s\) give",
        False,
    ),
    "splits.train.urls": (
        _set(["splits", "train", "urls"], "train-{000000..000009}.tar"),
        "urls",
        r"^splits\.train\.urls is 'train-\{000000\.\.000009\}\.tar', which names 10 file\(s\) .*; "
        r"the index lists 5 train shard\(s\), so expected 'train-\{000000\.\.000004\}\.tar'$",
        True,
    ),
    "size": (_set(["size"], 24), "image_size", r"^size is 24; every \.npy header says 16 px$", True),
    "sample.npy_shape": (
        _set(["sample", "npy_shape"], [24, 24, 3]),
        "image_size",
        r"^sample\.npy_shape is \[24, 24, 3\], size is 16: they disagree",
        True,
    ),
    "shard name": (
        _set(["shards", 1, "name"], "../../x.tar"),
        "shard_name",
        r"^shards\[1\]\.name is '\.\./\.\./x\.tar'; expected <split>-NNNNNN\.tar in the index's own "
        r"folder; it is not read$",
        True,
    ),
    "shards[].samples": (
        _set(["shards", 0, "samples"], 6),
        "count",
        r"^shards\[0\]\.samples \('train-000000\.tar'\) is 6; samples.npz has 5 for this shard$",
        True,
    ),
    "shards[].split": (
        _set(["shards", 0, "split"], "val"),
        "field",
        r"^shards\[0\]\.split is 'val', but its name train-000000\.tar puts it in split 'train'$",
        True,
    ),
    "shards[].sha256": (_set(["shards", 3, "sha256"], "0" * 64), "sha256", r"the index says 0000000000000000", False),
    "shards[].bytes": (
        _bump(["shards", 2, "bytes"], 512),
        "size",
        r"^truncated: 20,480 bytes, the index says 20,992$",
        True,
    ),
    "shard order": (
        _swap_shards,
        "field",
        r"^the train shards in shards are train-000001\.tar, train-000000\.tar",
        True,
    ),
    "samples_file.sha256": (
        _set(["samples_file", "sha256"], "0" * 64),
        "index",
        r"^sha256 [0-9a-f]{16}\.\.\., index\.json says 0000000000000000",
        False,
    ),
    "samples_file.name": (
        _set(["samples_file", "name"], "../samples.npz"),
        "shard_name",
        r"^samples_file\.name is '\.\./samples\.npz'; expected a file name",
        True,
    ),
    "stats_split": (_set(["stats_split"], "all"), "field", r"^stats_split is 'all'; expected 'train'", True),
    "errors_file": (
        _set(["errors_file"], "errors.jsonl"),
        "field",
        r"^errors_file names errors\.jsonl, which is not in ",
        True,
    ),
}


@pytest.mark.parametrize("what", list(INDEX_EDITS))
def test_each_edit_of_index_json_is_named(split_set, what):
    edit, kind, pattern, quick = INDEX_EDITS[what]
    assert verify(split_set).ok
    _edit_index(split_set, edit)
    r = verify(split_set)
    assert not r.ok
    _found(r, kind, pattern)
    q = verify(split_set, quick=True)
    if quick:
        _found(q, kind, pattern if quick is True else quick)
    else:  # --quick neither hashes nor reads pixels
        assert not [p for p in q.problems if p.kind == kind], q.to_text()


def test_a_shard_name_outside_the_folder_is_never_read(split_set, tmp_path):
    """``../../x.tar`` leads to a real shard: verify names the entry and opens nothing there."""
    outside = split_set.parent.parent / "x.tar"
    shutil.copy(split_set / "train-000001.tar", outside)
    _edit_index(split_set, _set(["shards", 1, "name"], "../../x.tar"))
    opened = _audit_opens()
    for quick in (False, True):
        opened.clear()
        r = verify(split_set, quick=quick)
        assert {p.kind for p in r.problems} == {"shard_name"}, r.to_text()
        assert r.shards == 6 and r.bad_shards == ["index.json"]
        assert any("train-000001.tar" in w for w in r.warnings)  # the real one, now unlisted
        assert opened and not [p for p in opened if os.path.basename(p) == "x.tar"], opened
    res = CliRunner().invoke(cli, ["verify", str(split_set)])
    assert res.exit_code == 3 and "shards[1].name is '../../x.tar'" in res.output and "Traceback" not in res.output


_OPENED: list | None = None


def _audit_opens() -> list:
    """Paths opened from now on (``sys.addaudithook``'s ``open`` event, installed once)."""
    global _OPENED
    if _OPENED is None:
        _OPENED = []

        def hook(event, args):
            if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
                _OPENED.append(os.fsdecode(args[0]))

        sys.addaudithook(hook)
    return _OPENED


def _relabel(cols, meta):
    i = 3
    old = int(cols["label"][i])
    new = (old + 1) % 3
    cols["label"][i] = new
    split = meta["shards"][int(cols["shard"][i])]["split"]
    for counts in (meta["class_counts"], meta["splits"][split]["class_counts"]):
        counts[old] -= 1
        counts[new] += 1


def _new_path(cols, meta):
    o = cols["path_offsets"]
    paths = [bytes(cols["path_data"][o[i] : o[i + 1]]).decode() for i in range(len(cols["key"]))]
    paths[10] = "elsewhere/s0010.jpg"
    cols["path_offsets"], cols["path_data"] = pack_strings(paths)


# (consistent rewrite of samples.npz, the row it names or None, kind, pattern, caught by --quick too)
TABLE_EDITS = {
    "label": (_relabel, 3, "label", r"^{key}\.cls: says \d, samples.npz label says \d$", True),
    "npy_xxh3": (
        lambda c, m: c["npy_xxh3"].__setitem__(4, 12345),
        4,
        "sample_data",
        r"^{key}\.npy: XXH3-64 [0-9a-f]{{16}}, samples.npz npy_xxh3 says 0000000000003039: the shard "
        r"matches its sha256, so samples.npz npy_xxh3 was changed$",
        False,
    ),
    "phash": (  # one bit of row 6's third hash: the pixels are as converted, the stored hash is not theirs
        lambda c, m: c["phash"].__setitem__((6, 2), c["phash"][6, 2] ^ np.uint64(1 << 40)),
        6,
        "phash",
        r"^{key}\.npy: its perceptual hashes, recomputed from its pixels \(as converted\), differ from "
        r"samples\.npz phash in 1 of 7 \(first: hash 2, [0-9a-f]{{16}} against [0-9a-f]{{16}}\): the column "
        r"was changed or made by another recipe \(docs/FORMAT\.md\)$",
        False,
    ),
    "fingerprint": (
        lambda c, m: c["fingerprint"].__setitem__(5, 7),
        5,
        "sample_meta",
        r"^{key}\.json: fingerprint is 'xxh3_128:[0-9a-f]{{32}}'; samples.npz fingerprint says "
        r"xxh3_128:(07){{16}}$",
        True,
    ),
    "width": (
        lambda c, m: c["width"].__setitem__(6, 1),
        6,
        "sample_meta",
        r"^{key}\.json: width is 96; samples.npz width says 1$",
        True,
    ),
    "height": (
        lambda c, m: c["height"].__setitem__(6, 5),
        6,
        "sample_meta",
        r"^{key}\.json: height is 72; samples.npz height says 5$",
        True,
    ),
    "path": (
        _new_path,
        10,
        "sample_meta",
        r"^{key}\.json: source_path is 'img/s\d+\.jpg'; samples.npz path_data "
        r"says 'elsewhere/s0010\.jpg'$",
        True,
    ),
    "key": (
        lambda c, m: c["key"].__setitem__(7, b"zzzzz"),
        None,
        "missing_member",
        r"^zzzzz\.npy is in the index but not in the tar$",
        True,
    ),
    "npy_offset": (
        lambda c, m: c["npy_offset"].__setitem__(8, c["npy_offset"][8] + 512),
        None,
        "member_offset",
        r"^1 member\(s\) are not where the index says; first \w+\.npy: data at [\d,]+ \(896 B\)",
        True,
    ),
    "shard": (
        lambda c, m: c["shard"].__setitem__(9, 3),
        None,
        "column",
        r"^rows are not in shard order \(1 step\(s\) back, first at row 10\)",
        True,
    ),
    "npy_length": (
        lambda c, m: c["npy_length"].__setitem__(11, 100),
        None,
        "image_size",
        r"^npy_length is 100 \(first: row 11\); size 16 needs 128 \+ 3·16² = 896$",
        True,
    ),
    "duplicate key": (
        lambda c, m: c["key"].__setitem__(7, c["key"][20]),
        None,
        "duplicate_key",
        r"^key \w+ is in the index 2 times \(train-000001\.tar, train-000004\.tar\)$",
        True,
    ),
    "label dtype": (
        lambda c, m: c.__setitem__("label", c["label"].astype("<i8")),
        None,
        "column",
        r"^column 'label' is <i8 \[30\]; expected <i4 \[30\]$",
        True,
    ),
    "missing column": (lambda c, m: c.pop("width"), None, "column", r"^samples.npz has no column 'width'$", True),
}


@pytest.mark.parametrize("what", list(TABLE_EDITS))
def test_each_consistent_rewrite_of_samples_npz_is_caught_by_the_shard_bytes(split_set, what):
    edit, row, kind, pattern, quick = TABLE_EDITS[what]
    key = read_npz(split_set / "samples.npz", ["key"])["key"][row].decode() if row is not None else None
    _edit_table(split_set, edit)
    pattern = pattern.format(key=key)
    if what == "phash":  # recomputed only when asked (verify --phash): it about doubles a full verify's time
        assert verify(split_set).ok and verify(split_set, phash=True, quick=True).ok
    for mode in (False, True) if quick else (False,):
        r = verify(split_set, quick=mode, phash=what == "phash")
        hits = _found(r, kind, pattern)
        if key is not None:
            assert {p.key for p in hits} == {key} and r.bad_samples == [key], r.to_text()
    if not quick:
        assert verify(split_set, quick=True).ok  # --quick does not read the pixels
    unmatched = [w for w in r.warnings if "rows could not be matched to the shards" in w]
    assert bool(unmatched) == (what == "label dtype"), r.warnings  # a row column unusable: no row is compared


# (path in index.json, value or DELETE, pattern of the field problem)
DELETE = object()
TYPED = [
    (["samples"], "30", r"^samples is '30' \(str\); expected a count \(an integer >= 0\)$"),
    (["classes"], None, r"^classes is None \(NoneType\); expected a list of strings$"),
    (["shards"], {}, r"^shards is \{\} \(dict\); expected a list$"),
    (["shards", 0], "x", r"^shards\[0\] is 'x' \(str\); expected an object"),
    (["shards", 0, "bytes"], "12", r"^shards\[0\]\.bytes is '12' \(str\); expected a count"),
    (["shards", 0, "sha256"], 12, r"^shards\[0\]\.sha256 is 12 \(int\); expected 64 lowercase hex digits$"),
    (["shards", 1, "name"], DELETE, r"^shards\[1\]\.name is None; expected <split>-NNNNNN\.tar"),
    (["shards", 1, "samples"], DELETE, r"^shards\[1\]\.samples is missing; expected a count"),
    (["splits"], [], r"^splits is \[\] \(list\); expected an object$"),
    (["splits", "train"], 5, r"^splits\.train is 5 \(int\); expected an object"),
    (["splits", "val", "urls"], None, r"^splits\.val\.urls is None \(NoneType\); expected a string$"),
    (
        ["splits", "train", "class_counts"],
        ["a"],
        r"^splits\.train\.class_counts is \['a'\] \(list\); expected a list "
        r"of counts$",
    ),
    (["mean"], [0.1, 0.2], r"^mean is \[0\.1, 0\.2\] \(list\); expected three numbers in \[0, 1\]"),
    (["std"], [0.1, 2, 0.3], r"^std is \[0\.1, 2, 0\.3\] \(list\); expected three numbers in \[0, 1\]"),
    (["size"], "16", r"^size is '16' \(str\); expected an integer >= 1$"),
    (["sample"], DELETE, r"^sample is missing; expected an object$"),
    (["class_counts"], DELETE, r"^class_counts is missing; expected a list of counts$"),
    (["samples_file"], "x", r"^samples_file is 'x' \(str\); expected an object$"),
    (["samples_file", "bytes"], -1, r"^samples_file\.bytes is -1 \(int\); expected a count"),
    (["errors_file"], DELETE, r"^errors_file is missing; expected null or 'errors\.jsonl'$"),
]


@pytest.mark.parametrize("path, value, pattern", TYPED, ids=[".".join(map(str, t[0])) for t in TYPED])
def test_a_missing_or_mistyped_field_is_a_named_problem(split_set, path, value, pattern):
    def edit(meta):
        *parents, last = path
        obj = meta
        for p in parents:
            obj = obj[p]
        if value is DELETE:
            del obj[last]
        else:
            obj[last] = value

    _edit_index(split_set, edit)
    for quick in (False, True):
        r = verify(split_set, quick=quick)
        hits = [p for p in r.problems if re.search(pattern, p.message)]
        assert hits and hits[0].shard == "index.json" and hits[0].kind in ("field", "shard_name"), r.to_text()
    res = CliRunner().invoke(cli, ["verify", str(split_set), "--json"])
    assert res.exit_code == 3 and "Traceback" not in res.output, res.output
    assert any(re.search(pattern, p["message"]) for p in json.loads(res.stdout)["problems"])


# ------------------------------------------------------------------ the fast paths against plain references


def _reference_bad_samples(folder) -> set[str]:
    """Slow and plain: every row of samples.npz (np.load) against its shard read with tarfile."""
    meta = json.loads((folder / "index.json").read_text())
    cols = read_npz(folder / "samples.npz")
    bad = set()
    for pos, s in enumerate(meta["shards"]):
        with tarfile.open(folder / s["name"]) as tf:
            members = {m.name: (m.offset_data, tf.extractfile(m).read()) for m in tf.getmembers()}
        for i in np.flatnonzero(cols["shard"] == pos):
            key = cols["key"][i].decode()
            got = {ext: members.get(f"{key}.{ext}") for ext in ("cls", "i32", "json", "npy")}
            if any(
                got[ext] is None
                or got[ext][0] != cols[f"{ext}_offset"][i]
                or len(got[ext][1]) != cols[f"{ext}_length"][i]
                for ext in got
            ):
                bad.add(key)
                continue
            info = json.loads(got["json"][1])
            o = cols["path_offsets"]
            path = bytes(cols["path_data"][o[i] : o[i + 1]]).decode()
            if (
                got["cls"][1] != str(int(cols["label"][i])).encode()
                or got["i32"][1] != int(cols["label"][i]).to_bytes(4, "little", signed=True)
                or (info["dataset_version"], info["classes_digest"])
                != (meta["dataset_version"], meta["classes_digest"])
                or xxhash.xxh3_64_intdigest(got["npy"][1]) != int(cols["npy_xxh3"][i])
                or info["key"] != key
                or info["label"] != meta["classes"][int(cols["label"][i])]
                or info["fingerprint"] != "xxh3_128:" + cols["fingerprint"][i].tobytes().hex()
                or (info["width"], info["height"]) != (int(cols["width"][i]), int(cols["height"][i]))
                or info["source_path"] != path
            ):
                bad.add(key)
    return bad


@settings(max_examples=12, deadline=None)
@given(
    edits=st.lists(
        st.tuples(st.sampled_from(["label", "npy_xxh3", "fingerprint", "width", "height", "path"]), st.integers(0, 29)),
        min_size=1,
        max_size=4,
        unique=True,
    )
)  # no edit undone
def test_bad_samples_match_a_tarfile_reference(two_splits, tmp_path_factory, edits):
    """Random consistent rewrites of samples.npz: verify (default options) names exactly the samples a
    tarfile-based reference finds."""
    folder = shutil.copytree(two_splits, tmp_path_factory.mktemp("ref") / "set")

    def edit(cols, meta):
        for column, row in edits:
            if column == "label":
                cols["label"][row] = (cols["label"][row] + 1) % 3
            elif column == "npy_xxh3":
                cols["npy_xxh3"][row] ^= 1
            elif column == "fingerprint":
                cols["fingerprint"][row, 0] ^= 0xFF
            elif column in ("width", "height"):
                cols[column][row] += 1
            else:
                o = cols["path_offsets"]
                paths = [bytes(cols["path_data"][o[i] : o[i + 1]]).decode() for i in range(len(cols["key"]))]
                paths[row] = "moved/" + paths[row]
                cols["path_offsets"], cols["path_data"] = pack_strings(paths)

    _edit_table(folder, edit)
    expected = _reference_bad_samples(folder)
    assert expected
    assert set(verify(folder).bad_samples) == expected


def test_columns_read_by_row_ranges_match_numpy_load(two_splits, bucket, serve_http):
    """SampleColumns (ZIP entries found once, rows by positioned or ranged reads) against np.load."""
    fs, url = bucket
    s3 = upload(fs, two_splits, f"{url}/v1/16")
    web = serve_http(two_splits, ranges=True)
    whole = read_npz(two_splits / "samples.npz")
    rng = np.random.default_rng(0)
    for where in (
        str(two_splits / "samples.npz"),
        f"{s3}/samples.npz",
        f"{web}/samples.npz",
        f"{serve_http(two_splits)}/samples.npz",
    ):
        table = SampleColumns(where, "samples.npz")
        rows, usable = table.check_format()
        assert rows == 30 and not table.problems and usable == set(whole)
        for _ in range(5):
            a = int(rng.integers(0, 30))
            b = int(rng.integers(a, 31))
            names = [n for n in whole if n not in ("path_offsets", "path_data")]
            got = table.read(names, a, b)
            for n in names:
                assert np.array_equal(got[n], whole[n][a:b]), (where, n, a, b)
        assert np.array_equal(table.read(["path_data"], 3, 40)["path_data"], whole["path_data"][3:40])
        table.close()


def test_verify_recomputes_the_converters_mean_and_std_exactly(two_splits, tmp_path, monkeypatch):
    """The pixel sums of a full verify give index.json's mean/std to the last digit (the tolerance is
    for hand-built indexes): checked by making the tolerance zero."""
    import wds_tools.inspect.verify.totals as vm

    monkeypatch.setattr(vm, "STATS_TOLERANCE", 0.0)
    assert verify(two_splits).ok
    edited = shutil.copytree(two_splits, tmp_path / "exact")
    _edit_index(edited, _bump(["splits", "val", "std", 0], 1e-6))
    _found(verify(edited), "pixel_stats", r"^splits\.val\.std is ")


def test_no_stats_skips_the_pixel_sums_only(split_set):
    """stats=False (--no-stats): mean/std are not recomputed, so an edit of splits.val.mean passes, with a
    warning saying so; the top-level mean is still compared with splits.train's, and all else is checked."""
    _edit_index(split_set, _set(["splits", "val", "mean", 1], 0.5))
    assert not verify(split_set).ok
    r = verify(split_set, stats=False)
    assert r.ok and any("mean/std not recomputed from the pixels" in w for w in r.warnings)
    _edit_index(split_set, _bump(["mean", 0], 0.01))
    _edit_table(split_set, lambda c, m: c["npy_xxh3"].__setitem__(4, 12345))
    r = verify(split_set, stats=False)
    _found(r, "pixel_stats", r"^mean is .*; splits\.train\.mean/std \(stats_split is train\) give")
    _found(r, "sample_data", r"samples.npz npy_xxh3 was changed$")
    res = CliRunner().invoke(cli, ["verify", str(split_set), "--no-stats", "--json"])
    assert res.exit_code == 3 and {p["kind"] for p in json.loads(res.stdout)["problems"]} == {
        "pixel_stats",
        "sample_data",
    }


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 10**12)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["../../x.tar", "/etc/passwd", "train-000000.tar"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_damage_to_index_json_is_a_report_never_a_traceback(two_splits, tmp_path_factory, data):
    """Random values (or deletions) anywhere in index.json: verify returns a report, full and quick."""
    folder = shutil.copytree(two_splits, tmp_path_factory.mktemp("fuzz") / "set")
    meta = json.loads((folder / "index.json").read_text())
    paths = [p for p in _paths(meta) if p and p[0] not in ("format", "format_version")]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        obj = meta
        try:
            for p in path[:-1]:
                obj = obj[p]
            if data.draw(st.booleans()) and isinstance(obj, dict):
                del obj[path[-1]]
            else:
                obj[path[-1]] = data.draw(_JSON)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced the parent
    (folder / "index.json").write_text(json.dumps(meta))
    opened = _audit_opens()
    opened.clear()
    for quick in (False, True):
        r = verify(folder, quick=quick)
        assert isinstance(r.to_text(), str) and json.dumps(r.to_dict())
    assert not [p for p in opened if os.path.basename(p) in ("x.tar", "passwd")], opened


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_damage_to_samples_npz_columns_is_a_report_never_a_traceback(two_splits, tmp_path_factory, data):
    """Random dtypes, shapes, lengths and values of samples.npz columns (the index hash updated)."""
    folder = shutil.copytree(two_splits, tmp_path_factory.mktemp("fuzz") / "set")
    names = sorted(read_npz(folder / "samples.npz"))

    def edit(cols, meta):
        for _ in range(data.draw(st.integers(1, 3))):
            name = data.draw(st.sampled_from(names))
            if name not in cols:
                continue
            a = cols[name]
            how = data.draw(st.sampled_from(["drop", "dtype", "rows", "values", "shape"]))
            if how == "drop":
                del cols[name]
            elif how == "dtype":
                dtype = data.draw(st.sampled_from(["<i8", "<u2", "<f4", "|S3", "<i4"]))
                cols[name] = a.astype(dtype) if a.dtype.kind != "S" else np.zeros(a.shape, dtype)
            elif how == "rows":
                cols[name] = a[: data.draw(st.integers(0, len(a) + 2))]
            elif how == "values" and a.dtype.kind in "iu" and a.size:
                flat = a.reshape(-1).copy()
                flat[data.draw(st.integers(0, flat.size - 1))] = data.draw(st.integers(0, 255))
                cols[name] = flat.reshape(a.shape)
            elif how == "shape" and a.size:
                cols[name] = a.reshape(-1, 1) if a.ndim == 1 else a.reshape(-1)

    _edit_table(folder, edit)
    for quick in (False, True):
        r = verify(folder, quick=quick)
        assert isinstance(r.to_text(), str) and json.dumps(r.to_dict())


def test_a_missing_or_foreign_samples_npz_is_named(split_set):
    (split_set / "samples.npz").unlink()
    r = verify(split_set)
    _found(r, "index", r"samples\.npz does not exist$", shard="samples.npz")
    assert any("rows could not be matched" in w for w in r.warnings)
    assert r.shards == 7 and not [p for p in r.problems if p.shard.endswith(".tar")]  # the shards still checked
    (split_set / "samples.npz").write_bytes(b"not a zip file at all" * 100)
    _edit_index(split_set, lambda m: m["samples_file"].update(bytes=2100))
    _found(verify(split_set, quick=True), "index", r"samples\.npz is not a readable \.npz \(ZIP\) file")


# ------------------------------------------------------------------ metadata (format version 2)


@pytest.fixture(scope="module")
def ham_set(tmp_path_factory):
    """A HAM10000-shaped set converted with --group lesion_id: 24 samples of 10 lesions, train and val."""
    from conftest import write_ham

    from wds_tools.convert import convert

    root = tmp_path_factory.mktemp("ham")
    manifest = write_ham(root / "c", [3, 1, 2, 4, 1, 1, 2, 3, 1, 2, 4])
    convert(
        manifest,
        version="v1",
        size=16,
        out=root / "out",
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        group="lesion_id",
        val_fraction=0.3,
        shard_size=5,
        workers=1,
        progress=False,
    )
    return root / "out" / "v1" / "16"


@pytest.fixture
def ham(ham_set, tmp_path):
    return shutil.copytree(ham_set, tmp_path / "ham")


def _meta_edit(i_col, row, value):
    def edit(cols, meta):
        cols[i_col] = cols[i_col].copy()
        cols[i_col][row] = value

    return edit


# (consistent rewrite of a metadata column, the row it names, pattern)
META_EDITS = {
    "string code": (
        _meta_edit("meta4", 2, 0),
        2,
        r"^{key}\.json: meta is \{.*\}; samples.npz's metadata columns say "
        r"\{.*\"localization\": \"back\".*\}$",
    ),
    "float": (
        _meta_edit("meta2", 3, 99.5),
        3,
        r"^{key}\.json: meta is .*; samples.npz's metadata columns say "
        r"\{\"age\": 99\.5, .*\}$",
    ),
    "float missing": (_meta_edit("meta2", 0, np.nan), 0, r"metadata columns say \{\"age\": null, "),
}


@pytest.mark.parametrize("what", list(META_EDITS))
def test_a_consistent_rewrite_of_a_metadata_column_is_caught_by_the_json(ham, what):
    assert verify(ham).ok and verify(ham, quick=True).ok
    edit, row, pattern = META_EDITS[what]
    key = read_npz(ham / "samples.npz", ["key"])["key"][row].decode()
    _edit_table(ham, edit)
    for quick in (False, True):
        r = verify(ham, quick=quick)
        hits = _found(r, "sample_meta", pattern.replace("{key}", key))
        assert {p.key for p in hits} == {key} and r.bad_samples == [key], r.to_text()


def test_metadata_column_values_out_of_the_format_are_named(ham):
    _edit_table(ham, _meta_edit("meta0", 1, 99))  # a string code past the lesion values
    _found(
        verify(ham),
        "column",
        r"^row 1: meta0 \(metadata 'lesion_id'\) is 99, not -1 \(missing\) or a value "
        r"0\.\.10$",
    )
    _edit_table(ham, lambda c, m: c.__setitem__("meta2", c["meta2"].astype("<f4")))
    _found(verify(ham, quick=True), "column", r"^column 'meta2' \(metadata 'age'\) is <f4 \[24\]; expected <f8 \[24\]$")
    _edit_table(ham, lambda c, m: c.pop("meta3_data"))
    _found(
        verify(ham, quick=True),
        "column",
        r"^samples.npz has no column 'meta3_data' \(metadata column 'sex', "
        r"string\)$",
    )


def test_a_group_in_two_splits_is_named(ham):
    assert not [p for p in verify(ham).problems if p.kind == "group_split"]
    _edit_index(ham, lambda m: m["build"].__setitem__("group", "sex"))  # sex straddles the splits
    r = verify(ham, quick=True)
    hits = _found(
        r,
        "group_split",
        r"^group 'female' of column 'sex' \(build\.group\) is in 2 splits: train \(\d+ "
        r"samples?\), val \(\d+ samples?\)$",
        shard="index.json",
    )
    assert len(hits) == 1 and not r.ok
    res = CliRunner().invoke(cli, ["verify", str(ham), "--quick"])
    assert res.exit_code == 3 and "group_split" in res.output


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (
            lambda m: m["metadata"][2].__setitem__("type", "date"),
            r"^metadata\[2\] is .*; expected \{name: a non-empty "
            r"string, type: int \| float \| string\}$",
        ),
        (lambda m: m["metadata"].append(dict(m["metadata"][0])), r"^metadata\[5\] names column 'lesion_id' again$"),
        (lambda m: m.__setitem__("metadata", {"a": 1}), r"^metadata is dict; expected a list of \{name, type\}$"),
        (
            lambda m: m["build"].__setitem__("group", "lesion"),
            r"^build\.group is 'lesion', which is not a column of "
            r"metadata$",
        ),
    ],
)
def test_a_damaged_metadata_field_is_named(ham, edit, pattern):
    _edit_index(ham, edit)
    _found(verify(ham, quick=True), "field", pattern, shard="index.json")


def test_meta_in_the_json_but_no_metadata_in_the_index_is_named(ham):
    _edit_index(ham, lambda m: m.pop("metadata"))
    r = verify(ham, quick=True)
    hits = [p for p in r.problems if p.kind == "sample_meta"]
    assert len(r.bad_samples) == 24 and all("but index.json lists no metadata columns" in p.message for p in hits)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_any_damage_to_metadata_columns_is_a_report_never_a_traceback(ham_set, tmp_path_factory, data):
    folder = shutil.copytree(ham_set, tmp_path_factory.mktemp("fuzz") / "set")
    names = sorted(n for n in read_npz(folder / "samples.npz") if n.startswith("meta"))

    def edit(cols, meta):
        for _ in range(data.draw(st.integers(1, 3))):
            name = data.draw(st.sampled_from(names))
            if name not in cols:
                continue
            a = cols[name]
            how = data.draw(st.sampled_from(["drop", "dtype", "rows", "values"]))
            if how == "drop":
                del cols[name]
            elif how == "dtype":
                cols[name] = a.astype(data.draw(st.sampled_from(["<i8", "<u2", "<f4", "<i4", "|b1"])))
            elif how == "rows":
                cols[name] = a[: data.draw(st.integers(0, len(a) + 2))]
            elif a.size:
                flat = a.reshape(-1).copy()
                flat[data.draw(st.integers(0, flat.size - 1))] = data.draw(st.integers(0, 255))
                cols[name] = flat
        if data.draw(st.booleans()):
            meta["metadata"][data.draw(st.integers(0, 4))]["type"] = data.draw(
                st.sampled_from(["int", "float", "string"])
            )

    _edit_table(folder, edit)
    for quick in (False, True):
        r = verify(folder, quick=quick)
        assert isinstance(r.to_text(), str) and json.dumps(r.to_dict())


# ------------------------------------------------------------------ format version 2: .i32 and the dataset fields


def _edit_member(folder, ext: str, edit) -> str:
    """Rewrite the data of the first sample's ``.<ext>`` member of train-000000.tar with ``edit``
    (same length: nothing moves); returns the sample's key."""
    keys = []

    def change(ms):
        for i, (info, data) in enumerate(ms):
            if info.name.endswith(f".{ext}"):
                new = edit(data)
                assert len(new) == len(data)
                ms[i] = (info, new)
                keys.append(info.name.split(".")[0])
                return ms
        raise AssertionError(f"no .{ext} member")

    rewrite_tar(folder / "train-000000.tar", change)
    return keys[0]


@pytest.mark.parametrize("quick", [False, True])
def test_an_i32_member_that_disagrees_with_the_label_is_named(split_set, quick):
    key = _edit_member(split_set, "i32", lambda d: (int.from_bytes(d, "little") + 1).to_bytes(4, "little"))
    hits = _found(
        verify(split_set, quick=quick),
        "label",
        rf"^{key}\.i32: holds \d+, samples\.npz label says \d+ "
        r"\(the int32 must equal the \.cls and the label\)$",
        shard="train-000000.tar",
    )
    assert [h.key for h in hits] == [key]


def test_a_sample_of_another_dataset_version_is_named(split_set):
    version = json.loads((split_set / "index.json").read_text())["dataset_version"]
    other = version[:-1] + chr(ord(version[-1]) + 1)
    key = _edit_member(
        split_set,
        "json",
        lambda d: d.replace(f'"dataset_version":"{version}"'.encode(), f'"dataset_version":"{other}"'.encode()),
    )
    _found(
        verify(split_set, quick=True),
        "sample_meta",
        rf"^{key}\.json: dataset_version is '{other}'; index\.json's "
        rf"is '{version}' \(a sample of another dataset\?\)$",
    )


def test_a_json_without_a_field_every_sample_has_is_named(split_set):
    key = _edit_member(split_set, "json", lambda d: d.replace(b'"original_key"', b'"originalXkey"'))
    r = verify(split_set, quick=True)
    _found(
        r,
        "sample_meta",
        rf"^{key}\.json: every sample of a conversion has the same \.json fields; missing "
        r"original_key; extra originalXkey$",
    )
    assert r.bad_samples == [key]


def test_a_wrong_classes_digest_in_the_index_is_named(split_set):
    _edit_index(split_set, lambda m: m.__setitem__("classes_digest", "0" * 16))
    _found(
        verify(split_set, quick=True),
        "field",
        r"^classes_digest is '0{16}'; the classes' digest is '[0-9a-f]{16}'",
        shard="index.json",
    )


def test_cli_verify_phash_rechecks_the_perceptual_hashes_only_when_asked(split_set):
    """`verify --phash`: a stored hash that is not its pixels' fails (exit 3); plain verify does not look.
    On the intact set the recheck (verify/rehash.py, the members of a shard read) agrees with every hash the
    converter stored (a batch of samples at a time)."""
    intact = CliRunner().invoke(cli, ["verify", str(split_set), "--phash", "-q"])
    assert intact.exit_code == 0, intact.output
    _edit_table(split_set, TABLE_EDITS["phash"][0])
    plain = CliRunner().invoke(cli, ["verify", str(split_set), "-q"])
    asked = CliRunner().invoke(cli, ["verify", str(split_set), "--phash", "-q"])
    assert plain.exit_code == 0, plain.output
    assert asked.exit_code == 3 and "phash" in asked.output, asked.output


def test_a_phash_recheck_that_cannot_run_says_so(split_set, tmp_path):
    """--phash (and --no-leakage) asked where they cannot run end in a warning, not a silent OK: a quick
    verify reads no pixels, a scan reads no index, a version 2 index has no phash column."""
    import base64
    from pathlib import Path

    quick = verify(split_set, quick=True, phash=True)
    assert quick.ok and any("--phash): a quick verify reads no pixels" in w for w in quick.warnings)
    scan = verify(split_set, scan=True, phash=True, no_leakage=True)
    assert [w for w in scan.warnings if "a scan does not read" in w] == [
        "--phash needs the index, which a scan does not read: not checked",
        "--no-leakage needs the index, which a scan does not read: not checked",
    ]
    two = tmp_path / "v2"
    two.mkdir()
    for p in (Path(__file__).parent / "golden" / "format-v2").iterdir():
        data = p.read_bytes()
        (two / p.name.removesuffix(".b64")).write_bytes(base64.decodebytes(data) if p.name.endswith(".b64") else data)
    old = verify(two, phash=True)
    assert old.ok and any("samples.npz has no usable phash column" in w for w in old.warnings), old.warnings
    full = verify(split_set, phash=True)
    assert full.ok and not any("--phash" in w for w in full.warnings)
    r = CliRunner().invoke(cli, ["verify", str(two), "--phash", "--json"])
    assert r.exit_code == 0 and any("no usable phash column" in w for w in json.loads(r.stdout)["warnings"])


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("label", 7, r"1 label\(s\) are not a class index 0\.\.2 \(first: row 5, 7\)"),
        ("shard", 9, r"1 row\(s\) name a shard position past the 7 in index\.json \(first: row 5\)"),
    ],
)
def test_verify_and_the_readers_name_a_row_outside_the_index_alike(split_set, column, value, message):
    """A consistent rewrite of samples.npz (its hash recorded) with one row's label past the 3 classes, or its
    shard past the 7 shards: verify reports it by the rule the readers refuse it by (format.index.RowCheck),
    in the same words; stats refuses it too."""
    from wds_tools.format.index import open_index, read_sample_table
    from wds_tools.inspect.stats import compute_stats

    _edit_table(split_set, lambda cols, meta: cols[column].__setitem__(5, value))
    r = verify(split_set, quick=True)
    assert not r.ok
    _found(r, "label" if column == "label" else "column", "^" + message + "$")
    with pytest.raises(IndexFormatError, match=r"samples\.npz: " + message):
        read_sample_table(*open_index(split_set), ("label", "shard"))
    with pytest.raises(IndexFormatError, match=message):
        compute_stats(split_set)
