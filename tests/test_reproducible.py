"""FORMAT.md's reproducibility promise across folders: a corpus with a relative-path manifest, copied
to another folder (other mtimes), converted in each place with the same command (out folders
elsewhere), gives byte-identical shards, samples.npz, index.json and sidecars, for a first version
and an incremental one; index.json carries no host, time or absolute path; and the quick check
still skips unchanged sources through the stat cache kept outside the format."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from conftest import make_images, write_manifest

from wds_tools.cli import cli
from wds_tools.convert import sourcecache as hashes

SIZE = "16"


def _corpus(root: Path) -> Path:
    rows = make_images(root, 12)
    write_manifest(root / "v1.csv", rows)
    more = make_images(root / "more", 2, seed=5)
    for r in more:
        r.update(key="m" + r["key"], path="more/" + r["path"])
    write_manifest(root / "v2.csv", rows[1:] + more)  # v2: one row removed, two added
    return root


def _convert(corpus: Path, out: Path, manifest: str, version: str, monkeypatch, *extra: str) -> dict:
    monkeypatch.chdir(corpus)
    res = CliRunner().invoke(
        cli,
        [
            "convert",
            "--source",
            manifest,
            "--version",
            version,
            "--size",
            SIZE,
            "--out",
            str(out),
            "--shard-size",
            "4",
            "--workers",
            "1",
            "--json",
            *extra,
        ],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_copied_corpus_converts_to_the_same_bytes(tmp_path, monkeypatch):
    a = _corpus(tmp_path / "here" / "corpus")
    b = shutil.copytree(a, tmp_path / "elsewhere" / "deeper" / "corpus")
    for i, p in enumerate(sorted(b.rglob("*.jpg"))):  # other mtimes (a copy, a checkout, an unpacked archive)
        os.utime(p, ns=(1_600_000_000_000_000_000 + i, 1_600_000_000_000_000_000 + i))
    out_a, out_b = tmp_path / "out-a", tmp_path / "x" / "out-b"
    for corpus, out in ((a, out_a), (b, out_b)):
        _convert(corpus, out, "v1.csv", "v1", monkeypatch)
        r2 = _convert(corpus, out, "v2.csv", "v2", monkeypatch)
        assert r2["base"] == "v1" and r2["unchanged_by_stat"] == 11 and r2["sources_read"] == 2  # the quick check
    for version in ("v1", "v2"):
        fa, fb = _files(out_a / version / SIZE), _files(out_b / version / SIZE)
        assert sorted(fa) == sorted(fb) and {n.rsplit(".", 1)[-1] for n in fa} == {"tar", "npz", "json", "idx"}
        for name in fa:
            assert fa[name] == fb[name], f"{version}/{name} differs between the two folders"
        text = fa["index.json"].decode()
        for leak in (str(tmp_path), str(a), str(b), socket.gethostname()):
            assert leak not in text, leak
        assert json.loads(text)["build"]["source_path"] == f"{version}.csv"
        with np.load(out_a / version / SIZE / "samples.npz") as z:
            assert "src_mtime_ns" not in z.files  # mtimes live in the cache outside the format
    stats = hashes.load_stats(out_b, "v1")
    assert len(stats) == 12 and all(Path(p).is_absolute() and str(b) in p for p in stats)


def test_without_the_stat_cache_sources_are_read_and_the_bytes_are_the_same(tmp_path, monkeypatch):
    corpus = _corpus(tmp_path / "corpus")
    _convert(corpus, tmp_path / "out", "v1.csv", "v1", monkeypatch)
    _convert(corpus, tmp_path / "out", "v2.csv", "v2", monkeypatch)
    want = _files(tmp_path / "out" / "v2" / SIZE)
    shutil.rmtree(tmp_path / "out" / "v2")
    hashes.stats_file(tmp_path / "out", "v1").unlink()
    r = _convert(corpus, tmp_path / "out", "v2.csv", "v2", monkeypatch)
    assert r["unchanged_by_stat"] == 0 and r["sources_read"] == 13 and r["reused"] == 11  # slower, still reused
    assert _files(tmp_path / "out" / "v2" / SIZE) == want


def test_a_config_file_keeps_the_source_path_relative(tmp_path, monkeypatch):
    """`source` from wds-tools.toml is recorded relative to the working directory, as the CLI would
    take it, so a copied project writes the same index.json."""
    corpus = _corpus(tmp_path / "corpus")
    (corpus / "wds-tools.toml").write_text('source = "v1.csv"\n')
    monkeypatch.chdir(corpus)
    res = CliRunner().invoke(
        cli, ["convert", "--version", "v1", "--size", SIZE, "--out", str(tmp_path / "o"), "--workers", "1"]
    )
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "o" / "v1" / SIZE / "index.json").read_text())
    assert meta["build"]["source_path"] == "v1.csv"
