import json
import os
import re
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import convert_images, upload
from PIL import Image
from shardkit import build_dataset, copy_tars, rewrite_tar

from wds_tools.cli import cli
from wds_tools.errors import IndexFormatError, OptionError, ShardError
from wds_tools.format.index import load_index
from wds_tools.inspect.stats import compute_stats
from wds_tools.inspect.stats.figures import SCHEMA


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """40 real JPEGs converted at 32 px into 8-sample shards (train and val)."""
    return convert_images(tmp_path_factory.mktemp("stats"), 40, size=32, shard_size=8, val_fraction=0.25)


@pytest.fixture
def unbalanced(tmp_path):
    """train: three shards of 10 (classes mixed) and one of 2 (all class b); val: one shard of 3."""
    mixed = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    return build_dataset(tmp_path / "unbal", {"train": [mixed, mixed, mixed, [1, 1]], "val": [[0, 1, 2]]})


# ------------------------------------------------------------------ reports


def test_balanced_converted_set(converted):
    meta = load_index(converted).meta
    r = compute_stats(converted, world_size=1, workers=2)
    d = r.to_dict()
    assert d["source"] == "index" and d["samples"] == 40 and d["shards"] == len(meta["shards"])
    assert d["mean"] == meta["mean"] and d["std"] == meta["std"] and d["size"] == 32
    train = d["splits"]["train"]
    assert train["samples"] == meta["splits"]["train"]["samples"]
    assert train["class_counts"] == meta["splits"]["train"]["class_counts"]
    spread = train["samples_per_shard"]
    assert spread["max"] - spread["min"] <= 1  # the planner deals round-robin
    assert train["bytes"] == sum(s["bytes"] for s in meta["shards"] if s["split"] == "train")
    assert (
        d["bytes"]["total"]
        == sum(s["bytes"] for s in meta["shards"])
        + meta["samples_file"]["bytes"]
        + (converted / "index.json").stat().st_size
    )
    # class drift is bounded by one sample in a shard of 8: 1/8 = 12.5 pp
    assert 0 <= train["class_drift"]["max_pp"] <= 12.5 + 1e-9


def test_unbalanced_counts_and_class_drift(unbalanced):
    r = compute_stats(unbalanced, world_size=2, workers=1, reader="stream")
    train = r.to_dict()["splits"]["train"]
    assert train["samples_per_shard"] == {
        "min": 2,
        "median": 10.0,
        "max": 10,
        "imbalance": 5.0,
        "cv": round(float(np.std([10, 10, 10, 2]) / 8), 4),
    }
    # split share: a 12/32, b 11/32... shard 3 is 100% b: drift = (1 - b share) in pp
    share_b = (3 * 3 + 2) / 32
    worst = train["class_drift"]["worst"][0]
    assert worst == {"shard": "train-000003.tar", "pp": round((1 - share_b) * 100, 3), "class": "b"}
    assert train["per_shard"][3]["drift_class"] == "b"
    assert train["distribution"]["rank_samples"] == [20, 12]
    assert any("unequal sample counts" in w for w in r.warnings)
    text = r.to_text()
    assert "train-000003.tar" in text and "5.000" in text and "warning: ranks get unequal" in text


def test_scan_agrees_with_index(converted, unbalanced, tmp_path):
    for folder in (converted, unbalanced):
        a = compute_stats(folder, workers=3, world_size=2, reader="stream").to_dict()
        b = compute_stats(
            copy_tars(folder, tmp_path / ("scan-" + folder.name)), workers=3, world_size=2, scan=True
        ).to_dict()
        assert (a["reader"], b["reader"]) == ("stream", "stream")  # a scan models streaming by default
        assert b["source"] == "scan" and b["index"] is None and b["bytes"]["index"] == 0
        for key in ("classes", "samples", "shards", "size", "stats_split", "splits"):
            assert a[key] == b[key], key
        assert a["bytes"]["shards"] == b["bytes"]["shards"]
        np.testing.assert_allclose(a["mean"], b["mean"], atol=2e-6)
        np.testing.assert_allclose(a["std"], b["std"], atol=2e-6)


def test_scan_reads_version_1_shards_and_refuses_an_i32_that_disagrees(converted, tmp_path):
    """--scan: version-1 shards (no .i32) give the same figures as their index; a version-2 .i32 that
    is not the .cls's label is refused, naming the member."""
    from test_golden import golden_folder

    v1 = golden_folder(tmp_path, 1)
    a = compute_stats(v1, reader="stream").to_dict()
    b = compute_stats(copy_tars(v1, tmp_path / "v1"), scan=True).to_dict()
    assert a["splits"] == b["splits"] and a["classes"] == b["classes"]
    tars = copy_tars(converted, tmp_path / "bad")
    key = []

    def edit(ms):
        i = next(i for i, (m, _) in enumerate(ms) if m.name.endswith(".i32"))
        key.append(ms[i][0].name)
        ms[i] = (ms[i][0], (int.from_bytes(ms[i][1], "little") + 1).to_bytes(4, "little"))
        return ms

    rewrite_tar(tars / "train-000000.tar", edit)
    with pytest.raises(
        ShardError,
        match=rf"train-000000.tar: member {re.escape(key[0])} holds .*, but the sample's "
        r"\.cls says \d+",
    ):
        compute_stats(tars, scan=True)


def test_json_schema_is_stable(converted, runner):
    res = runner.invoke(cli, ["stats", str(converted), "--json", "--loader-workers", "2"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["schema"] == SCHEMA == "wds-tools-stats/3"
    assert set(d) == {
        "schema",
        "source",
        "path",
        "root",
        "index",
        "dataset_version",
        "size",
        "classes",
        "samples",
        "shards",
        "bytes",
        "mean",
        "std",
        "stats_split",
        "world_size",
        "workers",
        "reader",
        "metadata",
        "splits",
        "warnings",
        "seconds",
        "duplicates",
    }  # duplicates: format version 3 on
    assert set(d["duplicates"]) == {
        "threshold",
        "clusters",
        "samples_in_clusters",
        "cross_split",
        "label_conflict",
        "cross_group",
        "flat",  # samples too flat to hash (issue 32)
    }
    assert set(d["bytes"]) == {"shards", "index", "total"}
    sp = d["splits"]["train"]
    assert set(sp) == {
        "shards",
        "samples",
        "bytes",
        "samples_per_shard",
        "bytes_per_shard",
        "class_counts",
        "class_share",
        "class_drift",
        "mean",
        "std",
        "distribution",
        "per_shard",
    }
    assert set(sp["samples_per_shard"]) == {"min", "median", "max", "imbalance", "cv"}
    assert set(sp["bytes_per_shard"]) == {"min", "median", "max"}
    assert set(sp["class_drift"]) == {"max_pp", "median_pp", "worst"}
    assert set(sp["class_drift"]["worst"][0]) == {"shard", "pp", "class"}
    assert set(sp["distribution"]) == {
        "world_size",
        "workers",
        "shards",
        "samples",
        "rank_shards",
        "rank_samples",
        "worker_shards",
        "worker_samples",
        "idle_workers",
        "even_shards_below",
        "even_shards_above",
        "warnings",
        "reader",
        "left_out",
        "mode",
    }
    assert set(sp["per_shard"][0]) == {"name", "samples", "bytes", "drift_pp", "drift_class"}


# ------------------------------------------------------------------ which shards


def test_paths_index_file_pattern_and_newest(converted, tmp_path):
    whole = compute_stats(converted / "index.json")
    assert whole.shards == len(load_index(converted).shards)
    pattern = str(converted / "train-{000000..000001}.tar")
    part = compute_stats(pattern)
    assert list(part.splits) == ["train"] and part.splits["train"].shard_names == [
        "train-000000.tar",
        "train-000001.tar",
    ]
    # no PATH: the most recently modified OUT/<version>/<size>/index.json
    out = tmp_path / "out"
    old = build_dataset(out / "v1" / "4", {"train": [[0, 1]]})
    new = build_dataset(out / "v2" / "4", {"train": [[0, 1, 2]]})
    os.utime(old / "index.json", (time.time() + 100, time.time() + 100))
    assert compute_stats(out=out).root == str(old)
    os.utime(new / "index.json", (time.time() + 200, time.time() + 200))
    assert compute_stats(out=out).root == str(new)


def test_path_errors(converted, tmp_path):
    with pytest.raises(IndexFormatError, match=r"no converted dataset under .*nowhere .*pass a PATH"):
        compute_stats(out=tmp_path / "nowhere")
    with pytest.raises(OptionError, match="missing: no such shards folder, index file or shard pattern"):
        compute_stats(tmp_path / "missing")
    with pytest.raises(IndexFormatError, match=r"cannot read index http://127.0.0.1:1/index.json: cannot reach"):
        compute_stats("http://127.0.0.1:1/train-{0..3}.tar")  # URLs are read now; nothing listens on port 1
    tars = copy_tars(converted, tmp_path / "noindex")
    with pytest.raises(IndexFormatError, match=r"no index at .*noindex/index.json; pass --scan"):
        compute_stats(tars)
    with pytest.raises(IndexFormatError, match="not in .*index.json .*use --scan"):
        compute_stats(str(converted / "train-{000000..000099}.tar"))
    with pytest.raises(OptionError, match="workers 0"):
        compute_stats(converted, workers=0)
    (tars / "train-000001.tar").write_bytes((tars / "train-000001.tar").read_bytes()[:3000])
    with pytest.raises(ShardError, match="train-000001.tar: truncated.*run `wds-tools verify`"):
        compute_stats(tars, scan=True)


# ------------------------------------------------------------------ CLI


@pytest.fixture
def runner():
    return CliRunner()


def test_cli_text(converted, runner):
    args = ["stats", str(converted), "--world-size", "4", "--loader-workers", "2"]
    res = runner.invoke(cli, [*args, "--reader", "stream"])
    assert res.exit_code == 0, res.output
    assert "per shard" in res.output and "per rank" in res.output and "warning:" in res.output
    assert "4 shards for 4 ranks × 2 workers = 8 readers: 4 readers get no shard" in res.output
    res = runner.invoke(cli, args)  # the loader's default reader here: the index reader, which deals samples
    assert res.exit_code == 0, res.output
    assert "the index reader" in res.output and "get no shard" not in res.output


def test_plot_needs_the_extra(converted, runner, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where the plot extra is not installed
    res = runner.invoke(cli, ["stats", str(converted), "--plot", str(tmp_path / "x.png")])
    assert res.exit_code == 1 and "pip install matplotlib==3.11.2" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x.png").exists()


def test_plot_draws_each_split(converted, runner, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    png = tmp_path / "stats.png"
    res = runner.invoke(cli, ["stats", str(converted), "--plot", str(png), "--json"])
    assert res.exit_code == 0, res.output
    splits = len(json.loads(res.stdout)["splits"])
    with Image.open(png) as im:  # 6 x 7 inches a split at 100 dpi
        assert im.format == "PNG" and im.size == (600 * splits, 700)
        assert len(im.convert("RGB").getcolors(1 << 16) or range(1 << 16)) > 20  # bars, a heatmap, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.png"]  # no temporary file left


def test_cli_out_from_config_and_scan_flag(converted, runner, tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    build_dataset(proj / "myshards" / "v9" / "4", {"train": [[0, 1], [2, 2]]})
    (proj / "wds-tools.toml").write_text('out = "myshards"\n')
    monkeypatch.chdir(proj)
    res = runner.invoke(cli, ["stats", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["dataset_version"] == "t" and json.loads(res.stdout)["shards"] == 2
    res = runner.invoke(cli, ["stats", "--scan", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["source"] == "scan"
    res = runner.invoke(cli, ["stats", "nothere"])
    assert res.exit_code == 2 and "nothere: no such shards folder" in res.output  # a PATH that is not there: usage


# ------------------------------------------------------------------ object storage and http


def _where_independent(report) -> dict:
    """A report's dict without what names the place it was read from."""
    return {k: v for k, v in report.to_dict().items() if k not in ("path", "root", "index", "seconds")}


def test_s3_and_http_give_the_local_report(converted, bucket, serve_http, tmp_path):
    fs, url = bucket
    s3 = upload(fs, converted, f"{url}/v1/32")
    web = serve_http(converted)
    local = compute_stats(converted, world_size=2, workers=3, reader="stream")
    for path in (s3, f"{s3}/index.json", web, f"{web}/index.json"):
        r = compute_stats(path, world_size=2, workers=3, reader="stream")
        assert _where_independent(r) == _where_independent(local), path
        # the reader make_loader picks: by offset from local files and object storage, streaming over http
        assert compute_stats(path).reader == ("stream" if path.startswith("http") else "index"), path
        assert r.root == path.removesuffix("/index.json") and r.index == f"{r.root}/index.json"
    pattern = "train-{000000..000001}.tar"
    part = _where_independent(compute_stats(str(converted / pattern), workers=2, reader="stream"))
    assert part["shards"] == 2
    assert _where_independent(compute_stats(f"{s3}/{pattern}", workers=2, reader="stream")) == part
    assert _where_independent(compute_stats(f"{web}/{pattern}", workers=2, reader="stream")) == part
    # --scan reads every tar: from the bucket's listing of a folder, or an http pattern
    bare = copy_tars(converted, tmp_path / "bare")
    bare_s3 = upload(fs, bare, f"{url}/bare")
    scanned = _where_independent(compute_stats(bare, workers=2, scan=True))
    assert scanned["source"] == "scan" and scanned["samples"] == 40
    assert _where_independent(compute_stats(bare_s3, workers=2, scan=True)) == scanned
    names = sorted(p.name for p in bare.glob("*.tar"))
    web_bare = serve_http(bare)
    assert _where_independent(compute_stats(f"{web_bare}/{{{','.join(names)}}}", workers=2, scan=True)) == scanned


def test_remote_damage_is_named_as_locally(converted, bucket, serve_http, tmp_path):
    fs, url = bucket
    bare = copy_tars(converted, tmp_path / "bare")
    cut = bare / "train-000001.tar"
    cut.write_bytes(cut.read_bytes()[:3000])
    s3 = upload(fs, bare, f"{url}/bare")
    web = serve_http(bare)
    for path in (bare, s3, f"{web}/train-{{000000..000003}}.tar"):
        with pytest.raises(ShardError, match="train-000001.tar: truncated.*run `wds-tools verify`"):
            compute_stats(path, scan=True)
    (bare / "train-000002.tar").unlink()
    with pytest.raises(ShardError, match=r"1 shard\(s\) missing, first: http://.*/train-000002.tar"):
        compute_stats(f"{web}/train-{{000002..000003}}.tar", scan=True)


# ------------------------------------------------------------------ issue 22, point 9: stats checks what it reads


def _copy(converted, tmp_path):
    import shutil

    return shutil.copytree(converted, tmp_path / "copy")


def test_row_10_a_samples_table_of_the_same_size_from_elsewhere_is_refused(converted, tmp_path):
    from wds_tools.format.index import read_npz, write_npz

    folder = _copy(converted, tmp_path)
    cols = read_npz(folder / "samples.npz")
    cols["label"] = (cols["label"] + 1) % 3  # another version's labels: same dtypes, same size
    data = write_npz(cols)
    assert len(data) == (folder / "samples.npz").stat().st_size
    (folder / "samples.npz").write_bytes(data)
    with pytest.raises(
        IndexFormatError,
        match=r"samples.npz: sha256 [0-9a-f]{16}\.\.\., .*index.json says "
        r"[0-9a-f]{16}\.\.\.: it is not the table this index was written with",
    ):
        compute_stats(folder)
    r = CliRunner().invoke(cli, ["stats", str(folder)])
    assert r.exit_code != 0 and "sha256" in r.output and "Traceback" not in r.output
    torch = pytest.importorskip("torch")
    del torch
    from training_adapter import make_loader

    with pytest.raises(IndexFormatError, match="it is not the table this index was written with"):
        make_loader(folder, batch_size=4, train=False, num_workers=0, reader="index")


def test_row_11_counts_the_index_cannot_back_are_refused(converted, tmp_path):
    folder = _copy(converted, tmp_path)
    meta = json.loads((folder / "index.json").read_text())
    meta["shards"][0]["samples"] = 10**12
    (folder / "index.json").write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match=r"shards\[0\]\.samples is 1,000,000,000,000, but a shard of "):
        compute_stats(folder)
    meta["shards"][0]["bytes"] = 10**16  # a size that could hold them: the table says otherwise
    (folder / "index.json").write_text(json.dumps(meta))
    with pytest.raises(
        IndexFormatError,
        match=r"shards\[0\] \(\S+\) says 1000000000000 samples, samples.npz has 8 "
        r"rows of it",
    ):
        compute_stats(folder)


# ------------------------------------------------------------------ issue 32, point 12


def test_stats_lists_the_metadata_columns_as_index_json_has_them(tmp_path, runner):
    """The training guide sends a user to `wds-tools stats` for the column names make_loader(metadata=) takes."""
    from conftest import write_ham

    from wds_tools.convert import convert

    manifest = write_ham(tmp_path / "ham", [2, 1, 3, 2])
    columns = dict(key="image_id", label="dx", path="images/{image_id}.jpg", group="lesion_id")
    convert(manifest, version="v1", size=16, out=tmp_path / "out", workers=1, progress=False, **columns)
    folder = tmp_path / "out" / "v1" / "16"
    listed = json.loads((folder / "index.json").read_text())["metadata"]  # stock json, not ours
    assert [c["name"] for c in listed] == ["lesion_id", "dx_type", "age", "sex", "localization"]
    res = runner.invoke(cli, ["stats", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["metadata"] == listed
    res = runner.invoke(cli, ["stats", str(folder)])
    assert res.exit_code == 0, res.output
    shown = ", ".join(f"{c['name']} ({c['type']})" for c in listed)
    assert f"  metadata columns (make_loader(metadata=...), --by): {shown}" in res.output


def test_stats_says_when_there_are_no_metadata_columns_and_when_a_scan_cannot_know(converted, runner):
    res = runner.invoke(cli, ["stats", str(converted)])
    assert "  metadata columns: none (the source had no columns beyond key, path, label and split)" in res.output
    assert json.loads(runner.invoke(cli, ["stats", str(converted), "--json"]).stdout)["metadata"] == []
    scan = runner.invoke(cli, ["stats", str(converted), "--scan", "--json"])
    assert json.loads(scan.stdout)["metadata"] is None
    assert (
        "metadata columns: not read (--scan reads the tars; index.json lists them)"
        in runner.invoke(cli, ["stats", str(converted), "--scan"]).output
    )


@pytest.mark.parametrize("world", [2, 3, 4])
def test_per_rank_counts_are_the_loaders_in_training_and_in_evaluation(converted, runner, world):
    """stats said "samples per rank: N (training; each rank the same)" for the val split too; evaluation
    reads every sample once across the ranks, so the first samples % ranks ranks read one more. The
    reference: the loader's own count of what each rank yields (training_adapter, not the stats module)."""
    from training_adapter import make_loader

    d = json.loads(runner.invoke(cli, ["stats", str(converted), "--world-size", str(world), "--json"]).stdout)
    for split, train in (("train", True), ("val", False)):
        loader = make_loader(converted, batch_size=1, train=train, split=split, num_workers=0)
        want = [loader.dataset.num_samples(rank=r, world=world, num_workers=1) for r in range(world)]
        dist = d["splits"][split]["distribution"]
        assert dist["rank_samples"] == want, split
        assert dist["mode"] == ("train" if train else "eval")
        assert dist["left_out"] == (d["splits"][split]["samples"] - sum(want))
    val = d["splits"]["val"]
    assert sum(val["distribution"]["rank_samples"]) == val["samples"]  # every sample once
    text = runner.invoke(cli, ["stats", str(converted), "--world-size", str(world)]).output
    val_text = text.split("\nval:", 1)[1]
    assert "each rank the same" not in val_text
    n, r = val["samples"], world
    low, high = n // r, n // r + (1 if n % r else 0)
    counts = f"{low:,}" if low == high else f"{low:,} to {high:,}"
    assert f"samples per rank: {counts} (evaluation: every sample once across the ranks" in val_text
