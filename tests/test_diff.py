import json

from click.testing import CliRunner
from conftest import make_images, upload, write_manifest

from wds_tools.cli import cli
from wds_tools.convert import convert
from wds_tools.inspect.diff import diff_versions
from wds_tools.synth import jpeg_bytes, photo_like


def _versions(tmp_path):
    root = tmp_path / "c"
    rows = make_images(root, 12)
    out = tmp_path / "out"
    convert(write_manifest(root / "v1.csv", rows), version="v1", size=32, out=out, workers=1, progress=False)
    v2 = [dict(r) for r in rows[1:]]  # s0000 removed
    v2[0]["label"] = "z"  # s0001 relabeled (from b)
    v2[3]["label"] = "a"  # s0004 relabeled (from b)
    (root / "img/s0002.jpg").write_bytes(jpeg_bytes(photo_like(96, 72, seed=999)))  # s0002 changed
    (root / "img/extra.jpg").write_bytes(jpeg_bytes(photo_like(96, 72, seed=1000)))
    v2.append({"key": "extra", "path": "img/extra.jpg", "label": "a"})  # added
    convert(write_manifest(root / "v2.csv", v2), version="v2", size=32, out=out, workers=1, progress=False)
    return out / "v1/32", out / "v2/32"


def test_diff_versions(tmp_path):
    a, b = _versions(tmp_path)
    d = diff_versions(a, b)
    assert (d.added, d.removed, d.changed, d.relabeled, d.unchanged) == (
        ["extra"],
        ["s0000"],
        ["s0002"],
        ["s0001", "s0004"],
        8,
    )
    # make_images labels row i with "abc"[i % 3]: s0001 and s0004 were b
    assert d.relabels == [{"key": "s0001", "old": "b", "new": "z"}, {"key": "s0004", "old": "b", "new": "a"}]
    assert diff_versions(a, a).unchanged == 12 and diff_versions(a, a).relabels == []


def test_diff_cli_text_and_json(tmp_path):
    a, b = _versions(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli, ["diff", str(a), str(b)])
    assert res.exit_code == 0
    assert "1 added, 1 removed, 1 changed, 2 relabeled, 8 unchanged" in res.output
    assert "  relabeled: s0001 (b -> z) s0004 (b -> a)" in res.output
    res = runner.invoke(cli, ["diff", str(a), str(b), "--json"])
    data = json.loads(res.output)
    assert data["changed"] == ["s0002"] and data["added"] == ["extra"] and data["relabeled"] == ["s0001", "s0004"]
    assert data["relabels"] == [{"key": "s0001", "old": "b", "new": "z"}, {"key": "s0004", "old": "b", "new": "a"}]
    res = runner.invoke(cli, ["diff", str(a), str(tmp_path)])
    assert res.exit_code == 1 and "no index at" in res.output


def test_diff_of_versions_in_s3(tmp_path, bucket):
    fs, url = bucket
    a, b = _versions(tmp_path)
    local = diff_versions(a, b)
    remote = diff_versions(upload(fs, a, f"{url}/v1/32"), f"{upload(fs, b, f'{url}/v2/32')}/index.json")
    assert (remote.old, remote.new) == (f"{url}/v1/32", f"{url}/v2/32")
    assert {**remote.to_dict(), "old": "", "new": ""} == {**local.to_dict(), "old": "", "new": ""}
    assert remote.added == ["extra"]


def test_diff_refuses_a_samples_table_that_is_not_its_index(tmp_path):
    """Each version's samples.npz is read checked against its index.json (size and sha256, labels in its
    classes): another version's table is refused naming it, never diffed as this one's."""
    import shutil

    import pytest

    from wds_tools.errors import IndexFormatError

    a, b = _versions(tmp_path)
    shutil.copy(a / "samples.npz", b / "samples.npz")
    with pytest.raises(IndexFormatError, match=r"samples\.npz.*it is not the table this index was written with"):
        diff_versions(a, b)
