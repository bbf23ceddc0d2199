"""Golden files: the bytes of format version 1, pinned.

``tests/golden/format-v<N>/`` holds a tiny conversion made from fixed arrays: six 8x8 images
written as binary PPM files (no compression, no JPEG: no codec upgrade changes them) at exactly the
output size, so no resampling touches the pixels either. The test converts the same corpus with
today's code and compares every file byte for byte, then has every reader read the golden files:
the loader (both readers), stats, verify, diff and an incremental conversion using them as its
base. A change to the bytes fails here unless ``FORMAT_VERSION`` and docs/FORMAT.md change with it
and golden files for the new version are written (run this file with ``WDS_TOOLS_WRITE_GOLDEN=1``;
it refuses to overwrite a version that already has golden files).

Shards, samples.npz and the index are binary or carry binary-derived fields; they are kept as
base64 text (``<name>.b64``), the rest as they are.
"""

from __future__ import annotations

import base64
import csv
import io
import os
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from wds_tools.cli import cli
from wds_tools.format.index import FORMAT_VERSION, load_index

GOLDEN = Path(__file__).parent / "golden" / f"format-v{FORMAT_VERSION}"
S = 8
MTIME_NS = 1_700_000_000_123_456_789  # every source file's mtime (samples.npz records it)
FIXED_VERSIONS = {"libjpeg": "golden", "pillow": "golden"}  # decoder_versions: no JPEG is decoded here
ROWS = [  # key, label, split; "ISIC 0006" is sanitized to ISIC_0006 (original_key kept)
    ("ISIC_0001", "benign", "train"), ("ISIC_0002", "malignant", "train"), ("ISIC_0003", "benign", "train"),
    ("ISIC_0004", "malignant", "train"), ("ISIC_0005", "benign", "val"), ("ISIC 0006", "malignant", "val"),
]
TEXT = (".json", ".jsonl", ".idx")


def pixels(i: int) -> np.ndarray:
    """Image i: a fixed uint8 [8, 8, 3] pattern."""
    y, x, c = np.meshgrid(np.arange(S), np.arange(S), np.arange(3), indexing="ij")
    return ((i * 37 + y * 11 + x * 5 + c * 101 + (x * y) % 7) % 256).astype(np.uint8)


def write_corpus(root: Path) -> Path:
    """The golden corpus: PPM files and a manifest, every byte and mtime fixed; returns the manifest."""
    (root / "img").mkdir(parents=True)
    with open(root / "manifest.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["key", "path", "label", "split"])
        for i, (key, label, split) in enumerate(ROWS, 1):
            path = root / "img" / f"{i:04d}.ppm"
            path.write_bytes(f"P6\n{S} {S}\n255\n".encode() + pixels(i).tobytes())
            os.utime(path, ns=(MTIME_NS, MTIME_NS))
            w.writerow([key, f"img/{i:04d}.ppm", label, split])
    return root / "manifest.csv"


@pytest.fixture
def fixed_provenance(monkeypatch):
    """index.json records the wds-tools and decoder versions; pin them so an upgrade of either
    (which cannot change these pixels) does not change the golden bytes."""
    import wds_tools.convert.pipeline as pipeline

    monkeypatch.setattr(pipeline, "__version__", "golden")
    monkeypatch.setattr(pipeline, "decoder_versions", lambda: dict(FIXED_VERSIONS))


def convert_corpus(root: Path, version: str = "v1", *extra: str) -> Path:
    """Convert root/manifest.csv as a user would, from root, with a relative --source."""
    cwd = os.getcwd()
    os.chdir(root)
    try:
        r = CliRunner().invoke(cli, ["convert", "--source", "manifest.csv", "--version", version, "--size", str(S),
                                     "--out", "shards", "--shard-size", "2", "--sanitize-keys", "--workers", "1",
                                     "--quiet", *extra])
    finally:
        os.chdir(cwd)  # CliRunner runs in this process
    assert r.exit_code == 0, r.output
    return root / "shards" / version / str(S)


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def encode(name: str, data: bytes) -> tuple[str, bytes]:
    """How a file is kept in tests/golden: text files as they are, others as wrapped base64."""
    if name.endswith(TEXT):
        return name, data
    b64 = base64.encodebytes(data)  # 76-column lines
    return name + ".b64", b64


def golden_files() -> dict[str, bytes]:
    out = {}
    for p in sorted(GOLDEN.iterdir()):
        if p.name.endswith(".b64"):
            out[p.name.removesuffix(".b64")] = base64.decodebytes(p.read_bytes())
        else:
            out[p.name] = p.read_bytes()
    return out


@pytest.fixture
def golden(tmp_path) -> Path:
    """The golden files, as a shards folder OUT/v1/8 a reader can open."""
    if not GOLDEN.is_dir():
        pytest.fail(f"no golden files for format version {FORMAT_VERSION}: write them with "
                    f"WDS_TOOLS_WRITE_GOLDEN=1 pytest {Path(__file__).name}")
    folder = tmp_path / "golden" / "v1" / str(S)
    folder.mkdir(parents=True)
    for name, data in golden_files().items():
        (folder / name).write_bytes(data)
    return folder


def test_the_writer_reproduces_the_golden_bytes(tmp_path, fixed_provenance):
    write_corpus(tmp_path / "a")
    made = folder_files(convert_corpus(tmp_path / "a"))
    if os.environ.get("WDS_TOOLS_WRITE_GOLDEN"):
        if GOLDEN.exists():
            pytest.fail(f"{GOLDEN} exists: golden files of a released format version are never rewritten; "
                        "raise FORMAT_VERSION (and docs/FORMAT.md) for a new format")
        GOLDEN.mkdir(parents=True)
        for name, data in made.items():
            enc_name, enc = encode(name, data)
            (GOLDEN / enc_name).write_bytes(enc)
    want = golden_files()
    assert sorted(made) == sorted(want), "the conversion writes other files than the golden set"
    for name in want:
        assert made[name] == want[name], (
            f"{name} differs from tests/golden/{GOLDEN.name}: the bytes of format version {FORMAT_VERSION} "
            "changed. Readers of existing shards depend on them; if the change is meant, raise FORMAT_VERSION, "
            "document it in docs/FORMAT.md and write new golden files")


def test_golden_files_hold_what_the_format_promises(golden):
    """Read with the standard library and numpy only: the fixed arrays, labels, members and order."""
    meta = load_index(golden).meta
    assert meta["format_version"] == FORMAT_VERSION and meta["classes"] == ["benign", "malignant"]
    stored = {}
    for shard in meta["shards"]:
        with tarfile.open(golden / shard["name"]) as tf:
            members = tf.getmembers()
            assert all(m.mtime == 0 and m.uid == 0 and m.mode == 0o644 and not m.pax_headers for m in members)
            names = [m.name for m in members]
            assert len(names) == 3 * shard["samples"]
            for j in range(0, len(names), 3):
                key = names[j][:-4]
                assert names[j:j + 3] == [f"{key}.cls", f"{key}.json", f"{key}.npy"]
                stored[key] = (int(tf.extractfile(members[j]).read()),
                               np.load(io.BytesIO(tf.extractfile(members[j + 2]).read())))
    for i, (key, label, _) in enumerate(ROWS, 1):
        key = key.replace(" ", "_")
        assert stored[key][0] == meta["classes"].index(label)
        assert np.array_equal(stored[key][1], pixels(i)), key


def test_format_doc_names_the_version():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md").read_text()
    assert re.match(rf"# wds-tools on-disk format — version {FORMAT_VERSION}\n", doc)


@pytest.mark.parametrize("reader", ["auto", "stream"])
def test_the_loader_reads_the_golden_files(golden, reader):
    from training_adapter import make_loader

    keys = [k.replace(" ", "_") for k, _, _ in ROWS]
    for split in ("train", "val"):
        loader = make_loader(golden, batch_size=2, train=False, split=split, num_workers=0, return_keys=True,
                             reader=reader)
        seen = 0
        for images, labels, batch_keys in loader:
            for im, lab, k in zip(images, labels, batch_keys):
                i = keys.index(k)
                assert np.array_equal(im.permute(1, 2, 0).numpy(), pixels(i + 1)), k
                assert int(lab) == ["benign", "malignant"].index(ROWS[i][1])
                seen += 1
        assert seen == sum(r[2] == split for r in ROWS)


def test_stats_verify_and_diff_read_the_golden_files(golden, tmp_path, fixed_provenance):
    from wds_tools.inspect.diff import diff_versions
    from wds_tools.inspect.stats import compute_stats
    from wds_tools.inspect.verify import verify

    report = verify(golden)
    assert report.ok and report.samples == 6 and report.shards == 3, report.to_text()
    assert verify(golden, scan=True).ok
    st = compute_stats(golden, workers=1).to_dict()
    assert st["samples"] == 6 and st["splits"]["train"]["shards"] == 2
    # v2: one image changed, one relabeled, one removed
    root = tmp_path / "v2"
    manifest = write_corpus(root)
    lines = manifest.read_text().splitlines()
    lines[1] = lines[1].replace("benign", "malignant")
    del lines[3]
    manifest.write_text("\n".join(lines) + "\n")
    (root / "img" / "0004.ppm").write_bytes(f"P6\n{S} {S}\n255\n".encode() + (255 - pixels(4)).tobytes())
    (root / "shards" / "v1").mkdir(parents=True)
    shutil.copytree(golden, root / "shards" / "v1" / str(S))
    new = convert_corpus(root, "v2")
    d = diff_versions(golden, new).to_dict()
    assert (d["added"], d["removed"], d["changed"], d["relabeled"]) == ([], ["ISIC_0003"], ["ISIC_0004"], ["ISIC_0001"])


def test_an_incremental_conversion_takes_the_golden_files_as_its_base(golden, tmp_path, fixed_provenance,
                                                                       monkeypatch):
    """v2 of the same corpus copies every sample from the golden shards (none decoded) and is the
    golden set but for the version's name."""
    import json

    from wds_tools.convert import convert

    root = tmp_path / "inc"
    write_corpus(root)
    (root / "shards" / "v1").mkdir(parents=True)
    shutil.copytree(golden, root / "shards" / "v1" / str(S))
    monkeypatch.chdir(root)  # the relative --source the golden index records
    r = convert("manifest.csv", version="v2", size=S, out="shards", shard_size=2, sanitize_keys=True,
                workers=1, progress=False)
    assert (r.decoded, r.reused, r.base) == (0, 6, "v1")
    made = folder_files(root / "shards" / "v2" / str(S))
    want = golden_files()
    assert made.keys() == want.keys()
    for name in want:
        if name.endswith(".json"):  # the version's name, and the base it came from
            m, w = json.loads(made[name]), json.loads(want[name])
            if name == "index.json":
                assert (m.pop("dataset_version"), m["build"].pop("base"), m.pop("samples_file")) == (
                    "v2", "v1", w.pop("samples_file"))
                w.pop("dataset_version"), w["build"].pop("base")
            else:
                assert m.pop("name") == w.pop("name").replace("v1/", "v2/")
            assert m == w, name
        else:
            assert made[name] == want[name], name
