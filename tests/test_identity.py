"""dataset.identity through every reader: shards of different datasets (v1 and a v2 that added a class,
two real conversions) and patterns naming part of a split are refused by the loader (both readers),
``stats`` and ``verify`` with named messages, accepted when allowed; copies of one dataset (a
mirror) are one dataset."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import make_images, write_manifest
from oracle import read_stored
from shardkit import copy_tars

from training_adapter import ShardIndexDataset, load_config, make_loader
from wds_tools.cli import cli
from wds_tools.convert import convert
from wds_tools.dataset.identity import Gap, dataset_key, differences
from wds_tools.dataset.resolve import resolve
from wds_tools.errors import OptionError
from wds_tools.inspect.stats import compute_stats
from wds_tools.inspect.verify import verify

MIXED = r"these shards belong to 2 different datasets, which cannot be read as one set"


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict[str, Path]:
    """v1: 30 JPEGs (640x480) in classes a, b, c (every 6th in val), 16 px, 4 per shard (7 train + 2 val shards);
    v2: the same rows and 3 more of a new class ``A``, which sorts first, so every class index shifts;
    v1 again at 24 px; and a copy of v1 elsewhere (a mirror)."""
    root = tmp_path_factory.mktemp("mixing")
    # 640x480: 10x7 colour cells, detail enough to hash at 16 px (a 96x72 one is a 2x2 grid interpolated:
    # too flat to hash, docs/FORMAT.md, and stats would warn about it)
    rows = make_images(root / "c", 30, size=(640, 480))
    for i, r in enumerate(rows):
        r["split"] = "val" if i % 6 == 0 else "train"
    added = make_images(root / "c" / "new", 3, classes=("A",), size=(640, 480), seed=9)
    for r in added:
        r.update(key="n" + r["key"], path="new/" + r["path"], split="train")
    m1 = write_manifest(root / "c" / "v1.csv", rows)
    m2 = write_manifest(root / "c" / "v2.csv", rows + added)
    out = root / "out"
    for manifest, version, size in ((m1, "v1", 16), (m2, "v2", 16), (m1, "v1", 24)):
        convert(manifest, version=version, size=size, out=out, shard_size=4, workers=1, progress=False)
    mirror = shutil.copytree(out / "v1" / "16", root / "mirror" / "v1" / "16")
    return {
        "v1": out / "v1" / "16",
        "v2": out / "v2" / "16",
        "v1_24": out / "v1" / "24",
        "mirror": mirror,
        "root": root,
    }


def tars(folder: Path, split: str) -> list[Path]:
    return sorted(folder.glob(f"{split}-*.tar"))


def loaded(loader) -> list[tuple[str, int, bytes]]:
    """(key, label, pixels) of every sample a loader yields, in order."""
    out = []
    for images, labels, keys in loader:
        for img, label, key in zip(images, labels, keys):
            out.append((key, int(label), img.permute(1, 2, 0).contiguous().numpy().tobytes()))
    return out


def stored(*folders_splits) -> Counter:
    """(key, label, pixels) of every sample in the tars, read with tarfile, as a multiset."""
    c: Counter = Counter()
    for folder, split in folders_splits:
        for key, s in read_stored(tars(folder, split)).items():
            c[(key, s.label, s.pixels.tobytes())] += 1
    return c


def test_the_fixture_is_what_the_tests_say(versions):
    v1 = json.loads((versions["v1"] / "index.json").read_text())
    v2 = json.loads((versions["v2"] / "index.json").read_text())
    assert v1["classes"] == ["a", "b", "c"] and v2["classes"] == ["A", "a", "b", "c"]
    assert [len(tars(versions["v1"], s)) for s in ("train", "val")] == [7, 2]
    a1, a2 = read_stored(tars(versions["v1"], "train")), read_stored(tars(versions["v2"], "train"))
    assert a1["s0001"].label == 1 and a2["s0001"].label == 2  # class b: the same key, another label


# ------------------------------------------------------------------ versions that cannot be mixed


def mixed_specs(v: dict[str, Path]) -> list:
    return [
        f"{v['v1']}/train-{{000000..000006}}.tar::{v['v2']}/train-{{000000..000006}}.tar",
        [str(v["v1"]), str(v["v2"])],
        f"{v['root']}/out/{{v1,v2}}/16/train-000000.tar",
    ]


def test_the_resolver_refuses_mixed_versions_naming_both(versions):
    v1i, v2i = versions["v1"] / "index.json", versions["v2"] / "index.json"
    for spec in mixed_specs(versions):
        with pytest.raises(OptionError) as e:
            resolve(spec, split="train", allow_partial=True)
        msg = str(e.value)
        assert MIXED in msg
        assert f"[1] {v1i} (dataset_version 'v1', 16 px, 3 classes)" in msg
        assert f"[2] {v2i} (dataset_version 'v2', 16 px, 4 classes)" in msg
        assert (
            "dataset_version 'v1' / 'v2'; classes: 3 / 4; A only in [2]; every one of the 3 shared classes "
            "has another index ('a' 0 / 1, 'b' 1 / 2, 'c' 2 / 3): the same label means different classes" in msg
        )
        assert "build.source.rows 30 / 33" in msg and "pass allow_mixed=True" in msg and "--allow-mixed" in msg
    s = resolve(mixed_specs(versions)[1], split="train", allow_mixed=True)
    assert [json.dumps(m["classes"]) for m in s.datasets] == ['["a", "b", "c"]', '["A", "a", "b", "c"]']
    assert s.names is None and s.raw["dataset_version"] == "v1"  # no one index lists them all


@pytest.mark.parametrize("reader", ["auto", "index", "stream"])
def test_make_loader_refuses_mixed_versions(versions, reader):
    for spec in mixed_specs(versions)[:2]:
        with pytest.raises(OptionError, match=MIXED + r"(.|\n)*classes: 3 / 4; A only in \[2\]"):
            make_loader(spec, batch_size=4, train=False, split="train", num_workers=0, reader=reader)
    with pytest.raises(OptionError, match=MIXED):
        ShardIndexDataset([str(versions["v1"]), str(versions["v2"])])


def test_allowed_mixed_versions_stream_every_sample_with_its_own_label(versions):
    """allow_mixed=True: the streaming reader reads both sets as they are: every sample of each, its
    label the .cls of its own shard (the same image has label 1 in v1's shards, 2 in v2's), and the
    first index's mean/std; the index reader cannot read them."""
    v1, v2 = versions["v1"], versions["v2"]
    for workers in (0, 2):
        ld = make_loader(
            [str(v1), str(v2)],
            batch_size=4,
            train=False,
            split="train",
            num_workers=workers,
            return_keys=True,
            allow_mixed=True,
        )
        assert ld.dataset.index is None and ld.mean == json.loads((v1 / "index.json").read_text())["mean"]
        got = loaded(ld)
        assert Counter(got) == stored((v1, "train"), (v2, "train"))
        labels = {(k, lab) for k, lab, _ in got if k == "s0001"}
        assert labels == {("s0001", 1), ("s0001", 2)}
    with pytest.raises(OptionError, match="reader=index needs the index reader, but no index.json lists these"):
        make_loader([str(v1), str(v2)], batch_size=4, train=False, num_workers=0, reader="index", allow_mixed=True)


def test_allowed_mixed_sizes_are_refused_before_reading(versions):
    spec = [str(versions["v1"]), str(versions["v1_24"])]
    with pytest.raises(OptionError, match=r"\[1\] vs \[2\]: size 16 / 24\n"):
        make_loader(spec, batch_size=4, train=False, num_workers=0)
    with pytest.raises(
        OptionError,
        match=r"allow_mixed=True, but these datasets hold images of 16 px and 24 px, "
        r"which cannot share a batch",
    ):
        make_loader(spec, batch_size=4, train=False, num_workers=0, allow_mixed=True)
    with pytest.raises(OptionError, match="allow_mixed='yes': expected True or False"):
        make_loader(str(versions["v1"]), batch_size=4, train=False, num_workers=0, allow_mixed="yes")


def test_config_dataset_block_takes_allow_mixed_and_allow_partial(versions, tmp_path):
    cfg = tmp_path / "train.yaml"
    v1, v2 = versions["v1"], versions["v2"]
    cfg.write_text(
        f"dataset:\n  train_urls: [{v1}, {v2}]\n  val_urls: {v1}/val-000000.tar\n"
        f"  batch_size: 4\n  num_workers: 0\n  augment: {{crop: false}}\n"
    )
    ds = load_config(cfg).dataset
    with pytest.raises(OptionError, match=MIXED):
        ds.train_loader()
    with pytest.raises(OptionError, match="names 1 of the 2 val shards of .*; missing: val-000001.tar"):
        ds.val_loader()
    cfg.write_text(cfg.read_text() + "  allow_mixed: true\n  allow_partial: true\n")
    ds = load_config(cfg).dataset
    assert sum(len(b[1]) for b in ds.train_loader(drop_last=False)) == 25 + 28
    assert sum(len(b[1]) for b in ds.val_loader()) == 3


def test_stats_and_verify_refuse_mixed_versions(versions):
    spec = f"{versions['v1']}::{versions['v2']}"
    for run in (lambda **kw: compute_stats(spec, **kw), lambda **kw: verify(spec, **kw)):
        with pytest.raises(OptionError, match=MIXED + r"(.|\n)*'a' 0 / 1, 'b' 1 / 2, 'c' 2 / 3"):
            run()
        with pytest.raises(OptionError, match=MIXED):
            run(scan=True)
        with pytest.raises(
            OptionError,
            match=r"the shards are in several folders .*; give one shards folder at a "
            r"time \(or read their tars as one set: --scan\)",
        ):
            run(allow_mixed=True)
    runner = CliRunner()
    for cmd in ("stats", "verify"):
        res = runner.invoke(cli, [cmd, spec])
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert MIXED in res.output and "dataset_version 'v1' / 'v2'" in res.output and "--allow-mixed" in res.output


def test_stats_and_verify_scan_allowed_mixed_versions_as_one_set(versions):
    """--scan --allow-mixed reads the tars of both as one set, as any reader of them would: every
    shard counted, each named by its URL, and verify reports the keys the two sets share."""
    v1, v2 = versions["v1"], versions["v2"]
    spec = f"{v1}::{v2}"
    st = compute_stats(spec, scan=True, allow_mixed=True)
    assert st.shards == 18 and st.samples == 30 + 33 and st.root == spec
    assert str(v2 / "train-000006.tar") in st.splits["train"].shard_names
    report = verify(spec, scan=True, allow_mixed=True)
    assert not report.ok and {p.kind for p in report.problems} == {"duplicate_key"}
    named = [p for p in report.problems if p.key]  # the first 20 of the 30 keys both hold, in both shards
    assert len(named) == 40 and all(str(v1) in p.message and str(v2) in p.message for p in named)
    assert report.problems[-1].message == "... and 10 more duplicated keys"
    res = CliRunner().invoke(cli, ["verify", spec, "--scan", "--allow-mixed", "--json"])
    assert res.exit_code == 3 and len(json.loads(res.stdout)["bad_samples"]) == 20


# ------------------------------------------------------------------ patterns that cannot be partial


def test_make_loader_refuses_a_partial_pattern_naming_the_missing(versions):
    v1 = versions["v1"]
    spec = f"{v1}/train-{{000000..000002}}.tar"
    for reader in ("auto", "index", "stream"):
        with pytest.raises(
            OptionError,
            match=rf"names 3 of the 7 train shards of {v1}/index.json; missing: "
            rf"train-000003.tar, train-000004.tar, train-000005.tar and 1 more "
            rf"\(4 in all\)\. It would read part of the split(.|\n)*allow_partial=",
        ):
            make_loader(spec, batch_size=4, train=False, num_workers=0, reader=reader)
    both = f"{v1}/val-000001.tar::{v1}/train-{{000001..000006}}.tar"  # two splits, each in part
    with pytest.raises(
        OptionError,
        match=r"names 6 of the 7 train shards .*missing: train-000000.tar; names 1 of "
        r"the 2 val shards .*missing: val-000000.tar\.",
    ):
        make_loader(both, batch_size=4, train=False, num_workers=0)


@pytest.mark.parametrize("reader", ["index", "stream"])
def test_allowed_partial_pattern_reads_exactly_its_shards(versions, reader):
    v1 = versions["v1"]
    ld = make_loader(
        f"{v1}/train-{{000000..000002}}.tar",
        batch_size=4,
        train=False,
        num_workers=0,
        return_keys=True,
        reader=reader,
        allow_partial=True,
        shuffle_shards=False,
    )
    want: Counter = Counter()
    for key, s in read_stored(tars(v1, "train")[:3]).items():
        want[(key, s.label, s.pixels.tobytes())] += 1
    assert Counter(loaded(ld)) == want and sum(want.values()) == 12


def test_whole_splits_need_no_option(versions):
    v1 = versions["v1"]
    for spec in (
        f"{v1}/train-{{000000..000006}}.tar",
        str(v1),
        f"{v1}/val-{{000000..000001}}.tar::{v1}/train-{{000000..000006}}.tar",
        f"{v1}/train-{{000000..000003}}.tar::{v1}/train-{{000004..000006}}.tar",
    ):
        assert resolve(spec).gaps == []
    assert (
        sum(
            len(b[1])
            for b in make_loader(f"{v1}/train-{{000000..000006}}.tar", batch_size=4, train=False, num_workers=0)
        )
        == 25
    )


def test_stats_and_verify_warn_about_a_partial_pattern(versions):
    """stats and verify answer about the shards named (a legitimate question), and say which of
    the split's shards the answer leaves out."""
    v1 = versions["v1"]
    spec = f"{v1}/train-{{000000..000002}}.tar"
    missing = (
        "names 3 of the 7 train shards; missing: train-000003.tar, train-000004.tar, train-000005.tar "
        "and 1 more (4 in all)"
    )
    st = compute_stats(spec)
    assert st.shards == 3 and st.warnings[0] == (
        f"the spec {missing}: shard and sample figures are of the named shards only (mean/std are the index's)"
    )
    report = verify(spec, quick=True)
    assert report.ok and report.shards == 3
    assert report.warnings[0] == f"the spec {missing}: only the named shards were checked"
    runner = CliRunner()
    for cmd in ("stats", "verify"):
        res = runner.invoke(cli, [cmd, spec])
        assert res.exit_code == 0 and f"warning: the spec {missing}" in res.output
    whole = compute_stats(v1)  # no note of a part; its only warnings are of classes without val samples
    assert whole.notes == [] and all(w.startswith("class '") for w in whole.warnings)
    assert compute_stats(f"{v1}/train-{{000000..000006}}.tar").notes == []


# ------------------------------------------------------------------ copies of one dataset


def test_a_mirror_is_the_same_dataset(versions):
    v1, mirror = versions["v1"], versions["mirror"]
    halves = [f"{v1}/train-{{000000..000003}}.tar", f"{mirror}/train-{{000004..000006}}.tar"]
    for spec in ("::".join(halves), halves):
        s = resolve(spec)
        assert len(s) == 7 and s.gaps == [] and len(s.datasets) == 1 and s.counts == resolve(v1, split="train").counts
        ld = make_loader(spec, batch_size=4, train=False, num_workers=0, return_keys=True)
        assert Counter(loaded(ld)) == stored((v1, "train"))  # every sample once
    with pytest.raises(
        OptionError,
        match=rf"names 6 of the 7 train shards of {v1}/index.json; missing: "
        r"train-000006.tar\.",
    ):  # a mirror's shards count for the one dataset
        make_loader([halves[0], f"{mirror}/train-{{000004..000005}}.tar"], batch_size=4, train=False, num_workers=0)


def test_converted_again_from_a_changed_image_is_another_dataset(versions, tmp_path):
    """The same manifest (so the same version, classes and source digest) with one image's bytes
    changed: every index field but the shards agrees, and the shards do not."""
    src = shutil.copytree(versions["root"] / "c", tmp_path / "c")
    (src / "img" / "s0001.jpg").write_bytes((src / "img" / "s0002.jpg").read_bytes())
    convert(src / "v1.csv", version="v1", size=16, out=tmp_path / "out", shard_size=4, workers=1, progress=False)
    again = tmp_path / "out" / "v1" / "16"
    with pytest.raises(
        OptionError,
        match=r"\[1\] vs \[2\]: shards: 1 of 9 hold other bytes or samples \(first: "
        r"train-00000\d.tar\), e.g. converted again from changed images",
    ):
        make_loader(
            f"{versions['v1']}/train-{{000000..000003}}.tar::{again}/train-{{000004..000006}}.tar",
            batch_size=4,
            train=False,
            num_workers=0,
        )


def test_shards_without_an_index_are_not_compared(versions, tmp_path):
    bare = copy_tars(versions["v2"], tmp_path / "bare")
    s = resolve(f"{versions['v1']}/train-{{000000..000006}}.tar::{bare}/train-{{000000..000006}}.tar")
    assert len(s) == 14 and len(s.datasets) == 1 and s.counts is None


# ------------------------------------------------------------------ the messages' parts


def test_class_difference():
    """The classes part of ``differences``: names only in one list, shared names at another index."""

    def class_difference(a: list, b: list, na: str = "[1]", nb: str = "[2]") -> str | None:
        found = differences({"classes": a}, {"classes": b}, na, nb)
        assert len(found) <= 1
        return found[0] if found else None

    assert class_difference(["a", "b"], ["a", "b"]) is None
    assert class_difference(["a", "b", "c"], ["b", "a", "c"]) == (
        "classes: 3 / 3; 2 of the 3 shared classes has another index ('a' 0 / 1, 'b' 1 / 0): the same label "
        "means different classes"
    )
    assert class_difference(["a", "b", "c"], ["a", "c"]) == (
        "classes: 3 / 2; b only in [1]; 1 of the 2 shared classes has another index ('c' 2 / 1): the same label "
        "means different classes"
    )
    assert class_difference(["a", "b"], ["a", "b", "z"], "v1", "v2") == "classes: 2 / 3; z only in v2"
    names = [f"c{i}" for i in range(6)]
    assert class_difference(names, ["new", *names]).endswith(
        "every one of the 6 shared classes has another index ('c0' 0 / 1, 'c1' 1 / 2, 'c2' 2 / 3, and 3 more): "
        "the same label means different classes"
    )
    assert class_difference(["a,b"], ["x"]) == "classes: 1 / 1; x only in [2]; 'a,b' only in [1]"


def test_differences_and_identity(versions):
    meta = json.loads((versions["v1"] / "index.json").read_text())
    moved = {
        **meta,
        "build": {**meta["build"], "source_path": "elsewhere/v1.csv", "base": "v0"},
        "created_by": "wds-tools 9",
        "decoder_versions": {"pillow": "0"},
    }
    assert differences(meta, moved) == [] and dataset_key(meta) == dataset_key(moved)  # provenance only
    other = {
        **meta,
        "resize": "pad",
        "decode": {**meta["decode"], "filter": "bicubic"},
        "build": {**meta["build"], "shard_size": 8},
    }
    assert differences(meta, other) == [
        "resize 'center-crop' / 'pad'",
        "decode.filter 'lanczos' / 'bicubic'",
        "build.shard_size 4 / 8",
    ]


def test_gap_describe():
    g = Gap(
        "x/index.json",
        "train",
        2,
        7,
        ("train-000002.tar", "train-000003.tar", "train-000004.tar", "train-000005.tar", "train-000006.tar"),
    )
    assert g.describe() == (
        "names 2 of the 7 train shards of x/index.json; missing: train-000002.tar, "
        "train-000003.tar, train-000004.tar and 2 more (5 in all)"
    )
    assert g.describe(where=False).startswith("names 2 of the 7 train shards; missing: ")
    assert np.array(g.to_dict()["missing"]).size == 5


# ------------------------------------------------------------------ without an index: the samples' .json


# workers=0 first, then forked workers: this order once made a worker fail with CPython 3.11's "SystemError: AST
# constructor recursion depth mismatch" in numpy's header parse; format.npy.image_side no longer parses our headers
@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_bare_tars_refuses_samples_of_another_dataset_naming_both_shards(versions, tmp_path, workers):
    """Bare copies of v1's and v2's train tars (no index to compare): each sample's .json names its
    dataset, so the streaming reader refuses the first v2 sample, naming its shard and the first
    shard's; allow_mixed=True reads every sample of both with its own label."""
    b1, b2 = copy_tars(versions["v1"], tmp_path / "b1"), copy_tars(versions["v2"], tmp_path / "b2")
    spec = [str(p) for p in tars(b1, "train") + tars(b2, "train")]
    v1 = json.loads((versions["v1"] / "index.json").read_text())
    v2 = json.loads((versions["v2"] / "index.json").read_text())
    ld = make_loader(spec, batch_size=4, train=False, num_workers=workers, return_keys=True)
    assert ld.dataset.index is None
    with pytest.raises(
        Exception,
        match=(
            rf"b2/train-\d+\.tar: byte \d+: sample '\w+' has dataset_version 'v2', classes_digest "
            rf"'{v2['classes_digest']}', but the first sample \('\w+' in .*b1/train-000000\.tar\) has "
            rf"dataset_version 'v1', classes_digest '{v1['classes_digest']}': these shards are of different "
            r"datasets .*allow_mixed=True"
        ),
    ):
        loaded(ld)
    ld = make_loader(spec, batch_size=4, train=False, num_workers=workers, return_keys=True, allow_mixed=True)
    assert Counter(loaded(ld)) == stored((v1_ := versions["v1"], "train"), (versions["v2"], "train"))
    one = make_loader(
        [str(p) for p in tars(b2, "train")], batch_size=4, train=False, num_workers=workers, return_keys=True
    )  # one dataset: no option needed
    assert Counter(loaded(one)) == stored((versions["v2"], "train"))
    assert v1_ == versions["v1"]


def test_streaming_refuses_version_1_shards_among_version_2_shards(versions, tmp_path):
    """Format version 1 samples have no dataset fields: mixed with version 2's they are refused too."""
    from test_golden import golden_folder

    old = copy_tars(golden_folder(tmp_path, 1), tmp_path / "old")
    spec = [str(p) for p in tars(versions["v2"], "train")[:1] + tars(old, "train")]
    ld = make_loader(spec, batch_size=2, train=False, num_workers=0, return_keys=True, allow_partial=True)
    with pytest.raises(
        Exception,
        match=r"old/train-000000\.tar: byte 0: sample '\w+' has a sample without dataset "
        r"fields \(format version 1\), but the first sample .* has dataset_version "
        r"'v2'",
    ):
        loaded(ld)


def _rewrite_json(tar: Path, out: Path, edit) -> list[str]:
    """``tar`` copied to ``out`` by stock tarfile, each sample's .json replaced by ``edit(key, obj)``
    (bytes, or None to keep it); the keys whose .json changed."""
    import io
    import tarfile

    changed = []
    with tarfile.open(tar) as src, tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            key, ext = m.name.split(".", 1)
            if ext == "json":
                new = edit(key, json.loads(data))
                if new is not None:
                    data, m.size = new, len(new)
                    changed.append(key)
            dst.addfile(m, io.BytesIO(data))
    return changed


def test_the_unparsed_check_agrees_with_parsing_every_json(versions, tmp_path):
    """The streaming reader takes a .json that begins as the converter writes the first sample's
    dataset fields without parsing it (``format.sample.identity_prefix``), and parses any other:
    every .json the converter wrote has the prefix; one written another way (indented, keys in
    another order) with the same fields is read as a plain parse would; one naming another digest
    is refused."""
    from wds_tools.format.sample import identity_prefix, sample_json

    v2 = json.loads((versions["v2"] / "index.json").read_text())
    prefix = identity_prefix("v2", v2["classes_digest"])
    first, second = tars(versions["v2"], "train")[:2]
    for shard in (first, second):  # every .json the converter wrote begins with the prefix
        with open(shard, "rb") as f:
            assert all(d.startswith(prefix) for k, d in read_stored_json(f).items())
    (tmp_path / "t").mkdir()
    a, b = tmp_path / "t" / "train-000000.tar", tmp_path / "t" / "train-000001.tar"
    shutil.copy(first, a)
    pretty = _rewrite_json(second, b, lambda k, o: json.dumps(dict(reversed(o.items())), indent=2).encode())
    assert pretty and not any(x.startswith(prefix) for x in read_stored_json(open(b, "rb")).values())
    ld = make_loader([str(a), str(b)], batch_size=4, train=False, num_workers=0, return_keys=True)
    assert ld.dataset.index is None
    assert Counter(loaded(ld)) == Counter(
        loaded(
            make_loader([str(a), str(b)], batch_size=4, train=False, num_workers=0, return_keys=True, allow_mixed=True)
        )
    )
    other = {**v2, "classes_digest": "f" * 16}
    wrong = _rewrite_json(second, b, lambda k, o: sample_json({**o, "classes_digest": other["classes_digest"]}))
    ld = make_loader([str(a), str(b)], batch_size=4, train=False, num_workers=0, return_keys=True)
    with pytest.raises(
        Exception,
        match=rf"sample '{wrong[0]}' has dataset_version 'v2', classes_digest "
        rf"'{'f' * 16}', but the first sample",
    ):
        loaded(ld)


def read_stored_json(f) -> dict[str, bytes]:
    import tarfile

    with tarfile.open(fileobj=f) as t:
        return {m.name.split(".", 1)[0]: t.extractfile(m).read() for m in t.getmembers() if m.name.endswith(".json")}
