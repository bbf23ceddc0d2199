"""inspect/dups.py and ``wds-tools dups``: near-duplicate clusters of real conversions, whose duplicate
structure is known by construction (copies made with PIL: recompressed, flipped, turned, rescaled)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from phashref import doc_hash
from PIL import Image

from wds_tools.cli import cli
from wds_tools.format.index import read_npz
from wds_tools.format.phash import popcount, variants_array
from wds_tools.inspect.dups import DEFAULT_THRESHOLD, clusters_of, find_dups, find_pairs
from wds_tools.synth import jpeg_bytes, lesion_photo

S = 64


def _photo(seed: int) -> Image.Image:
    return lesion_photo(160, 120, seed % 3, 500 + seed)


def _copy(im: Image.Image, how: str) -> Image.Image:
    if how == "flip":
        return im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if how == "turn":
        return im.transpose(Image.Transpose.ROTATE_180)
    if how == "rescale":
        return im.resize((240, 180), Image.Resampling.BICUBIC)
    if how == "jpeg":
        return Image.open(io.BytesIO(jpeg_bytes(im, 70))).convert("RGB")
    raise ValueError(how)


# key, original seed, copy kind (None: the original), split, label, lesion
ROWS = [
    ("a0", 0, None, "train", "benign", "L1"),
    ("a1", 0, "flip", "val", "benign", "L2"),  # leakage, missed group
    ("b0", 1, None, "train", "benign", "L3"),
    ("b1", 1, "rescale", "train", "malignant", "L3"),  # label conflict
    ("c0", 2, None, "train", "nevus", "L4"),
    ("c1", 2, "turn", "train", "nevus", "L4"),
    ("c2", 2, "jpeg", "train", "nevus", "L4"),  # a clean cluster of three
    ("d0", 3, None, "train", "benign", "L5"),
    ("e0", 4, None, "val", "malignant", "L6"),
    ("f0", 5, None, "val", "nevus", "L7"),
]
WANT = {  # cluster keys -> (cross_split, label_conflict, cross_group)
    ("a0", "a1"): (True, False, True),
    ("b0", "b1"): (False, True, False),
    ("c0", "c1", "c2"): (False, False, False),
}


def write_corpus(root: Path, rows=ROWS) -> Path:
    (root / "img").mkdir(parents=True)
    with open(root / "manifest.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label", "split", "lesion"])
        for key, seed, how, split, label, lesion in rows:
            im = _photo(seed) if how is None else _copy(_photo(seed), how)
            (root / "img" / f"{key}.jpg").write_bytes(jpeg_bytes(im, 92))
            w.writerow([key, f"img/{key}.jpg", label, split, lesion])
    return root / "manifest.csv"


def convert_corpus(root: Path, version: str = "v1", rows=ROWS, size: int = S, one_worker: bool = True) -> Path:
    manifest = write_corpus(root, rows)
    r = CliRunner().invoke(
        cli,
        [
            "convert",
            "--source",
            str(manifest),
            "--version",
            version,
            "--size",
            str(size),
            "--out",
            str(root / "out"),
            *(["--workers", "1"] if one_worker else []),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    return root / "out" / version / str(size)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return convert_corpus(tmp_path_factory.mktemp("dups"))


@pytest.mark.parametrize("size, one_worker", [(S, True), (224, False)])  # 2x2 blocks; 224 px and all cores: defaults
def test_the_stored_hashes_are_the_documented_recipe_of_the_stored_pixels(tmp_path, size, one_worker):
    """Each samples.npz ``phash`` row (read with numpy) is the reference recipe (tests/phashref.py, from
    FORMAT.md) of the pixels of its .npy member (read with stock tarfile): the writer's batched hashing
    hashes each sample's own pixels, in this process or in the decode workers."""
    out = convert_corpus(tmp_path, size=size, one_worker=one_worker)
    with np.load(out / "samples.npz") as table:
        stored = dict(zip(table["key"].tolist(), table["phash"].tolist()))
    seen = 0
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".npy"):
                    data = tar.extractfile(member)
                    assert data is not None
                    pixels = np.load(io.BytesIO(data.read()))
                    assert pixels.shape == (size, size, 3)
                    assert stored[member.name[: -len(".npy")].encode()] == doc_hash(pixels), member.name
                    seen += 1
    assert seen == len(ROWS) == len(stored)


def test_clusters_and_their_flags(folder):
    res = find_dups(folder, group="lesion")
    got = {
        tuple(sorted(m["key"] for m in c.members)): (c.cross_split, c.label_conflict, c.cross_group)
        for c in res.clusters
    }
    assert got == WANT
    c = res.counts()
    assert (c["clusters"], c["samples_in_clusters"], c["cross_split"], c["label_conflict"], c["cross_group"]) == (
        3,
        7,
        1,
        1,
        1,
    )
    a = next(cl for cl in res.clusters if cl.members[0]["key"] == "a0")
    assert [(m["split"], m["label"], m["group"]) for m in a.members] == [
        ("train", "benign", "L1"),
        ("val", "benign", "L2"),
    ]
    assert res.clusters[-1].members[0]["key"] == "c0"  # flagged clusters first
    text = res.to_text()
    assert "1 cross splits (leakage)" in text and "CROSS-SPLIT" in text and "LABEL-CONFLICT" in text


def test_without_a_group_column_no_cluster_crosses_groups(folder):
    res = find_dups(folder)
    assert res.group is None and not any(c.cross_group for c in res.clusters) and len(res.clusters) == 3


def test_json_schema_and_plot(folder, tmp_path):
    png = tmp_path / "dups.png"
    r = CliRunner().invoke(cli, ["dups", str(folder), "--group", "lesion", "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert set(d) == {
        "paths",
        "threshold",
        "samples",
        "group",
        "clusters",
        "samples_in_clusters",
        "cross_split",
        "label_conflict",
        "cross_group",
        "cluster_list",
    }
    assert d["samples"] == len(ROWS) and d["clusters"] == 3 and d["threshold"] == DEFAULT_THRESHOLD
    for c in d["cluster_list"]:
        assert set(c) == {"size", "max_distance", "cross_split", "label_conflict", "cross_group", "members"}
        assert all(set(m) == {"key", "split", "label", "group", "dataset"} for m in c["members"])
        assert 0 <= c["max_distance"] <= DEFAULT_THRESHOLD and c["size"] == len(c["members"])
    with Image.open(png) as im:
        assert im.size[1] > 3 * 64  # three rows of thumbnails
    r = CliRunner().invoke(cli, ["dups", str(folder)])
    assert r.exit_code == 0 and "3 near-duplicate clusters" in r.output


def test_threshold_zero_keeps_only_exact_and_mirrored_copies(folder):
    res = find_dups(folder, threshold=0)
    keys = {tuple(sorted(m["key"] for m in c.members)) for c in res.clusters}
    assert ("a0", "a1") in {k[:2] for k in keys}  # a mirror image is at distance 0


def test_bad_options_name_the_cause(folder):
    r = CliRunner().invoke(cli, ["dups", str(folder), "--group", "patient"])
    assert r.exit_code != 0 and "no metadata column 'patient'" in r.output and "lesion" in r.output
    r = CliRunner().invoke(cli, ["dups", str(folder), "--threshold", "64"])
    assert r.exit_code != 0 and "64" in r.output


def test_across_two_datasets(folder, tmp_path):
    """A second dataset holding a flipped copy of a0 and a new photo: one cluster spans both."""
    other = convert_corpus(
        tmp_path, "clinic", [("x0", 0, "turn", "train", "benign", "Z1"), ("x1", 9, None, "train", "benign", "Z2")]
    )
    res = find_dups(other, across=folder)
    spans = [sorted((m["dataset"], m["key"]) for m in c.members) for c in res.clusters]
    assert spans == [[(0, "x0"), (1, "a0"), (1, "a1")]]


def test_a_version_2_index_has_its_hashes_computed_from_the_pixels(tmp_path):
    """The golden files of versions 2 and 3 hold the same pixels: version 2's hashes, computed from its
    shards, are version 3's stored column."""
    import base64

    golden = Path(__file__).parent / "golden"
    for v in (2, 3):
        dest = tmp_path / f"v{v}"
        dest.mkdir()
        for p in (golden / f"format-v{v}").iterdir():
            data = p.read_bytes()
            if p.name.endswith(".b64"):
                (dest / p.name[:-4]).write_bytes(base64.decodebytes(data))
            else:
                (dest / p.name).write_bytes(data)
    from wds_tools.inspect.dups import _load

    two, three = _load(tmp_path / "v2", None), _load(tmp_path / "v3", None)
    assert two.keys == three.keys and np.array_equal(two.hashes, three.hashes)
    assert "phash" not in read_npz(tmp_path / "v2" / "samples.npz")
    assert find_dups(tmp_path / "v2").samples == 6


def _brute(a: np.ndarray, t: int, b: np.ndarray | None = None) -> set:
    """Every pair by FORMAT.md's distance, pair by pair: the whole-image hash of either, in its eight
    variants, against each of the other's hashes."""
    other = a if b is None else b
    out = set()
    for x in range(len(a)):
        for y in range(len(other)):
            if b is None and x >= y:
                continue
            d = min(
                min(int(popcount(np.uint64(g) ^ h)) for g in variants_array(p[0]) for h in q)
                for p, q in ((a[x], other[y]), (other[y], a[x]))
            )
            if d <= t:
                out.add((x, y, d))
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 12), st.integers(2, 60), st.booleans(), st.sampled_from([1, 6]))
def test_find_pairs_is_exact(seed, t, n, across, k):
    """The banded search finds exactly the pairs an all-pairs scan finds (planted near copies of any of
    a sample's hashes, some turned, included), for six hashes per sample or whole-image hashes only."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**63, (n, k), dtype=np.uint64)
    for r in range(0, n - 1, 3):
        x = int(a[r, int(rng.integers(k))])
        for bit in rng.choice(63, int(rng.integers(0, 14)), replace=False):
            x ^= 1 << int(bit)
        a[r + 1, 0] = variants_array(np.array([x], np.uint64))[0, int(rng.integers(8))]
    b = a[::-1].copy() if across else None
    i, j, d = find_pairs(a, t, b)
    assert set(zip(i.tolist(), j.tolist(), d.tolist())) == _brute(a, t, b)
    if k == 1:  # [N] whole-image hashes are [N, 1]
        i2, j2, d2 = find_pairs(a[:, 0], t, None if b is None else b[:, 0])
        assert (i2.tolist(), j2.tolist(), d2.tolist()) == (i.tolist(), j.tolist(), d.tolist())


def test_clusters_are_the_connected_components():
    i, j = np.array([0, 1, 5, 7]), np.array([1, 2, 6, 5])
    assert clusters_of(9, i, j) == [[0, 1, 2], [5, 6, 7]]
    assert clusters_of(3, np.zeros(0, int), np.zeros(0, int)) == []


def test_copied_folder_gives_the_same_clusters(folder, tmp_path):
    copy = shutil.copytree(folder, tmp_path / "copy")
    a, b = find_dups(folder).to_dict(), find_dups(copy).to_dict()
    a.pop("paths"), b.pop("paths")
    assert a == b


def test_stats_counts_the_leaking_and_conflicting_clusters(folder):
    from wds_tools.inspect.stats import compute_stats

    report = compute_stats(folder, workers=1)
    d = report.to_dict()["duplicates"]
    assert (d["clusters"], d["cross_split"], d["label_conflict"]) == (3, 1, 1)
    assert any("1 near-duplicate clusters cross splits" in w and "a0 a1" in w for w in report.warnings)
    assert (
        f"near-duplicates (within {d['threshold']} bits): 3 clusters, 1 cross splits, 1 carry different labels"
    ) in report.to_text()


def test_verify_fails_on_leakage_only_when_asked(folder):
    r = CliRunner().invoke(cli, ["verify", str(folder), "--quick"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["verify", str(folder), "--quick", "--no-leakage", "--json"])
    assert r.exit_code == 3
    problems = json.loads(r.stdout)["problems"]
    assert [p["kind"] for p in problems] == ["leakage"]
    assert "a0 (train) a1 (val)" in problems[0]["message"]


def test_the_benchmark_duplicate_set_at_small_scale():
    """scripts/bench_dups.py's set, small (2 windows of each photo, 6 lesion photos, each with six copies):
    at the default threshold precision >= 0.99 and recall >= 0.95 (the issue's target), every copy but the
    crops found, and most crops (found through a window); the whole-image hashes alone find few crops."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_dups

    from wds_tools.format.phash import phash_batch

    pixels, ids, kinds = bench_dups.build_set(6, 224, windows=2)
    hashes = phash_batch(pixels)
    found = np.zeros((len(ids), len(ids)), bool)
    i, j, _ = find_pairs(hashes, DEFAULT_THRESHOLD)
    found[i, j] = found[j, i] = True
    same = (ids[:, None] == ids[None, :]) & ~np.eye(len(ids), dtype=bool)
    true, false = int((found & same).sum()) // 2, int((found & ~same).sum()) // 2
    assert true / (true + false) >= 0.99 and true / (int(same.sum()) // 2) >= 0.95, (true, false, int(same.sum()) // 2)
    kinds_a = np.array(kinds)
    originals = np.flatnonzero(kinds_a == "original")
    for kind in ("jpeg", "rescale", "turn", "brightness", "blur"):
        for o in originals:
            copy = np.flatnonzero((ids == ids[o]) & (kinds_a == kind))[0]
            assert found[o, copy], (kind, int(ids[o]))
    crops = [(o, np.flatnonzero((ids == ids[o]) & (kinds_a == "crop"))[0]) for o in originals]
    assert sum(found[o, c] for o, c in crops) >= 0.75 * len(crops)
    whole = np.zeros_like(found)
    i, j, _ = find_pairs(hashes[:, 0], DEFAULT_THRESHOLD)
    whole[i, j] = whole[j, i] = True
    assert sum(whole[o, c] for o, c in crops) < sum(found[o, c] for o, c in crops)


def test_stats_says_when_a_set_is_too_large_to_count(folder, monkeypatch):
    import wds_tools.inspect.dups as dups
    from wds_tools.inspect.stats import compute_stats

    skipped = {
        "threshold": DEFAULT_THRESHOLD,
        "skipped": "10 samples, more than stats counts near-duplicates for (5): run wds-tools dups",
    }
    assert dups.duplicate_counts(str(folder), limit=5) == skipped
    monkeypatch.setattr(dups, "STATS_LIMIT", 5)
    report = compute_stats(folder, workers=1)
    assert report.to_dict()["duplicates"] == skipped
    assert "near-duplicates not counted: 10 samples, more than" in "\n".join(report.warnings)


def test_a_plot_that_cannot_be_written_is_one_line(folder, tmp_path):
    """--plot into a folder that does not exist (or a read-only mount): one line naming the path, no traceback."""
    dest = tmp_path / "no-such-folder" / "dups.png"
    r = CliRunner().invoke(cli, ["dups", str(folder), "--plot", str(dest)])
    assert r.exit_code == 1, r.output
    assert f"{dest}: cannot write the contact sheet there" in r.output and "Traceback" not in r.output
    assert not dest.exists()


def test_a_stats_plot_that_cannot_be_written_is_one_line(folder, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    dest = tmp_path / "no-such-folder" / "stats.png"
    r = CliRunner().invoke(cli, ["stats", str(folder), "--plot", str(dest)])
    assert r.exit_code == 1 and f"{dest}: cannot write the plot there" in r.output, r.output
