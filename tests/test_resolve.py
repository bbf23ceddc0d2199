"""dataset.resolve: the one resolver of specs, on local folders, file:// URLs, S3 (moto on 127.0.0.1)
and http (http.server on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import convert_images, upload
from shardkit import copy_tars

from wds_tools.cli import cli
from wds_tools.dataset.resolve import resolve, resolve_target
from wds_tools.errors import IndexFormatError, OptionError, ShardError


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """25 train samples in 7 shards of up to 4, 5 val samples in 2 shards, and the index."""
    return convert_images(tmp_path_factory.mktemp("resolve"), 30, size=16, shard_size=4, val_every=6)


@pytest.fixture(scope="module")
def names(folder) -> list[str]:
    return [s["name"] for s in json.loads((folder / "index.json").read_text())["shards"]]


@pytest.fixture(scope="module")
def samples(folder) -> dict[str, int]:
    """Shard name -> samples, as index.json says."""
    return {s["name"]: s["samples"] for s in json.loads((folder / "index.json").read_text())["shards"]}


# ------------------------------------------------------------------ the resolver, local


def test_folder_index_file_and_file_url_agree(folder, names):
    a = resolve(folder)
    b = resolve(folder / "index.json")
    c = resolve(f"file://{folder}")
    assert a.urls == b.urls == c.urls == [str(folder / n) for n in names]
    assert a.names == names and a.counts == b.counts and sum(a.counts) == 30 and len(a) == 9
    assert a.folder == a.index_base == str(folder) and a.index_file == str(folder / "index.json")
    assert a.raw["format"] == "wds-tools-index" and not a.selected
    train = resolve(folder, split="train")
    assert len(train) == 7 and sum(train.counts) == 25 and all("/train-" in u for u in train.urls)


def test_pattern_in_an_indexed_folder(folder, samples):
    s = resolve(str(folder / "train-{000001..000003}.tar"), allow_partial=True)
    assert s.names == ["train-000001.tar", "train-000002.tar", "train-000003.tar"] and s.selected
    assert s.counts == [samples[n] for n in s.names] and s.index_base == str(folder)
    one = resolve(str(folder / "val-000001.tar"), allow_partial=True)
    assert one.urls == [str(folder / "val-000001.tar")] and one.counts == [samples["val-000001.tar"]]


def test_pattern_and_folder_without_index(folder, tmp_path):
    bare = copy_tars(folder, tmp_path / "bare")
    s = resolve(str(bare / "train-{000000..000006}.tar"))
    assert len(s) == 7 and s.raw is None and s.counts is None and s.names is None and s.folder == str(bare)
    listed = resolve(bare, scan=True)
    assert [Path(u).name for u in listed.urls] == sorted(p.name for p in folder.glob("*.tar"))
    with pytest.raises(IndexFormatError, match=r"no index at .*bare/index.json; convert first \(a folder wds-tools"):
        resolve(bare)
    with pytest.raises(IndexFormatError, match=r"no index at .*bare/index.json; pass --scan"):
        resolve(str(bare / "train-000000.tar"), need_index=True)


def test_joined_patterns_and_lists(folder, samples, tmp_path):
    one, two = str(folder / "train-{000000..000001}.tar"), str(folder / "val-000000.tar")
    joined, listed = resolve(f"{one}::{two}", allow_partial=True), resolve([one, Path(two)], allow_partial=True)
    assert (
        joined.urls
        == listed.urls
        == [str(folder / n) for n in ("train-000000.tar", "train-000001.tar", "val-000000.tar")]
    )
    assert joined.names == [Path(u).name for u in joined.urls]
    assert joined.counts == [samples[n] for n in joined.names]
    assert joined.spec == f"{one}::{two}" and joined.selected and joined.folder == str(folder)
    other = shutil.copytree(folder, tmp_path / "other")
    mixed = resolve([one, str(other / "val-000000.tar")], allow_partial=True)
    assert mixed.folder is None and mixed.names is None and mixed.counts == joined.counts  # two indexes
    with pytest.raises(OptionError, match=r"the shards are in several folders \(.*other.*\); give one shards folder"):
        resolve([one, str(other / "val-000000.tar")], one_folder=True)
    shutil.copytree(folder, tmp_path / "other2")
    assert len(resolve(f"{tmp_path}/{{other,other2}}/val-000000.tar", allow_partial=True)) == 2
    with pytest.raises(OptionError, match="the pattern spans several folders; give one shards folder at a time"):
        resolve(f"{tmp_path}/{{other,other2}}/val-000000.tar", one_folder=True)


def test_a_folder_above_the_size_folders_names_the_sizes_it_holds(folder, tmp_path, monkeypatch):
    """make_loader("shards/v1") said "convert first" of a version folder holding converted sizes (issue 32)."""
    for size in ("96", "224", "16"):  # copies of one conversion, as OUT/v1/<size>
        shutil.copytree(folder, tmp_path / "out" / "v1" / size)
    (tmp_path / "out" / "v2" / "224").mkdir(parents=True)  # a folder without an index names nothing
    monkeypatch.chdir(tmp_path)
    for need_index, scan in ((False, False), (True, False), (True, True)):
        with pytest.raises(
            IndexFormatError, match=r"out/v1 holds the sizes 224, 96, 16 \(a folder each\): use out/v1/224, for one"
        ):
            resolve("out/v1", need_index=need_index, scan=scan)
    os.utime(tmp_path / "out" / "v1" / "16" / "index.json", ns=(2**62, 2**62))  # the most recently converted
    with pytest.raises(IndexFormatError, match=r"out holds the versions v1 \(224, 96, 16\): use e\.g\. out/v1/16 \("):
        resolve("out")
    with pytest.raises(IndexFormatError, match=r"no index at out/v2/index\.json; convert first"):
        resolve("out/v2")


def test_errors_are_named(folder, tmp_path):
    with pytest.raises(OptionError, match=r"nowhere: no such shards folder, index file or shard pattern"):
        resolve(tmp_path / "nowhere")
    with pytest.raises(IndexFormatError, match=r"no index at .*nowhere/index.json; .*nowhere does not exist"):
        resolve(tmp_path / "nowhere" / "index.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexFormatError, match=r"no index at .*empty/index.json; convert first"):
        resolve(tmp_path / "empty" / "index.json")
    with pytest.raises(
        ShardError,
        match=r"2 of 9 shards do not exist, e.g. .*train-000007.tar \(.*index.json lists train-\{000000..000006\}"
        r"\.tar \(7 train\), val-\{000000..000001\}\.tar \(2 val\)\); check the pattern",
    ):
        resolve(str(folder / "train-{000000..000008}.tar"))
    with pytest.raises(IndexFormatError, match=r"2 shard\(s\) are not in .*index.json \(first: train-000007.tar\)"):
        resolve(str(folder / "train-{000000..000008}.tar"), need_index=True)
    gappy = shutil.copytree(folder, tmp_path / "gappy")
    (gappy / "train-000001.tar").unlink()  # listed in the index, gone from the folder
    with pytest.raises(ShardError, match=r"1 of 3 shards do not exist, e.g. .*gappy/train-000001.tar"):
        resolve(str(gappy / "train-{000000..000002}.tar"), allow_partial=True)  # the loader
    assert (
        len(resolve(str(gappy / "train-{000000..000002}.tar"), need_index=True, allow_partial=True).names) == 3
    )  # verify names it
    with pytest.raises(IndexFormatError, match=r"index.json: no split 'test'; the index has train, val"):
        resolve(folder, split="test")
    with pytest.raises(OptionError, match="pipe: commands are read by the loader only"):
        resolve("pipe:cat a-{0..1}.tar")
    assert resolve("pipe:cat a-{0..1}.tar", pipe=True).urls == ["pipe:cat a-0.tar", "pipe:cat a-1.tar"]
    with pytest.raises(OptionError, match="no shard given"):
        resolve(" :: ")


def test_index_of_another_format_version_is_refused(folder, tmp_path):
    newer = shutil.copytree(folder, tmp_path / "newer")
    meta = json.loads((newer / "index.json").read_text())
    (newer / "index.json").write_text(json.dumps({**meta, "format_version": 99}))
    for spec in (newer, newer / "index.json"):
        with pytest.raises(
            IndexFormatError,
            match=r"newer/index.json has format_version 99; this wds-tools reads "
            r"versions 1, 2 and 3",
        ):
            resolve(spec)
    with pytest.raises(IndexFormatError, match="has format_version 99"):
        resolve(str(newer / "train-000000.tar"), need_index=True)
    # the loader reads a pattern's shards without an index it cannot use
    assert resolve(str(newer / "train-000000.tar")).raw is None


@pytest.mark.parametrize(
    "field, bad",
    [
        ("shard", "../../x.tar"),
        ("shard", "/tmp/x.tar"),
        ("shard", "sub/train-000001.tar"),
        ("shard", "train-1.tar"),
        ("shard", 7),
        ("samples_file", "../samples.npz"),
        ("samples_file", "/tmp/samples.npz"),
    ],
)
def test_an_index_naming_files_outside_its_folder_is_refused(folder, tmp_path, field, bad):
    """The one resolver, for the loader and the inspectors: an index.json entry that would lead a reader
    out of the index's folder raises, naming the entry; nothing is opened there."""
    edited = shutil.copytree(folder, tmp_path / "a" / "b" / "set")
    shutil.copy(folder / "train-000001.tar", tmp_path / "x.tar")  # a real shard where "../../x.tar" leads
    meta = json.loads((edited / "index.json").read_text())
    if field == "shard":
        meta["shards"][1]["name"] = bad
        where = r"shards\[1\]\.name is " + re.escape(repr(bad))
    else:
        meta["samples_file"]["name"] = bad
        where = r"samples_file\.name is " + re.escape(repr(bad))
    (edited / "index.json").write_text(json.dumps(meta))
    message = where + r"; expected .* in the index's own folder; the index is damaged or was edited"
    for spec in (edited, edited / "index.json", str(edited / "train-{000000..000001}.tar")):
        with pytest.raises(IndexFormatError, match=message):
            resolve(spec, need_index=True)
    with pytest.raises(IndexFormatError, match=message):
        resolve(edited, split="train", pipe=True)  # as training_adapter resolves a folder
    with pytest.raises(IndexFormatError, match=message):
        resolve_target(edited)
    lenient = resolve(edited, strict=False)  # verify: the entry is left out, never opened, and reported
    assert all(str(edited) in u and ".." not in u for u in lenient.urls)
    assert len(lenient.urls) == (len(meta["shards"]) - 1 if field == "shard" else len(meta["shards"]))


def test_the_loader_never_reads_a_shard_outside_the_index_folder(folder, tmp_path):
    from training_adapter import ShardIndexDataset, make_loader

    edited = shutil.copytree(folder, tmp_path / "a" / "b" / "set")
    shutil.copy(folder / "train-000001.tar", tmp_path / "x.tar")
    meta = json.loads((edited / "index.json").read_text())
    meta["shards"][1]["name"] = "../../x.tar"
    (edited / "index.json").write_text(json.dumps(meta))
    (edited / "train-000001.tar").unlink()
    for make in (
        lambda: make_loader(edited, batch_size=4, train=True, num_workers=0),
        lambda: make_loader(edited / "index.json", batch_size=4, train=True, num_workers=0),
        lambda: ShardIndexDataset(edited, split="train"),
    ):
        with pytest.raises(IndexFormatError, match=r"shards\[1\]\.name is '\.\./\.\./x\.tar'"):
            make()


def test_newest_version_when_no_path(folder, tmp_path):
    assert resolve_target(None, out=folder.parent.parent).folder == str(folder)
    with pytest.raises(IndexFormatError, match=r"no converted dataset under .*empty"):
        resolve_target(None, out=tmp_path / "empty")


# ------------------------------------------------------------------ the resolver, S3 and http


def test_s3_folder_index_and_pattern(folder, names, bucket, tmp_path):
    fs, url = bucket
    base = upload(fs, folder, f"{url}/v1/16")
    local = resolve(folder)
    for spec in (base, f"{base}/", f"{base}/index.json"):
        s = resolve(spec)
        assert s.urls == [f"{base}/{n}" for n in names] and s.counts == local.counts and s.index_base == base
        assert s.raw == local.raw
    p = resolve(f"{base}/train-{{000001..000002}}.tar", need_index=True, allow_partial=True)
    assert p.names == ["train-000001.tar", "train-000002.tar"] and p.counts == local.counts[1:3] and p.selected
    bare = upload(fs, folder, f"{url}/bare", skip=("index.json", "samples.npz"))
    assert [u.rsplit("/", 1)[1] for u in resolve(bare, scan=True).urls] == sorted(n for n in names)
    assert resolve(f"{bare}/val-{{000000..000001}}.tar").counts is None
    with pytest.raises(IndexFormatError, match=rf"no index at {bare}/index.json; pass --scan"):
        resolve(bare, need_index=True)
    with pytest.raises(IndexFormatError, match=rf"no index at {url}/nothing/index.json; convert first"):
        resolve(f"{url}/nothing/index.json")


def test_http_index_pattern_and_folder(folder, names, serve_http, tmp_path):
    base = serve_http(folder)
    local = resolve(folder, split="val")
    for spec in (f"{base}/index.json", base):
        s = resolve(spec, split="val")
        assert s.urls == [f"{base}/{n}" for n in names if n.startswith("val")] and s.counts == local.counts
    p = resolve(f"{base}/train-{{000000..000006}}.tar", need_index=True)
    assert p.counts == resolve(folder, split="train").counts and p.index_base == base
    bare = serve_http(copy_tars(folder, tmp_path / "bare"))
    assert resolve(f"{bare}/train-000000.tar").raw is None
    with pytest.raises(
        IndexFormatError,
        match=r"no index at http://.*/index.json, and a http:// folder cannot "
        r"be listed; give a shard pattern",
    ):
        resolve(bare, scan=True)
    with pytest.raises(IndexFormatError, match=r"cannot read index http://127.0.0.1:1/index.json: cannot reach"):
        resolve("http://127.0.0.1:1/train-000000.tar", need_index=True)


# ------------------------------------------------------------------ a mistyped spec is named (issue 38, point 18)


@pytest.mark.parametrize(
    "pattern, message",
    [
        (
            "train-{000000...000006}.tar",
            r"the braces \{000000\.\.\.000006\} were not expanded, so the pattern would name the one file "
            r".*train-\{000000\.\.\.000006\}\.tar; a shard pattern is train-\{000000\.\.000041\}\.tar \(a range: "
            r"two dots\)",
        ),
        ("train-{000000..000006}}.tar", r"the '\}' at position \d+ closes no '\{'; a shard pattern is"),
        ("train-000000.tar}", r"the '\}' at position \d+ closes no '\{'"),
        ("train-{000000..00000{6}.tar", r"the '\{' at position \d+ is never closed"),
    ],
)
def test_a_malformed_brace_pattern_is_refused_naming_the_braces(folder, pattern, message):
    """braceexpand leaves a brace group it cannot read as it is (one file named '{000000...000006}') and
    raises a bare UnbalancedBracesError for a stray brace: each is refused by the loader's resolve and
    by stats, naming the braces and what a pattern looks like."""
    spec = str(folder / pattern)
    for kw in ({}, {"need_index": True}):
        with pytest.raises(OptionError, match=message):
            resolve(spec, **kw)
    res = CliRunner().invoke(cli, ["stats", spec])
    assert res.exit_code != 0 and re.search(message, res.output) and "Traceback" not in res.output


def test_a_mistyped_size_or_version_lists_what_exists(folder):
    """v1/23 for v1/16, v9 for v1: the refusal says the folder does not exist and lists the sizes of
    the version folder, or the versions under OUT, for the loader's pattern, a folder, an index file
    and stats alike."""
    out = folder.parent.parent  # OUT/v1/16
    typo = out / "v1" / "23"
    sizes = rf"{re.escape(str(typo))} does not exist; {re.escape(str(out / 'v1'))} holds the sizes 16 \(a folder each\)"
    with pytest.raises(ShardError, match=r"7 of 7 shards do not exist, e\.g\. .*\(" + sizes):
        resolve(str(typo / "train-{000000..000006}.tar"))
    with pytest.raises(OptionError, match=r"no such shards folder, index file or shard pattern: " + sizes):
        resolve(str(typo))
    with pytest.raises(IndexFormatError, match=r"no index at .*23/index\.json; " + sizes):
        resolve(str(typo / "index.json"))
    res = CliRunner().invoke(cli, ["stats", str(typo / "train-{000000..000006}.tar")])
    assert res.exit_code != 0 and re.search(sizes, res.output), res.output
    version = out / "v9" / "16"
    with pytest.raises(
        OptionError, match=rf"{re.escape(str(version))} does not exist; .* holds the versions v1 \(16\)"
    ):
        resolve(str(version))
