import io
import json
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from conftest import make_images, write_manifest

from wds_tools.convert import convert, parse_max_errors
from wds_tools.convert.decode import decode_file
from wds_tools.errors import OptionError, OutputExistsError, TooManyErrorsError
from wds_tools.format.index import load_index

ROOT = Path(__file__).resolve().parents[1]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _run(corpus, out, **kw):
    kw.setdefault("shard_size", 8)
    kw.setdefault("workers", 1)
    return convert(corpus, version="v1", size=32, out=out, progress=False, **kw)


def test_round_trip_pixels_labels_keys_and_index(corpus, tmp_path):
    res = _run(corpus, tmp_path / "out", val_fraction=0.25)
    dest = tmp_path / "out" / "v1" / "32"
    assert res.out_dir == str(dest) and res.samples_written == 40 and res.failed == 0
    idx = load_index(dest)
    rows = {r["key"]: r for r in __import__("csv").DictReader(open(corpus))}
    seen = {}
    for shard in idx.shards:
        with tarfile.open(dest / shard["name"]) as tf:
            names = tf.getnames()
            data = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        keys = list(dict.fromkeys(n.split(".")[0] for n in names))
        assert names == [f"{k}.{ext}" for k in keys for ext in ("cls", "i32", "json", "npy")]
        for k in keys:
            arr = np.load(io.BytesIO(data[f"{k}.npy"]))
            meta = json.loads(data[f"{k}.json"])
            src = corpus.parent / rows[k]["path"]
            assert arr.dtype == np.uint8 and arr.shape == (32, 32, 3) and arr.flags.c_contiguous
            assert np.array_equal(arr, decode_file(str(src), 32).pixels)
            assert idx.classes[int(data[f"{k}.cls"])] == rows[k]["label"] == meta["label"]
            assert data[f"{k}.i32"] == int(data[f"{k}.cls"]).to_bytes(4, "little")  # DALI's INT32
            assert (meta["dataset_version"], meta["classes_digest"]) == ("v1", idx.meta["classes_digest"])
            assert meta["original_key"] == k  # always present; the key itself when not mapped
            assert meta["source_path"] == rows[k]["path"] and (meta["width"], meta["height"]) == (96, 72)
            assert meta["fingerprint"].startswith("xxh3_128:")
            seen[k] = shard["name"]
    assert sorted(seen) == sorted(rows)  # every row exactly once
    # the sample table points at the right bytes
    s = idx.samples
    assert len(s) == 40 and sorted(s.keys) == sorted(rows)
    for i in (0, 17, 39):
        shard = idx.shards[int(s["shard"][i])]
        blob = (dest / shard["name"]).read_bytes()
        off, n = int(s["npy_offset"][i]), int(s["npy_length"][i])
        assert np.array_equal(
            np.load(io.BytesIO(blob[off : off + n])),
            decode_file(str(corpus.parent / rows[s.keys[i]]["path"]), 32).pixels,
        )
        assert (
            blob[int(s["cls_offset"][i]) : int(s["cls_offset"][i]) + int(s["cls_length"][i])]
            == str(s["label"][i]).encode()
        )
        off, n = int(s["i32_offset"][i]), int(s["i32_length"][i])
        assert n == 4 and int.from_bytes(blob[off : off + n], "little", signed=True) == int(s["label"][i])
        assert s.source_path(i) == rows[s.keys[i]]["path"]
    meta = idx.meta
    assert meta["samples"] == 40 and sum(meta["class_counts"]) == 40
    assert {sp: v["samples"] for sp, v in meta["splits"].items()} == dict(Counter(seen[k].split("-")[0] for k in seen))
    assert all(0 < m < 1 for m in meta["mean"]) and all(0 < v < 0.5 for v in meta["std"])
    for shard in idx.shards:
        assert shard["bytes"] == (dest / shard["name"]).stat().st_size
    assert not (dest / ".wds-tools-work").exists()


def test_mean_std_match_the_pixels(corpus, tmp_path):
    _run(corpus, tmp_path / "out", val_fraction=0.0)
    idx = load_index(tmp_path / "out/v1/32")
    url = idx.url_pattern("train")
    arrs = np.stack([a for (a,) in wds.WebDataset(url, shardshuffle=False).decode().to_tuple("npy")])
    px = arrs.reshape(-1, 3).astype(np.float64) / 255
    assert np.allclose(idx.meta["mean"], px.mean(0), atol=1e-5)
    assert np.allclose(idx.meta["std"], px.std(0), atol=1e-5)


def test_stock_webdataset_reads_the_shards(corpus, tmp_path):
    res = _run(corpus, tmp_path / "out", val_fraction=0.0)
    ds = (
        wds.WebDataset(res.splits["train"]["urls"], shardshuffle=False)
        .decode()
        .to_tuple("__key__", "npy", "cls", "json")
    )
    samples = list(ds)
    assert len(samples) == 40
    key, arr, cls, meta = samples[0]
    assert arr.shape == (32, 32, 3) and isinstance(cls, int) and meta["key"] == key


def test_balanced_shards(tmp_path):
    root = tmp_path / "c"
    rows = make_images(root, 53, classes=("a", "b", "c", "d"))
    manifest = write_manifest(root / "m.csv", rows)
    _run(manifest, tmp_path / "out", shard_size=10, val_fraction=0.0)
    idx = load_index(tmp_path / "out/v1/32")
    counts = [s["samples"] for s in idx.shards]
    assert len(counts) == 6 and max(counts) - min(counts) <= 1
    labels, shards = idx.samples["label"], idx.samples["shard"]
    for c in range(4):
        per_shard = [int(((labels == c) & (shards == s)).sum()) for s in range(6)]
        assert max(per_shard) - min(per_shard) <= 1


def test_determinism_two_runs_byte_identical(corpus, tmp_path):
    _run(corpus, tmp_path / "a", workers=2)
    _run(corpus, tmp_path / "b", workers=1)
    a, b = _files(tmp_path / "a/v1/32"), _files(tmp_path / "b/v1/32")
    assert a.keys() == b.keys() and len([n for n in a if n.endswith(".tar")]) >= 5
    for name in a:
        if name != "index.json":
            assert a[name] == b[name], name
    ia, ib = json.loads(a["index.json"]), json.loads(b["index.json"])
    assert ia == ib  # identical but for nothing: the out folder is not recorded
    assert a["index.json"] == b["index.json"]


def test_bad_files_are_skipped_and_reported(tmp_path):
    root = tmp_path / "c"
    rows = make_images(root, 30)
    (root / "img/empty.jpg").write_bytes(b"")
    (root / "img/text.jpg").write_text("hello")
    good = (root / "img/s0000.jpg").read_bytes()
    (root / "img/trunc.jpg").write_bytes(good[: len(good) // 2])
    rows += [
        {"key": "missing", "path": "img/none.jpg", "label": "a"},
        {"key": "empty", "path": "img/empty.jpg", "label": "a"},
        {"key": "text", "path": "img/text.jpg", "label": "b"},
        {"key": "trunc", "path": "img/trunc.jpg", "label": "c"},
    ]
    manifest = write_manifest(root / "m.csv", rows)
    res = _run(manifest, tmp_path / "out", max_errors="20%")
    assert res.samples_written == 30 and res.failed == 4 and not res.max_errors_exceeded
    errors = [json.loads(line) for line in open(res.errors_file)]
    reasons = {e["key"]: e["error"] for e in errors}
    assert reasons["missing"] == "missing file"
    assert reasons["empty"] == "empty file"
    assert "not an image" in reasons["text"]
    assert "truncated" in reasons["trunc"]
    assert all(e["path"].startswith("img/") and e["line"] > 1 for e in errors)
    assert "trunc" not in load_index(res.out_dir).samples.keys
    assert load_index(res.out_dir).meta["errors_file"] == "errors.jsonl"
    # the same errors over a lower threshold (3 at the scan, "trunc" at decoding): stopped, no index
    # (issue 15: it used to write the index and report max_errors_exceeded); test_publish.py has the rest
    with pytest.raises(TooManyErrorsError, match=r"4 of 34 source files failed.*more than --max-errors allows \(3\)"):
        _run(manifest, tmp_path / "out2", max_errors="3")
    assert not (tmp_path / "out2/v1/32/index.json").exists()
    res2 = _run(manifest, tmp_path / "out2", max_errors="4")
    assert res2.failed == 4 and not res2.max_errors_exceeded and res2.samples_written == 30
    assert _files(tmp_path / "out2/v1/32") == _files(tmp_path / "out/v1/32")


def test_too_many_unreadable_files_stops_before_writing(tmp_path):
    root = tmp_path / "c"
    rows = make_images(root, 5) + [{"key": f"gone{i}", "path": f"nope/{i}.jpg", "label": "a"} for i in range(5)]
    manifest = write_manifest(root / "m.csv", rows)
    with pytest.raises(TooManyErrorsError, match="5 of 10 source files are unreadable.*nothing was converted"):
        _run(manifest, tmp_path / "out")
    dest = tmp_path / "out/v1/32"
    assert sorted(p.name for p in dest.iterdir()) == ["errors.jsonl"]
    # fixing the manifest and running again works in the same folder
    write_manifest(root / "m.csv", rows[:5])
    assert _run(manifest, tmp_path / "out").samples_written == 5


def test_parse_max_errors():
    assert parse_max_errors("25") == ("count", 25)
    assert parse_max_errors("1%") == ("fraction", 0.01)
    assert parse_max_errors("0.05") == ("fraction", 0.05)
    for bad in ("many", "150%", "-1"):
        with pytest.raises(OptionError, match="--max-errors"):
            parse_max_errors(bad)


def test_options_are_validated(corpus, tmp_path):
    with pytest.raises(OptionError, match="--version"):
        convert(corpus, version="a/b", size=32, out=tmp_path)
    with pytest.raises(OptionError, match="--size"):
        convert(corpus, version="v1", size=3, out=tmp_path)
    with pytest.raises(OptionError, match="--resize"):
        convert(corpus, version="v1", size=32, out=tmp_path, resize="stretch")
    assert not (tmp_path / "v1").exists()


def test_rerun_is_a_no_op_and_other_options_are_refused(corpus, tmp_path):
    _run(corpus, tmp_path / "out")
    dest = tmp_path / "out/v1/32"
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in dest.iterdir()}
    again = _run(corpus, tmp_path / "out")
    assert again.already_complete and again.samples_written == 40
    with pytest.raises(OutputExistsError, match="resize: existing 'center-crop', requested 'pad'"):
        _run(corpus, tmp_path / "out", resize="pad")
    with pytest.raises(
        OutputExistsError,
        match=r"shard_size: existing 8 samples per shard \(about [0-9.]+ MB at 32 px\), requested 9 samples per shard",
    ):
        _run(corpus, tmp_path / "out", shard_size=9)
    rows = list(__import__("csv").DictReader(open(corpus)))
    other = write_manifest(corpus.parent / "other.csv", rows[:-1])
    with pytest.raises(OutputExistsError, match="source.digest"):
        _run(other, tmp_path / "out")
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in dest.iterdir()} == before


def test_foreign_folder_is_refused(corpus, tmp_path):
    dest = tmp_path / "out/v1/32"
    dest.mkdir(parents=True)
    (dest / "precious.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match="precious.txt"):
        _run(corpus, tmp_path / "out")
    assert (dest / "precious.txt").read_text() == "keep me"


def test_resume_after_an_interrupted_run_is_byte_identical(corpus, tmp_path, interrupt_writes):
    _run(corpus, tmp_path / "ref")
    calls = interrupt_writes(2)
    with pytest.raises(KeyboardInterrupt):
        _run(corpus, tmp_path / "out")
    dest = tmp_path / "out/v1/32"
    assert not (dest / "index.json").exists() and len(list(dest.glob("*.tar"))) == 2
    # a different command cannot take over the unfinished folder
    with pytest.raises(OutputExistsError, match="unfinished conversion"):
        _run(corpus, tmp_path / "out", resize="squash")
    calls.restore()
    res = _run(corpus, tmp_path / "out")
    assert res.shards_resumed == 2 and res.decoded == 40 - sum(
        s["samples"] for s in load_index(dest).shards if s["name"] in calls
    )
    assert _files(dest) == _files(tmp_path / "ref/v1/32")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_cli_run_resumes_byte_identical(tmp_path, sig):
    root = tmp_path / "c"
    rows = make_images(root, 120, size=(640, 480))
    manifest = write_manifest(root / "m.csv", rows)

    def command(out):
        return [
            sys.executable,
            "-m",
            "wds_tools",
            "convert",
            "--source",
            str(manifest),
            "--version",
            "v1",
            "--size",
            "64",
            "--out",
            str(out),
            "--shard-size",
            "6",
            "--workers",
            "1",
            "--quiet",
        ]

    cmd = command(tmp_path / "out")
    dest = tmp_path / "out/v1/64"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not list(dest.glob("*.tar")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert not (dest / "index.json").exists(), "the run finished before it could be interrupted"
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and b"run the same command again to resume" in err
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ref = subprocess.run(command(tmp_path / "ref"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stderr
    assert _files(dest) == _files(tmp_path / "ref/v1/64")
    assert not list(dest.glob(".*"))


def test_image_folder_source(tmp_path):
    from wds_tools.synth import jpeg_bytes, photo_like

    root = tmp_path / "photos"
    for i in range(6):
        label = ("cat", "dog")[i % 2]
        (root / label).mkdir(parents=True, exist_ok=True)
        photo_like(50, 40, i).save(root / label / f"p{i}.png") if i % 3 == 0 else (
            root / label / f"p{i}.jpg"
        ).write_bytes(jpeg_bytes(photo_like(50, 40, i)))
    res = _run(root, tmp_path / "out", val_fraction=0.0)
    assert res.samples_written == 6
    idx = load_index(res.out_dir)
    assert idx.classes == ["cat", "dog"] and idx.meta["build"]["source"]["kind"] == "image-folder"
    sample = next(iter(wds.WebDataset(res.splits["train"]["urls"], shardshuffle=False).decode()))
    assert sample["json"]["original_key"].split("/")[0] in ("cat", "dog")


def test_index_names_the_errors_file_when_only_the_scan_failed(tmp_path):
    """A file missing at the header scan (never sent to a shard task) is still named by the index."""
    root = tmp_path / "c"
    rows = make_images(root, 6) + [{"key": "missing", "path": "img/none.jpg", "label": "a"}]
    res = _run(write_manifest(root / "m.csv", rows), tmp_path / "out", max_errors="1")
    assert res.failed == 1 and Path(res.errors_file).is_file()
    assert load_index(res.out_dir).meta["errors_file"] == "errors.jsonl"


def test_keys_at_the_length_limit_are_written_and_read_by_every_reader(tmp_path):
    """95 characters is the limit: <key>.json then fills ustar's 100-byte name field exactly."""
    from wds_tools.convert.source import MAX_KEY_LENGTH
    from wds_tools.errors import InvalidKeyError

    assert MAX_KEY_LENGTH == 95
    rows = make_images(tmp_path / "c", 4)
    for i, r in enumerate(rows):
        r["key"] = f"{i}" * 95 if i < 2 else r["key"]
    out = Path(_run(write_manifest(tmp_path / "c" / "m.csv", rows), tmp_path / "out", val_fraction=0.0).out_dir)
    idx = load_index(out)
    tar = out / idx.shards[0]["name"]
    with tarfile.open(tar) as tf:
        names = tf.getnames()
    assert f"{'0' * 95}.json" in names and max(len(n) for n in names) == 100
    got = {s["__key__"]: s for s in wds.WebDataset(str(tar), shardshuffle=False, empty_check=False).decode()}
    assert {"0" * 95, "1" * 95} <= set(got) and got["0" * 95]["npy"].shape == (32, 32, 3)
    from training_adapter import make_loader

    for reader in ("auto", "stream"):  # ours, by offset and streaming
        ld = make_loader(out, batch_size=4, train=False, split="train", num_workers=0, return_keys=True, reader=reader)
        assert {k for *_, keys in ld for k in keys} == {r["key"] for r in rows}
    rows[0]["key"] = "x" * 96  # one over: refused, naming the row, before anything is written
    with pytest.raises(InvalidKeyError, match=r"line 2: 'x{96}'.*\{1,95\}"):
        _run(write_manifest(tmp_path / "c" / "m2.csv", rows), tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
    rows[0]["key"] = "long key " * 30  # --sanitize-keys never makes a key over the limit
    out3 = _run(write_manifest(tmp_path / "c" / "m3.csv", rows), tmp_path / "out3", sanitize_keys=True).out_dir
    keys = load_index(out3).samples.keys
    assert max(len(k) for k in keys) == 95 and len(set(keys)) == 4


def test_a_resumed_run_reports_its_own_rate_and_what_it_kept(corpus, tmp_path, interrupt_writes, monkeypatch):
    import wds_tools.convert.pipeline as pipeline

    written = interrupt_writes(2)
    with pytest.raises(KeyboardInterrupt):
        _run(corpus, tmp_path / "out")
    written.restore()
    res = _run(corpus, tmp_path / "out")
    kept = sum(s["samples"] for s in load_index(res.out_dir).shards if s["name"] in written)
    assert (res.shards_resumed, res.samples_resumed, res.decoded) == (2, kept, 40 - kept)
    assert (
        f"; {40 - kept} images in this run at {res.images_per_second:,.1f} images/s, {kept} images in 2 "
        "shards kept from an interrupted run)" in res.to_text()
    )
    assert res.images_per_second > 0
    # every shard done, killed before the index: the rerun converts nothing and says so, no "0.0 images/s"
    real = pipeline.finish_size
    monkeypatch.setattr(pipeline, "finish_size", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        _run(corpus, tmp_path / "out2")
    monkeypatch.setattr(pipeline, "finish_size", real)
    res = _run(corpus, tmp_path / "out2")
    assert (res.shards_resumed, res.samples_resumed, res.decoded) == (res.shards, 40, 0)
    text = res.to_text()
    assert f"all 40 images in {res.shards} shards kept from an interrupted run, this run wrote the index" in text
    assert "images/s" not in text


# ------------------------------------------------------------------ clinical sets as they come (issue 14)


def _cli(*args, cwd=None):
    from click.testing import CliRunner

    from wds_tools.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


HAM_OPTIONS = ("--key", "image_id", "--label", "dx", "--path", "images/{image_id}.jpg", "--group", "lesion_id")


def _splits_of_groups(folder: Path, column: str) -> dict:
    """group value -> the splits its samples are in, read from the shards' .json members."""
    found: dict = {}
    for shard in load_index(folder).shards:
        with tarfile.open(folder / shard["name"]) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    found.setdefault(json.loads(tf.extractfile(m).read())["meta"][column], set()).add(shard["split"])
    return found


def test_a_ham10000_metadata_file_through_the_cli(tmp_path):
    from conftest import write_ham

    manifest = write_ham(tmp_path / "ham", [3, 1, 2, 4, 1, 1, 2, 3, 1, 2])
    out = tmp_path / "out"
    res = _cli(
        "convert",
        "--source",
        manifest,
        *HAM_OPTIONS,
        "--stratify",
        "--val-fraction",
        "0.3",
        "--version",
        "v1",
        "--size",
        16,
        "--out",
        out,
        "--workers",
        1,
        "--shard-size",
        5,
        "--quiet",
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["samples_written"] == 20
    folder = out / "v1" / "16"
    idx = load_index(folder)
    assert idx.meta["format_version"] == 3 and idx.meta["build"]["group"] == "lesion_id"
    assert idx.meta["build"]["stratify"] is True
    assert idx.meta["metadata"] == [
        {"name": "lesion_id", "type": "string"},
        {"name": "dx_type", "type": "string"},
        {"name": "age", "type": "float"},
        {"name": "sex", "type": "string"},
        {"name": "localization", "type": "string"},
    ]
    # every manifest value round-trips, typed, in the sample's json and in the index
    rows = {r["image_id"]: r for r in __import__("csv").DictReader(open(manifest, encoding="utf-8"))}
    meta = idx.metadata
    for i, key in enumerate(idx.samples.keys):
        r = rows[key]
        want = {
            "lesion_id": r["lesion_id"],
            "dx_type": r["dx_type"],
            "age": float(r["age"]) if r["age"] else None,
            "sex": r["sex"],
            "localization": r["localization"],
        }
        assert {name: v.value(i) for name, v in meta.items()} == want
        assert idx.samples.source_path(i) == f"images/{key}.jpg"
    for shard in idx.shards:
        with tarfile.open(folder / shard["name"]) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    raw = tf.extractfile(m).read()
                    js = json.loads(raw)
                    r = rows[js["key"]]
                    assert js["meta"]["age"] == (float(r["age"]) if r["age"] else None)
                    assert js["meta"]["localization"] == r["localization"]
                    if r["localization"] in ("épaule", "頭皮"):
                        assert r["localization"].encode() in raw  # unicode as itself, not \u escapes
    assert all(len(s) == 1 for s in _splits_of_groups(folder, "lesion_id").values())
    assert set(idx.splits) == {"train", "val"}
    v = _cli("verify", folder, "--json")
    assert v.exit_code == 0 and json.loads(v.stdout)["ok"], v.output
    st = _cli("stats", folder, "--by", "localization", "--loader-workers", 1)
    assert st.exit_code == 0 and "train by localization (string): samples per class" in st.output
    assert "頭皮" in st.output and "groups of lesion_id: 10; each in one split" in st.output
    from wds_tools.inspect.stats.render import display_width

    table = st.output.split("train by localization (string): samples per class\n")[1].split("\n\n")[0]
    rows = [line for line in table.splitlines() if line.startswith("  ") and not line.startswith("  ...")]
    assert any("頭皮" in r for r in rows) and len({display_width(r) for r in rows}) == 1, table  # columns line up
    assert display_width("頭皮") == 4 and display_width("e\u0301") == 1 and display_width("back") == 4
    js = json.loads(_cli("stats", folder, "--by", "age", "--loader-workers", 1, "--json").stdout)
    assert js["by"]["values"][-1] is None and js["groups"] == {
        "column": "lesion_id",
        "groups": 10,
        "in_several_splits": [],
    }


def test_an_isic_train_csv_through_the_library(tmp_path):
    from conftest import write_isic

    manifest = write_isic(tmp_path / "isic", [4, 1, 3, 2, 5, 1, 2])
    res = convert(
        manifest,
        version="v1",
        size=16,
        out=tmp_path / "out",
        key="image_name",
        label="benign_malignant",
        path="train/{image_name}.jpg",
        group="patient_id",
        val_fraction=0.3,
        workers=1,
        progress=False,
    )
    assert res.samples_written == 18 and res.failed == 0
    folder = tmp_path / "out" / "v1" / "16"
    idx = load_index(folder)
    types = {c["name"]: c["type"] for c in idx.meta["metadata"]}
    assert types["target"] == "int" and types["age_approx"] == "float" and types["sex"] == "string"
    assert "benign_malignant" not in types and "image_name" not in types
    target = idx.metadata["target"]
    assert [idx.classes[int(lab)] for lab in idx.samples["label"]] == [
        "malignant" if target.value(i) else "benign" for i in range(len(idx.samples))
    ]
    assert all(len(s) == 1 for s in _splits_of_groups(folder, "patient_id").values())
    from training_adapter import make_loader

    for split in idx.splits:
        loader = make_loader(
            folder,
            batch_size=4,
            train=False,
            split=split,
            num_workers=0,
            return_keys=True,
            subset={"anatom_site_general_challenge": ["torso", None]},
        )
        keys = [k for _, _, ks in loader for k in ks]
        site = idx.metadata["anatom_site_general_challenge"]
        want = [
            k
            for i, k in enumerate(idx.samples.keys)
            if site.value(i) in ("torso", None) and idx.shards[int(idx.samples["shard"][i])]["split"] == split
        ]
        assert sorted(keys) == sorted(want)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ("--key", "image_idd", "--label", "dx", "--path", "images/{image_id}.jpg"),
            "missing column(s) image_idd: 'image_idd' (--key; did you mean 'image_id'?). The file's columns: lesion_id, "
            "image_id, dx, dx_type, age, sex, localization.",
        ),
        (
            ("--key", "image_id", "--label", "dx", "--path", "images/{image_id}.jpg", "--group", "lesionid"),
            "'lesionid' (--group; did you mean 'lesion_id'?)",
        ),
        (
            ("--key", "image_id", "--label", "dx", "--path", "images/{imageid}.jpg"),
            "--path 'images/{imageid}.jpg' names column 'imageid', which the file does not have; did you mean "
            "'image_id'?",
        ),
        ((), "missing column(s) key, label, path"),
        (
            ("--key", "image_id", "--label", "dx", "--path", "images/{image_id}.jpg", "--group", "dx"),
            "--group 'dx' is the --label column of ",
        ),
    ],
)
def test_column_errors_name_the_column_and_write_nothing(tmp_path, options, message):
    from conftest import write_ham

    manifest = write_ham(tmp_path / "ham", [1, 1])
    res = _cli(
        "convert", "--source", manifest, *options, "--version", "v1", "--size", 16, "--out", tmp_path / "out", "--quiet"
    )
    # a column the file lacks is a source error (1); two options naming one column, a usage error (2)
    assert res.exit_code == (2 if "is the --label column" in message else 1), res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


def test_a_template_giving_a_missing_file_skips_that_row_and_lists_it(tmp_path):
    from conftest import write_ham

    manifest = write_ham(tmp_path / "ham", [2, 2, 1])
    (tmp_path / "ham" / "images" / "ISIC_0000003.jpg").unlink()
    with open(manifest, "a", encoding="utf-8") as f:
        f.write("HAM_0000009,ISIC_0000099,nv,histo,40.0,male,\n")  # its image does not exist either
    res = convert(
        manifest,
        version="v1",
        size=16,
        out=tmp_path / "out",
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        max_errors=2,
        workers=1,
        progress=False,
    )
    assert res.samples_written == 4 and res.failed == 2
    errors = [json.loads(line) for line in (tmp_path / "out" / "v1" / "16" / "errors.jsonl").read_text().splitlines()]
    assert [(e["key"], e["path"], e["stage"]) for e in errors] == [
        ("ISIC_0000003", "images/ISIC_0000003.jpg", "scan"),
        ("ISIC_0000099", "images/ISIC_0000099.jpg", "scan"),
    ]
    assert "ISIC_0000003" not in load_index(tmp_path / "out" / "v1" / "16").samples.keys


def test_a_template_cell_left_empty_fails_its_row_like_a_bad_file(tmp_path):
    from conftest import write_ham

    manifest = write_ham(tmp_path / "ham", [2, 2])
    text = manifest.read_text(encoding="utf-8").splitlines()
    text[2] = text[2].replace(",follow_up,", ",,")  # dx_type of row 2 empty; the template names it
    for p in (tmp_path / "ham" / "images").glob("*.jpg"):
        for kind in ("histo", "follow_up", "consensus"):
            (tmp_path / "ham" / "images" / kind).mkdir(exist_ok=True)
            (tmp_path / "ham" / "images" / kind / p.name).write_bytes(p.read_bytes())
    manifest.write_text("\n".join(text) + "\n", encoding="utf-8")
    res = convert(
        manifest,
        version="v1",
        size=16,
        out=tmp_path / "out",
        key="image_id",
        label="dx",
        path="images/{dx_type}/{image_id}.jpg",
        max_errors=1,
        workers=1,
        progress=False,
    )
    assert res.samples_written == 3 and res.failed == 1
    (error,) = [json.loads(line) for line in (tmp_path / "out" / "v1" / "16" / "errors.jsonl").read_text().splitlines()]
    assert error == {
        "key": "ISIC_0000001",
        "path": "images//ISIC_0000001.jpg",
        "line": 3,
        "stage": "scan",
        "error": "column 'dx_type' is empty; --path 'images/{dx_type}/{image_id}.jpg' needs it",
    }
    idx = load_index(tmp_path / "out" / "v1" / "16")
    assert [c["name"] for c in idx.meta["metadata"]] == ["lesion_id", "dx_type", "age", "sex", "localization"]


def test_column_options_from_wds_tools_toml(tmp_path, monkeypatch):
    from conftest import write_ham

    root = tmp_path / "proj"
    write_ham(root / "ham", [2, 1, 3])
    (root / "wds-tools.toml").write_text(
        'source = "ham/HAM10000_metadata.csv"\nout = "shards"\n[convert]\n'
        'key = "image_id"\nlabel = "dx"\npath = "images/{image_id}.jpg"\n'
        'group = "lesion_id"\nstratify = true\nworkers = 1\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(root)
    res = _cli("convert", "--version", "v1", "--size", 16, "--quiet")
    assert res.exit_code == 0, res.output
    build = load_index(root / "shards" / "v1" / "16").meta["build"]
    assert build["columns"]["path"] == "images/{image_id}.jpg" and build["group"] == "lesion_id"
    assert build["stratify"] is True


def _json_key_sets(folder) -> dict[frozenset, list[str]]:
    """Every .json of a converted folder (read with tarfile): its set of keys -> the samples with it."""
    out: dict[frozenset, list[str]] = {}
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf:
                if m.name.endswith(".json"):
                    obj = json.loads(tf.extractfile(m).read())
                    out.setdefault(frozenset(obj), []).append(obj["key"])
    return out


def test_every_sample_of_a_conversion_has_the_same_json_keys(tmp_path):
    """FORMAT.md: optional fields are always present. Keys mapped by --sanitize-keys next to keys that
    are not (original_key: the key itself), and metadata with missing cells (meta: every column,
    null for missing): one key set per conversion."""
    from conftest import write_ham

    rows = make_images(tmp_path / "c", 12)
    for r in rows[::3]:
        r["key"] = "with space " + r["key"]  # mapped; the others are not
    folder = Path(_run(write_manifest(tmp_path / "c" / "m.csv", rows), tmp_path / "out", sanitize_keys=True).out_dir)
    sets = _json_key_sets(folder)
    assert list(sets) == [
        frozenset(
            {
                "classes_digest",
                "dataset_version",
                "fingerprint",
                "height",
                "key",
                "label",
                "original_key",
                "source_path",
                "width",
            }
        )
    ], sets
    originals = {}
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf:
                if m.name.endswith(".json"):
                    obj = json.loads(tf.extractfile(m).read())
                    originals[obj["key"]] = obj["original_key"]
    assert sum(k != o for k, o in originals.items()) == 4 and all(
        o == k for k, o in originals.items() if not o.startswith("with space")
    )
    manifest = write_ham(tmp_path / "ham", [2, 1, 3, 1, 2, 1])
    res = _cli(
        "convert",
        "--source",
        manifest,
        *HAM_OPTIONS,
        "--version",
        "v1",
        "--size",
        16,
        "--out",
        tmp_path / "hout",
        "--workers",
        1,
        "--quiet",
    )
    assert res.exit_code == 0, res.output
    sets = _json_key_sets(tmp_path / "hout" / "v1" / "16")
    assert len(sets) == 1 and "meta" in next(iter(sets)), sets


# --- phone photos and every file accounted for (issue 22, rows 2 and 15) ---


def _phone_folder(root: Path) -> list[tuple[str, np.ndarray]]:
    """An image folder with a HEIC (pillow-heif), an AVIF (Pillow), a .jfif, a .jpe, a JPEG and two non-images."""
    from PIL import Image

    from wds_tools.synth import jpeg_bytes

    pillow_heif = pytest.importorskip("pillow_heif")
    pillow_heif.register_heif_opener()
    (root / "cat").mkdir(parents=True)
    made = []
    for i, (name, fmt) in enumerate(
        [("IMG_0001.HEIC", "HEIF"), ("x.avif", "AVIF"), ("scan.jfif", "JPEG"), ("y.jpe", "JPEG"), ("z.jpg", "JPEG")]
    ):
        colour = (40 * i + 30, 200 - 30 * i, 90)
        im = Image.new("RGB", (40, 40), colour)
        if fmt == "JPEG":
            (root / "cat" / name).write_bytes(jpeg_bytes(im))
        else:
            im.save(root / "cat" / name, fmt, quality=95)
        made.append((name, np.array(colour)))
    (root / "cat" / "notes.txt").write_text("x")
    (root / "cat" / ".DS_Store").write_bytes(b"x")
    return made


def test_heic_avif_jfif_and_jpe_photos_convert_and_the_rest_is_listed(tmp_path):
    from click.testing import CliRunner

    from wds_tools.cli import cli

    made = _phone_folder(tmp_path / "photos")
    res = CliRunner().invoke(
        cli,
        [
            "convert",
            "--source",
            str(tmp_path / "photos"),
            "--version",
            "v1",
            "--size",
            "32",
            "--out",
            str(tmp_path / "out"),
            "--val-fraction",
            "0",
            "--workers",
            "1",
            "-q",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["samples_written"] == 5 and out["failed"] == 0
    assert sorted(s["path"] for s in out["skipped"]) == ["cat/.DS_Store", "cat/notes.txt"]
    pixels = {}
    for sample in wds.WebDataset(str(tmp_path / "out/v1/32/train-000000.tar"), shardshuffle=False).decode():
        pixels[sample["json"]["source_path"].split("/")[1]] = sample["npy"]
    for name, colour in made:  # a uniform colour survives each codec within a few levels
        assert np.abs(pixels[name].reshape(-1, 3).mean(axis=0) - colour).max() < 6, name
    text = CliRunner().invoke(
        cli,
        [
            "convert",
            "--source",
            str(tmp_path / "photos"),
            "--version",
            "v1",
            "--size",
            "32",
            "--out",
            str(tmp_path / "out"),
            "--val-fraction",
            "0",
            "-q",
        ],
    )
    assert "skipped 2 files of the image folder" in text.output and "cat/notes.txt: extension '.txt'" in text.output


def test_a_heic_without_the_extra_fails_naming_it(tmp_path):
    """In a fresh interpreter where pillow_heif cannot be imported, a HEIC listed in a manifest fails at
    the scan with the extra to install (not "the format is not recognised")."""
    _phone_folder(tmp_path / "photos")
    write_manifest(
        tmp_path / "photos" / "m.csv",
        [{"key": "h", "path": "cat/IMG_0001.HEIC", "label": "cat"}, {"key": "j", "path": "cat/z.jpg", "label": "cat"}],
    )
    code = (
        "import sys, json; sys.modules['pillow_heif'] = None\n"
        "from wds_tools.convert import convert\n"
        f"r = convert({str(tmp_path / 'photos' / 'm.csv')!r}, version='v1', size=32, out={str(tmp_path / 'o')!r},"
        " workers=1, progress=False, max_errors='1', val_fraction=0.0)\n"
        "print(open(r.errors_file).read())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.splitlines()[0])
    assert line["key"] == "h" and line["stage"] == "scan"
    assert "HEIC/HEIF" in line["error"] and "pip install pillow-heif==1.8.1" in line["error"]


def test_a_16_bit_png_squeezed_near_black_is_warned_with_its_key(tmp_path):
    """12-bit data in a 16-bit PNG without sBIT keeps the top 8 of 16 bits (0..15): exit 0, but the key is
    named as a warning in the summary, --json and errors.jsonl (stage pixels), and not counted as failed."""
    from PIL import Image

    root = tmp_path / "c"
    rows = make_images(root, 4)
    ramp = (np.arange(48 * 48).reshape(48, 48) * 4095 // (48 * 48 - 1)).astype(np.uint16)  # 0..4095
    Image.fromarray(ramp).save(root / "img" / "dark16.png")
    rows.append({"key": "dark16", "path": "img/dark16.png", "label": "a"})
    res = _run(write_manifest(root / "m.csv", rows), tmp_path / "out", val_fraction=0.0)
    assert res.samples_written == 5 and res.failed == 0
    assert [w["key"] for w in res.narrow_pixels] == ["dark16"]
    lines = [json.loads(line) for line in Path(res.errors_file).read_text().splitlines()]
    assert [(e["key"], e["stage"]) for e in lines] == [("dark16", "pixels")] and "0..15" in lines[0]["warning"]
    assert "warning: 1 image stored with pixels spanning less than a sixteenth" in res.to_text()
    again = _run(write_manifest(root / "m.csv", rows), tmp_path / "out", val_fraction=0.0)
    assert again.already_complete and again.failed == 0 and [w["key"] for w in again.narrow_pixels] == ["dark16"]


def test_an_image_folders_errors_carry_no_line_and_a_manifests_do(tmp_path):
    """Issue 32: errors.jsonl gave an image folder's files a "line" (their position in the walk), which names
    nothing a user can open; a folder's entries have their path alone, ordered by path (FORMAT.md, errors.jsonl)."""
    from PIL import Image

    from wds_tools.synth import jpeg_bytes, photo_like

    photos = tmp_path / "photos"
    (photos / "cat").mkdir(parents=True)
    (photos / "dog").mkdir()
    for i, name in enumerate(["cat/a.jpg", "cat/b.jpg", "dog/c.jpg", "dog/d.jpg"]):
        (photos / name).write_bytes(jpeg_bytes(photo_like(40, 30, seed=i)))
    (photos / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    (photos / "cat" / "a-text.png").write_bytes(b"\x89PNG but no more")
    ramp = (np.arange(48 * 48).reshape(48, 48) * 4095 // (48 * 48 - 1)).astype(np.uint16)  # a narrow range
    Image.fromarray(ramp).save(photos / "cat" / "dark16.png")
    res = _run(photos, tmp_path / "out", val_fraction=0.0, max_errors="2")
    entries = [json.loads(line) for line in Path(res.errors_file).read_text().splitlines()]
    assert [(e["path"], e["stage"]) for e in entries] == [
        ("cat/a-text.png", "scan"),
        ("cat/dark16.png", "pixels"),
        ("dog/broken.jpg", "scan"),
    ]
    assert all("line" not in e for e in entries)
    assert [set(w) for w in res.narrow_pixels] == [{"key", "path", "stage", "warning"}]  # --json alike
    rows = make_images(tmp_path / "m", 3)
    (tmp_path / "m" / rows[1]["path"]).write_bytes(b"not a jpeg")
    res = _run(write_manifest(tmp_path / "m" / "m.csv", rows), tmp_path / "out2", max_errors="1")
    (entry,) = [json.loads(line) for line in Path(res.errors_file).read_text().splitlines()]
    assert entry["line"] == 3  # a manifest's row: its CSV line (the header is line 1)


def test_a_folder_converted_before_the_colour_rule_reads_as_colour_raw(corpus, tmp_path):
    """An index.json whose decode has no colour (every conversion before it) was made ignoring ICC
    profiles: a rerun with the default --colour srgb is refused naming --colour raw; with it, nothing to do."""
    from wds_tools.convert.decode import DecodeSettings

    res = _run(corpus, tmp_path / "out")
    index = Path(res.out_dir) / "index.json"
    meta = json.loads(index.read_text())
    assert meta["decode"].pop("colour") == "srgb"
    index.write_text(json.dumps(meta))
    with pytest.raises(OutputExistsError, match=r"decode\.colour: existing 'raw', requested 'srgb'.*--colour raw"):
        _run(corpus, tmp_path / "out")
    assert _run(corpus, tmp_path / "out", decode=DecodeSettings(colour="raw")).already_complete


def test_integer_labels_past_a_doubles_digits_survive_conversion_and_loading(tmp_path):
    """Issue 32, point 8: 12345678901234567 and ...568 were one class and 9007199254740993 was ...992 in
    ``classes``, every .json and the loader's labels; a metadata column of such an integer and 1.5 was
    float, so its .json said 9007199254740992.0. Read back with stock json, tarfile and the loader."""
    from training_adapter import make_loader

    labels = ["cat", "12345678901234567", "12345678901234568", "9007199254740993", "99999999999999999999", "7"]
    rows = make_images(tmp_path / "c", len(labels))
    ids = ["9007199254740993", "1.5", "", "3", "12345678901234567", "-4"]
    for r, lab, id_ in zip(rows, labels, ids):
        r["label"], r["split"], r["id"] = lab, "train", id_
    manifest = write_manifest(tmp_path / "c" / "m.csv", rows, ("key", "path", "label", "split", "id"))
    _run(manifest, tmp_path / "out")
    dest = tmp_path / "out" / "v1" / "32"
    index = json.loads((dest / "index.json").read_text())
    assert index["classes"] == sorted(labels)
    assert index["metadata"] == [{"name": "id", "type": "string"}]  # kept as text, every digit
    want = {r["key"]: r["label"] for r in rows}
    got, meta = {}, {}
    for shard in index["shards"]:
        with tarfile.open(dest / shard["name"]) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    sample = json.loads(tf.extractfile(m).read())
                    got[m.name[:-5]], meta[m.name[:-5]] = sample["label"], sample["meta"]["id"]
                elif m.name.endswith(".cls"):
                    assert index["classes"][int(tf.extractfile(m).read())] == want[m.name[:-4]]
    assert got == want
    assert meta == {r["key"]: r["id"] or None for r in rows}
    loader = make_loader(dest, batch_size=2, train=False, split="train", num_workers=0, return_keys=True)
    seen = {k: loader.classes[int(y)] for _, ys, keys in loader for y, k in zip(ys, keys)}
    assert seen == want


# --- the summary names its failures (issue 38, point 15) ---


def test_the_summary_names_the_first_ten_failures_with_their_reasons_in_text_and_json(tmp_path):
    """13 of 40 sources fail (missing, truncated, not an image) at the scan and at decoding: the text
    names the first ten with line, key, path and reason and counts the rest; --json has the same ten,
    equal to errors.jsonl's first ten lines (read here as plain JSON); a rerun (nothing to do) too."""
    from click.testing import CliRunner

    from wds_tools.cli import cli

    rows = make_images(tmp_path, 40)
    for i in range(0, 39, 3):  # 13 rows
        f = tmp_path / rows[i]["path"]
        if i % 2:
            f.unlink()
        else:
            f.write_bytes(f.read_bytes()[: 1000 if i % 4 else 40])  # cut: found at decoding, or at the header scan
    manifest = write_manifest(tmp_path / "m.csv", rows)
    args = ["convert", "--source", str(manifest), "--version", "v1", "--size", "16", "--out", str(tmp_path / "out")]
    args += ["--workers", "1", "--max-errors", "50%", "-q"]
    for run in (CliRunner().invoke(cli, args), CliRunner().invoke(cli, args)):  # converted, then nothing to do
        assert run.exit_code == 0, run.output
        errors = [json.loads(x) for x in (tmp_path / "out/v1/16/errors.jsonl").read_text().splitlines()]
        assert len(errors) == 13 and [e["key"] for e in errors] == [f"s{i:04d}" for i in range(0, 39, 3)]
        text = run.output.splitlines()
        at = next(i for i, line in enumerate(text) if line.startswith("  failed: 13 "))
        assert text[at + 1 : at + 12] == [
            f"    line {e['line']}: {e['key']} ({e['path']}): {e['error']}" for e in errors[:10]
        ] + ["    ... and 3 more"]
        assert {e["stage"] for e in errors} == {"scan", "decode"}  # both kinds are named
        as_json = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
        assert as_json["failed"] == 13 and as_json["failures"] == errors[:10]


def test_the_base_of_an_incremental_conversion_is_said_first_with_how_to_choose_another(tmp_path):
    """An experimental v1-leak converted after v1 is the newest version, so v2 takes it as its base:
    said on stderr before any work and in the summary's first line, with --from and --no-reuse; with
    --from v1, that is said instead (issue 38, point 17)."""
    from click.testing import CliRunner

    from wds_tools.cli import cli

    manifest = write_manifest(tmp_path / "m.csv", make_images(tmp_path, 12))
    base = ["convert", "--source", str(manifest), "--size", "16", "--out", str(tmp_path / "out"), "--workers", "1"]
    for version in ("v1", "v1-leak"):
        assert CliRunner().invoke(cli, [*base, "--version", version, "-q"]).exit_code == 0
    run = CliRunner().invoke(cli, [*base, "--version", "v2"])
    assert run.exit_code == 0, run.output
    said = "base v1-leak, the newest earlier version with these settings (--from V picks another, --no-reuse none)"
    assert run.stderr.splitlines()[0] == f"convert v2/16: {said}"
    assert run.stdout.splitlines()[0].endswith(f"; {said}") and run.stdout.startswith("Converted 12 images")
    run = CliRunner().invoke(cli, [*base, "--version", "v3", "--from", "v1", "-q", "--json"])
    assert json.loads(run.stdout)["base"] == "v1" and json.loads(run.stdout)["base_rule"] == "from"
    run = CliRunner().invoke(cli, [*base, "--version", "v4", "--from", "v1", "-q"])
    assert run.stdout.splitlines()[0].endswith("; base v1 (--from; --no-reuse for none)") and not run.stderr


def test_another_shard_size_is_refused_in_samples_per_shard_and_megabytes(tmp_path):
    """The default (256 MiB a shard) made samples per shard; a rerun with --shard-size 64 is refused in
    those units, not as a bare 'existing 37449, requested 64' (issue 38, point 18). Worked by hand at
    32 px: a sample takes four 512-byte headers, the .npy (128 + 3,072 bytes, padded to 3,584) and one
    block each for .cls, .i32 and .json: 7,168 bytes; 2**28 // 7,168 = 37,449 samples, 268.4 MB."""
    manifest = write_manifest(tmp_path / "m.csv", make_images(tmp_path, 4))
    convert(manifest, version="v1", size=32, out=tmp_path / "out", workers=1, progress=False)
    with pytest.raises(
        OutputExistsError,
        match=r"build\.shard_size: existing 37,449 samples per shard \(about 268\.4 MB at 32 px\), requested 64 "
        r"samples per shard \(about 0\.5 MB at 32 px\)",
    ):
        convert(manifest, version="v1", size=32, out=tmp_path / "out", workers=1, progress=False, shard_size=64)
