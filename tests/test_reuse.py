"""Incremental conversion: a new version copies what its base already holds."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import make_images, write_manifest
from wds_tools.convert import convert
from wds_tools.errors import OptionError
from wds_tools.format.index import load_index
from wds_tools.synth import jpeg_bytes, photo_like


def _convert(manifest, out, version, **kw):
    kw.setdefault("shard_size", 7)
    kw.setdefault("workers", 1)
    kw.setdefault("val_fraction", 0.2)
    return convert(manifest, version=version, size=32, out=out, progress=False, **kw)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _index_without_base(folder: Path) -> dict:
    meta = json.loads((folder / "index.json").read_text())
    meta["build"].pop("base")
    meta.pop("dataset_version")
    return meta


@pytest.fixture
def v1(tmp_path):
    """30 JPEGs converted as v1 under tmp_path/out; returns (root, rows, out)."""
    root = tmp_path / "c"
    rows = make_images(root, 30)
    _convert(write_manifest(root / "v1.csv", rows), tmp_path / "out", "v1")
    return root, rows, tmp_path / "out"


def _edit(root: Path, rows: list[dict], *, add=0, remove=0, replace=0, relabel=0) -> list[dict]:
    """A v2 manifest: the first `remove` rows dropped, the next `replace` rows given new bytes,
    the next `relabel` rows given another label, and `add` new images appended."""
    rows = [dict(r) for r in rows]
    out = rows[remove:]
    for r in out[:replace]:
        r["path"] = r["path"].replace(".jpg", "_v2.jpg")
        (root / r["path"]).write_bytes(jpeg_bytes(photo_like(96, 72, seed=10_000 + int(r["key"][1:]))))
    for r in out[replace:replace + relabel]:
        r["label"] = {"a": "b", "b": "c", "c": "a"}[r["label"]]
    for i in range(add):
        rel = f"img/new{i}.jpg"
        (root / rel).write_bytes(jpeg_bytes(photo_like(96, 72, seed=20_000 + i)))
        out.append({"key": f"new{i}", "path": rel, "label": "abc"[i % 3]})
    return out


def _assert_same_as_fresh(manifest, out, tmp_path, version="v2"):
    fresh = _convert(manifest, tmp_path / "fresh", version, reuse=False)
    inc_dir, fresh_dir = Path(out) / version / "32", Path(fresh.out_dir)
    a, b = _files(inc_dir), _files(fresh_dir)
    assert sorted(a) == sorted(b)
    for name in a:
        if name != "index.json":
            assert a[name] == b[name], f"{name} differs from a fresh conversion"
    assert _index_without_base(inc_dir) == _index_without_base(fresh_dir)


def test_mixed_changes_decode_only_what_changed(v1, tmp_path):
    root, rows, out = v1
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "v1/32").iterdir()}
    manifest = write_manifest(root / "v2.csv", _edit(root, rows, add=3, remove=2, replace=2, relabel=2))
    res = _convert(manifest, out, "v2")
    assert res.base == "v1"
    assert (res.decoded, res.relabeled, res.removed, res.failed) == (5, 2, 2, 0)
    assert res.reused == 31 - 5 - 2 and res.samples_written == 31
    assert res.reuse_problems == []
    assert load_index(res.out_dir).meta["build"]["base"] == "v1"
    _assert_same_as_fresh(manifest, out, tmp_path)
    # v1 is untouched and still loads
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "v1/32").iterdir()} == before
    assert len(load_index(out / "v1/32").samples) == 30


@pytest.mark.parametrize("change, expected", [
    ({"add": 2}, {"decoded": 2, "relabeled": 0, "removed": 0, "reused": 30}),
    ({"remove": 3}, {"decoded": 0, "relabeled": 0, "removed": 3, "reused": 27}),
    ({"replace": 2}, {"decoded": 2, "relabeled": 0, "removed": 0, "reused": 28}),
    ({"relabel": 4}, {"decoded": 0, "relabeled": 4, "removed": 0, "reused": 26}),
])
def test_each_kind_of_change_alone(v1, tmp_path, change, expected):
    root, rows, out = v1
    manifest = write_manifest(root / "v2.csv", _edit(root, rows, **change))
    res = _convert(manifest, out, "v2")
    assert {k: getattr(res, k) for k in expected} == expected
    _assert_same_as_fresh(manifest, out, tmp_path)


def test_dry_run_writes_nothing_and_reports_the_plan(v1, tmp_path):
    root, rows, out = v1
    manifest = write_manifest(root / "v2.csv", _edit(root, rows, add=1, remove=1, replace=1, relabel=1))
    plan = _convert(manifest, out, "v2", dry_run=True)
    assert not (out / "v2").exists()
    assert (plan.decoded, plan.relabeled, plan.removed, plan.reused) == (2, 1, 1, 27)
    assert plan.dry_run and plan.samples_written == 0 and plan.shards >= 4
    real = _convert(manifest, out, "v2")
    assert (real.decoded, real.relabeled, real.removed, real.reused) == (2, 1, 1, 27)
    assert real.shards == plan.shards


def test_no_reuse_decodes_everything(v1):
    root, rows, out = v1
    manifest = write_manifest(root / "v2.csv", rows)
    res = _convert(manifest, out, "v2", reuse=False)
    assert res.base is None and res.decoded == 30 and res.reused == 0
    with pytest.raises(OptionError, match="--from and --no-reuse"):
        _convert(manifest, out, "v3", reuse=False, base="v1")


def test_corrupt_base_shard_is_decoded_again_and_reported(v1, tmp_path):
    root, rows, out = v1
    idx = load_index(out / "v1/32")
    s = idx.samples
    victim = 5
    shard = out / "v1/32" / idx.shards[int(s["shard"][victim])]["name"]
    data = bytearray(shard.read_bytes())
    data[int(s["npy_offset"][victim]) + 200] ^= 0xFF  # one flipped pixel byte
    shard.write_bytes(bytes(data))
    gone = out / "v1/32" / idx.shards[-1]["name"]  # and another shard lost entirely
    lost = idx.shards[-1]["samples"]
    gone.unlink()
    manifest = write_manifest(root / "v2.csv", rows)
    res = _convert(manifest, out, "v2")
    bad = {p["key"]: p for p in res.reuse_problems}
    assert s.keys[victim] in bad and "checksum" in bad[s.keys[victim]]["error"]
    assert sum("unreadable" in p["error"] for p in res.reuse_problems) == lost
    assert res.decoded == 1 + lost and res.reused == 30 - 1 - lost
    _assert_same_as_fresh(manifest, out, tmp_path)  # nothing bad was copied


def test_interrupted_incremental_run_resumes_identically(v1, tmp_path, interrupt_writes):
    root, rows, out = v1
    manifest = write_manifest(root / "v2.csv", _edit(root, rows, add=2, remove=1, replace=1, relabel=1))
    written = interrupt_writes(2)
    with pytest.raises(KeyboardInterrupt):
        _convert(manifest, out, "v2")
    written.restore()
    res = _convert(manifest, out, "v2")
    assert res.shards_resumed == 2
    _assert_same_as_fresh(manifest, out, tmp_path)


def test_trust_mtime_skips_reading_and_its_risk(v1):
    root, rows, out = v1
    target = root / rows[3]["path"]
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[-10] ^= 0x01  # same size; restore the mtime: an edit --trust-mtime cannot see
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    manifest = write_manifest(root / "v2.csv", rows)
    trusting = _convert(manifest, out, "v2", trust_mtime=True, dry_run=True)
    assert trusting.decoded == 0 and trusting.reused == 30
    careful = _convert(manifest, out, "v2", dry_run=True)
    assert careful.decoded == 1 and careful.reused == 29


def test_base_selection(v1, tmp_path):
    root, rows, out = v1
    manifest = write_manifest(root / "v2.csv", rows)
    _convert(manifest, out, "padded", resize="pad")  # another resize: never a base for center-crop
    res = _convert(manifest, out, "v2")
    assert res.base == "v1" and res.decoded == 0
    res3 = _convert(manifest, out, "v3")
    assert res3.base == "v2"  # the newest compatible version
    assert _convert(manifest, out, "v4", base="v1").base == "v1"
    with pytest.raises(OptionError, match="--from padded: its pixels were made differently.*resize"):
        _convert(manifest, out, "v5", base="padded")
    with pytest.raises(OptionError, match="--from nope: no finished conversion"):
        _convert(manifest, out, "v5", base="nope")


def test_fresh_output_has_no_base(tmp_path):
    root = tmp_path / "c"
    manifest = write_manifest(root / "m.csv", make_images(root, 5))
    res = _convert(manifest, tmp_path / "out", "v1")
    assert res.base is None and res.decoded == 5 and res.removed == 0
    assert load_index(res.out_dir).meta["build"]["base"] is None
    assert np.all(load_index(res.out_dir).samples["npy_length"] == 128 + 32 * 32 * 3)
