"""Incremental conversion: a new version copies what its base already holds."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import make_images, write_manifest

from wds_tools.convert import convert
from wds_tools.errors import IndexFormatError, OptionError
from wds_tools.format.index import load_index, read_npz, write_npz
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
    for r in out[replace : replace + relabel]:
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


def test_a_base_whose_samples_npz_is_not_its_index_table_is_refused_naming_it(v1):
    """The base's samples.npz is read checked against index.json's samples_file: a table of the same size with
    two rows' keys swapped (another version's table, say) would tell which stored pixels are whose wrongly."""
    root, rows, out = v1
    table = out / "v1" / "32" / "samples.npz"
    cols = read_npz(table)
    cols["key"][[0, 1]] = cols["key"][[1, 0]]
    swapped = write_npz(cols)
    assert len(swapped) == table.stat().st_size and swapped != table.read_bytes()
    table.write_bytes(swapped)
    with pytest.raises(
        IndexFormatError, match=rf"^{re.escape(str(table))}: sha256 [0-9a-f]{{16}}\.\.\., .*index\.json says"
    ):
        _convert(write_manifest(root / "v2.csv", rows), out, "v2")
    assert not (out / "v2" / "32" / "index.json").exists()


def test_base_incompatibilities_name_each_field_as_index_json_has_it(v1):
    """What makes a version's pixels unusable for another, read from ``IndexMeta``: nothing against the options v1
    was converted with; each field changed alone, one difference naming it, its value as index.json (read with
    json) has it and the value wanted."""
    from wds_tools.convert.decode import DecodeSettings, decoder_versions
    from wds_tools.convert.reuse import base_incompatibilities

    idx = load_index(v1[2] / "v1" / "32")
    raw = json.loads((v1[2] / "v1" / "32" / "index.json").read_text())
    same = {"size": 32, "resize": "center-crop", "decode": DecodeSettings().to_dict()}
    same["decoder_versions"] = decoder_versions()
    others = {"size": 64, "resize": "pad", "decode": DecodeSettings(draft=False).to_dict(), "decoder_versions": {}}
    assert base_incompatibilities(idx.info, same) == []
    for field, value in others.items():
        wanted = {**same, field: value}
        got = base_incompatibilities(idx.info, wanted)
        assert got == [f"{field}: {raw[field]!r} there, {value!r} here"], (field, got)


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


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"add": 2}, {"decoded": 2, "relabeled": 0, "removed": 0, "reused": 30}),
        ({"remove": 3}, {"decoded": 0, "relabeled": 0, "removed": 3, "reused": 27}),
        ({"replace": 2}, {"decoded": 2, "relabeled": 0, "removed": 0, "reused": 28}),
        ({"relabel": 4}, {"decoded": 0, "relabeled": 4, "removed": 0, "reused": 26}),
    ],
)
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


def test_an_edit_that_keeps_size_and_mtime_is_missed_by_default_and_caught_by_checksum(v1, tmp_path):
    """The quick check's documented blind spot (docs/guide/versions.md, "What the default can miss")."""
    root, rows, out = v1
    target = root / rows[3]["path"]
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[-10] ^= 0x01  # same size; restore the mtime: an edit the quick check cannot see
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    manifest = write_manifest(root / "v2.csv", rows)
    quick = _convert(manifest, out, "v2", dry_run=True)
    assert (quick.decoded, quick.reused, quick.unchanged_by_stat, quick.sources_read) == (0, 30, 30, 0)
    careful = _convert(manifest, out, "v2", checksum=True, dry_run=True)
    assert careful.decoded == 1 and careful.reused == 29 and careful.sources_read == 30
    # written: the default keeps the old pixels; --checksum equals a fresh conversion
    missed = _convert(manifest, out, "v2")
    assert missed.decoded == 0
    caught = _convert(manifest, out, "v3", checksum=True, base="v1")
    assert caught.decoded == 1
    _assert_same_as_fresh(manifest, out, tmp_path, version="v3")
    with pytest.raises(AssertionError, match="differs from a fresh conversion"):
        _assert_same_as_fresh(manifest, out, tmp_path / "again", version="v2")


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


# ------------------------------------------------------------------ what "unchanged" costs: quick check,
# --checksum, manifest hashes


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_quick_check_reads_only_what_changed(v1, tmp_path):
    root, rows, out = v1
    manifest = write_manifest(root / "v2.csv", _edit(root, rows, add=2, remove=1, replace=1, relabel=1))
    touched = root / rows[10]["path"]
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))  # same bytes, new mtime
    res = _convert(manifest, out, "v2")
    # 2 added + 1 replaced (new paths) and the touched file are read; the other 27 only stat-ed
    assert (res.sources_read, res.unchanged_by_stat, res.unchanged_by_hash) == (4, 27, 0)
    assert (res.decoded, res.relabeled, res.reused) == (3, 1, 27)  # the touched file's bytes are v1's
    _assert_same_as_fresh(manifest, out, tmp_path)


def test_checksum_reads_every_source_and_gives_the_same_bytes(v1, tmp_path):
    root, rows, out = v1
    manifest = write_manifest(root / "v2.csv", _edit(root, rows, add=2, remove=1, replace=1, relabel=1))
    res = _convert(manifest, out, "v2", checksum=True)
    assert res.checksum and (res.sources_read, res.unchanged_by_stat) == (31, 0)
    assert (res.decoded, res.relabeled, res.reused) == (3, 1, 27)
    _assert_same_as_fresh(manifest, out, tmp_path)


@pytest.mark.parametrize("algo", ["sha256", "md5"])
def test_manifest_hash_column_decides_without_reading(tmp_path, algo):
    import hashlib

    root = tmp_path / "c"
    rows = make_images(root, 20)
    for r in rows:
        r[algo] = hashlib.new(algo, (root / r["path"]).read_bytes()).hexdigest()
    fields = ("key", "path", "label", algo)
    _convert(write_manifest(root / "v1.csv", rows, fields), tmp_path / "out", "v1")
    # every file touched (new mtimes) and one replaced by new bytes under its old path, hash updated
    for r in rows:
        p = root / r["path"]
        os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    changed = root / rows[4]["path"]
    changed.write_bytes(jpeg_bytes(photo_like(96, 72, seed=4242)))
    rows[4][algo] = hashlib.new(algo, changed.read_bytes()).hexdigest()
    manifest = write_manifest(root / "v2.csv", rows, fields)
    res = _convert(manifest, tmp_path / "out", "v2")
    assert (res.unchanged_by_hash, res.unchanged_by_stat, res.sources_read) == (19, 0, 1)
    assert (res.decoded, res.reused) == (1, 19)
    _assert_same_as_fresh(manifest, tmp_path / "out", tmp_path)
    # the pairs live outside the version folders, and a third version finds them in its base
    assert (tmp_path / "out/.wds-tools-cache/v2/source-hashes.npz").is_file()
    v3 = _convert(manifest, tmp_path / "out", "v3")
    assert (v3.unchanged_by_hash, v3.sources_read, v3.decoded) == (20, 0, 0)


def test_a_wrong_manifest_hash_fails_that_file_as_a_full_conversion_does(tmp_path):
    root = tmp_path / "c"
    rows = make_images(root, 12)
    for r in rows:
        r["sha256"] = _sha256(root / r["path"])
    fields = ("key", "path", "label", "sha256")
    rows[3]["sha256"] = "0" * 64  # wrong from the start
    v1 = _convert(write_manifest(root / "v1.csv", rows, fields), tmp_path / "out", "v1", max_errors="2")
    assert v1.failed == 1 and v1.samples_written == 11
    error = json.loads(Path(v1.errors_file).read_text())
    assert error["key"] == rows[3]["key"] and error["stage"] == "decode"
    assert f"the file's sha256 is {_sha256(root / rows[3]['path'])}" in error["error"]
    assert "manifest's sha256 column says 0000" in error["error"] and "fix the manifest or the file" in error["error"]
    # v2: row 3 fixed, row 5 wrong now (a hash v1 never saw, so the file is read and checked)
    rows[3]["sha256"] = _sha256(root / rows[3]["path"])
    rows[5]["sha256"] = "f" * 64
    manifest = write_manifest(root / "v2.csv", rows, fields)
    res = _convert(manifest, tmp_path / "out", "v2", max_errors="2")
    assert res.failed == 1 and res.sources_read == 2 and res.unchanged_by_hash == 10
    assert json.loads(Path(res.errors_file).read_text())["key"] == rows[5]["key"]
    fresh = _convert(manifest, tmp_path / "fresh", "v2", reuse=False, max_errors="2")
    a, b = _files(tmp_path / "out/v2/32"), _files(tmp_path / "fresh/v2/32")
    assert {k: v for k, v in a.items() if k != "index.json"} == {k: v for k, v in b.items() if k != "index.json"}
    assert fresh.failed == 1


def test_a_file_whose_bytes_left_its_trusted_hash_is_missed_by_default_and_caught_by_checksum(tmp_path):
    """The manifest hash is trusted: bytes edited behind an unchanged hash are seen only by --checksum."""
    root = tmp_path / "c"
    rows = make_images(root, 8)
    for r in rows:
        r["sha256"] = _sha256(root / r["path"])
    fields = ("key", "path", "label", "sha256")
    manifest = write_manifest(root / "m.csv", rows, fields)
    _convert(manifest, tmp_path / "out", "v1")
    (root / rows[2]["path"]).write_bytes(jpeg_bytes(photo_like(96, 72, seed=777)))
    trusting = _convert(manifest, tmp_path / "out", "v2")
    assert (trusting.decoded, trusting.failed, trusting.sources_read) == (0, 0, 0)
    careful = _convert(manifest, tmp_path / "out", "v3", checksum=True, base="v1", max_errors="1")
    assert careful.failed == 1 and careful.sources_read == 8  # read, and its sha256 no longer matches


# ---- issue 22 point 8: the summary's counts agree with `wds-tools diff` on the same pair of versions


def _agree(res, old: Path, new: Path) -> None:
    """res's counts against diff_versions(old, new), whose code reads only the two indexes."""
    from wds_tools.inspect.diff import diff_versions

    d = diff_versions(old, new)
    assert res.relabeled == len(d.relabeled) and res.removed == len(d.removed)
    assert res.by_key == {
        "added": len(d.added),
        "removed": len(d.removed),
        "changed": len(d.changed),
        "relabeled": len(d.relabeled),
        "unchanged": d.unchanged,
    }
    assert res.reused + res.relabeled + res.decoded == res.samples_written
    assert res.reused >= d.unchanged  # every unchanged key's pixels were copied, and perhaps others'
    text = res.to_text()
    assert (
        f"{len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} changed, "
        f"{len(d.relabeled)} relabeled, {d.unchanged} unchanged"
    ) in text


def test_two_keys_on_one_file_unchanged_are_not_relabeled(tmp_path):
    """Row 9: k1,f.jpg,cat and k2,f.jpg,dog as v1, and again unchanged as v2, said "1 relabeled"."""
    root = tmp_path / "c"
    (root / "img").mkdir(parents=True)
    (root / "img/f.jpg").write_bytes(jpeg_bytes(photo_like(40, 30, seed=3)))
    (root / "img/g.jpg").write_bytes(jpeg_bytes(photo_like(40, 30, seed=4)))
    rows = [
        {"key": "k1", "path": "img/f.jpg", "label": "cat"},
        {"key": "k2", "path": "img/f.jpg", "label": "dog"},
        {"key": "k3", "path": "img/g.jpg", "label": "dog"},
    ]
    manifest = write_manifest(root / "m.csv", rows)
    out = tmp_path / "out"
    _convert(manifest, out, "v1", val_fraction=0.0)
    res = _convert(manifest, out, "v2", val_fraction=0.0)
    assert (res.reused, res.relabeled, res.decoded, res.removed) == (3, 0, 0, 0)
    assert "Converted 3 images into 1 shard in " in res.to_text()  # row 15: not "1 shards"
    assert "train         3 samples     1 shard " in res.to_text()
    _agree(res, out / "v1/32", out / "v2/32")
    # k2 relabeled for real: one relabeled, by either count
    rows[1]["label"] = "cat"
    res = _convert(write_manifest(root / "m3.csv", rows), out, "v3", base="v1", val_fraction=0.0)
    assert (res.reused, res.relabeled, res.decoded) == (2, 1, 0)
    _agree(res, out / "v1/32", out / "v3/32")


def test_counts_agree_with_diff_over_random_manifests(tmp_path_factory):
    """A property over random pairs of manifests: several keys on one file, keys moved to other
    files, labels changed, rows added and removed."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    root = tmp_path_factory.mktemp("files")
    (root / "img").mkdir()
    for i in range(4):
        (root / f"img/f{i}.jpg").write_bytes(jpeg_bytes(photo_like(24, 20, seed=100 + i)))
    row = st.tuples(st.integers(0, 3), st.sampled_from("ab"))  # (file, label)
    rows = st.dictionaries(st.sampled_from([f"k{i}" for i in range(8)]), row, min_size=1, max_size=8)
    runs = iter(range(10**6))

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(old=rows, new=rows)
    def check(old, new):
        out = tmp_path_factory.mktemp(f"out{next(runs)}")
        for version, manifest in (("v1", old), ("v2", new)):
            listed = [{"key": k, "path": f"img/f{f}.jpg", "label": lab} for k, (f, lab) in sorted(manifest.items())]
            res = _convert(
                write_manifest(root / f"{out.name}-{version}.csv", listed), out, version, val_fraction=0.0, shard_size=3
            )
        assert res.base == "v1"
        _agree(res, out / "v1/32", out / "v2/32")

    check()
