import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import convert_images, upload
from shardkit import build_dataset, copy_tars, member, rewrite_tar
from wds_tools.cli import cli
from wds_tools.errors import IndexFormatError
from wds_tools.format.index import load_index
from wds_tools.inspect.verify import PROBLEM_KINDS, SCHEMA, verify


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
    return s.keys[rows[i]], {m: (int(s[f"{m}_offset"][rows[i]]), int(s[f"{m}_length"][rows[i]]))
                             for m in ("cls", "json", "npy")}


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
    header = data[off:off + 128]
    assert b"(32, 32, 3)" in header
    p.write_bytes(data[:off] + header.replace(b"(32, 32, 3)", b"(32, 96, 1)") + data[off + 128:])
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
    assert bad.exit_code == 1 and "train-000001.tar [missing]" in bad.output and "Traceback" not in bad.output
    res = runner.invoke(cli, ["verify", str(shards), "--json", "--quick"])
    assert res.exit_code == 1
    d = json.loads(res.stdout)
    assert d["schema"] == SCHEMA == "wds-tools-verify/1"
    assert set(d) == {"schema", "path", "root", "index", "mode", "ok", "shards", "samples", "bytes",
                      "bytes_read", "seconds", "read_mb_per_s", "bad_shards", "bad_samples", "problems",
                      "warnings"}
    assert d["ok"] is False and d["mode"] == "quick" and d["bad_shards"] == ["train-000001.tar"]
    assert set(d["problems"][0]) == {"shard", "kind", "message", "key", "offset"}
    res = runner.invoke(cli, ["verify", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "no such shards folder" in res.output


# ------------------------------------------------------------------ object storage and http

def _where_independent(report) -> dict:
    """A report's dict without what names the place it was read from (the folder in messages too)."""
    d = report.to_dict()
    problems = [{**p, "message": p["message"].replace(d["root"], "ROOT")} for p in d["problems"]]
    return {k: v for k, v in d.items() if k not in ("path", "root", "index", "seconds", "read_mb_per_s")} | {
        "problems": problems}



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
        assert _where_independent(verify(f"{web}/{pattern}", scan=True, quick=quick)) == \
            _where_independent(verify(str(bare / pattern), scan=True, quick=quick))
    missing = verify(f"{web}/train-{{000000..000001}}.tar", scan=True)
    assert _kinds(missing, "train-000000.tar") == {"missing"}


def test_cli_reads_urls(damaged, bucket):
    shards, _ = damaged
    fs, url = bucket
    s3 = upload(fs, shards, f"{url}/v1/32")
    res = CliRunner().invoke(cli, ["verify", s3, "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["root"] == s3
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
