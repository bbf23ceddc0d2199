"""Golden files: the bytes of each format version, pinned.

``tests/golden/format-v<N>/`` holds a tiny conversion made from fixed arrays: six 8x8 images
written as binary PPM files (no compression, no JPEG: no codec upgrade changes them) at exactly the
output size, so no resampling touches the pixels either. Version 1's corpus is a plain
``key,path,label,split`` manifest; version 2's is a dataset's own metadata file (``--key``,
``--label``, a ``--path`` template, ``--group`` with ``--stratify``) whose other columns (an int, a
float and a string column, with missing values and unicode) become per-sample metadata.

The test converts the current version's corpus with today's code and compares every file byte for
byte, checks that a plain manifest still gives version 1's bytes but for the version number, then
has every reader read the golden files of every version it reads: the loader (both readers), stats,
verify, diff and an incremental conversion using them as its base. A change to the bytes fails here
unless ``FORMAT_VERSION`` and docs/FORMAT.md change with it and golden files for the new version are
written: run this file with ``WDS_TOOLS_WRITE_GOLDEN=1``. Golden files of a released version
(``RELEASED``) are never rewritten; those of the version in the making are replaced, so a change still
planned for it (issue 16) only needs that command.

Shards, samples.npz and the index are binary or carry binary-derived fields; they are kept as
base64 text (``<name>.b64``), the rest as they are.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from wds_tools.cli import cli
from wds_tools.format.index import FORMAT_VERSION, READABLE_VERSIONS, load_index, read_npz
from wds_tools.format.sample import classes_digest

GOLDEN_ROOT = Path(__file__).parent / "golden"
RELEASED = {1, 2}  # format versions whose golden files are never rewritten
S = 8
MTIME_NS = 1_700_000_000_123_456_789  # every source file's mtime (version 1's samples.npz records it)
FIXED_VERSIONS = {"libjpeg": "golden", "pillow": "golden"}  # decoder_versions: no JPEG is decoded here
ROWS = [  # key, label, split; "ISIC 0006" is sanitized to ISIC_0006 (original_key kept)
    ("ISIC_0001", "benign", "train"),
    ("ISIC_0002", "malignant", "train"),
    ("ISIC_0003", "benign", "train"),
    ("ISIC_0004", "malignant", "train"),
    ("ISIC_0005", "benign", "val"),
    ("ISIC 0006", "malignant", "val"),
]
# version 2: the same images and labels with a lesion (the group), an age (float, one missing), a body site
# (string: unicode, one missing) and a target (int); splits are drawn per lesion, stratified
META_HEADER = ["image", "lesion", "dx", "age", "site", "target"]
META = [
    ("L1", "45", "back", "0"),
    ("L2", "60.5", "épaule", "1"),
    ("L1", "", "back", "0"),
    ("L3", "70", "lower extremity", "1"),
    ("L4", "30", "", "0"),
    ("L3", "70", "頭皮", "1"),
]
META_TYPED = [
    {"lesion": lesion, "age": float(age) if age else None, "site": site or None, "target": int(target)}
    for lesion, age, site, target in META
]
TEXT = (".json", ".jsonl", ".idx")


@dataclass(frozen=True)
class Corpus:
    """How format version N's golden conversion is made: its manifest and convert options."""

    version: int
    manifest: str
    options: tuple[str, ...]

    def image(self, i: int) -> str:
        """Image i's path, relative to the manifest."""
        return f"img/{i:04d}.ppm" if self.version == 1 else f"img/{ROWS[i - 1][0]}.ppm"


CORPORA = {
    1: Corpus(1, "manifest.csv", ()),
    2: Corpus(
        2,
        "metadata.csv",
        (
            "--key",
            "image",
            "--label",
            "dx",
            "--path",
            "img/{image}.ppm",
            "--group",
            "lesion",
            "--stratify",
            "--val-fraction",
            "0.34",
        ),
    ),
}
CORPORA[3] = Corpus(3, CORPORA[2].manifest, CORPORA[2].options)  # version 2's corpus; samples.npz gains phash


def golden_dir(version: int = FORMAT_VERSION) -> Path:
    return GOLDEN_ROOT / f"format-v{version}"


def pixels(i: int) -> np.ndarray:
    """Image i: a fixed uint8 [8, 8, 3] pattern."""
    y, x, c = np.meshgrid(np.arange(S), np.arange(S), np.arange(3), indexing="ij")
    return ((i * 37 + y * 11 + x * 5 + c * 101 + (x * y) % 7) % 256).astype(np.uint8)


def write_corpus(root: Path, version: int = FORMAT_VERSION) -> Path:
    """Format version ``version``'s golden corpus: PPM files and a manifest, every byte and mtime fixed;
    returns the manifest."""
    corpus = CORPORA[version]
    (root / "img").mkdir(parents=True)
    with open(root / corpus.manifest, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["key", "path", "label", "split"] if version == 1 else META_HEADER)
        for i, (key, label, split) in enumerate(ROWS, 1):
            path = root / corpus.image(i)
            path.write_bytes(f"P6\n{S} {S}\n255\n".encode() + pixels(i).tobytes())
            os.utime(path, ns=(MTIME_NS, MTIME_NS))
            w.writerow(
                [key, corpus.image(i), label, split] if version == 1 else [key, META[i - 1][0], label, *META[i - 1][1:]]
            )
    return root / corpus.manifest


@pytest.fixture
def fixed_provenance(monkeypatch):
    """index.json records the wds-tools and decoder versions; pin them so an upgrade of either
    (which cannot change these pixels) does not change the golden bytes."""
    import wds_tools.convert.pipeline as pipeline

    monkeypatch.setattr(pipeline, "__version__", "golden")
    monkeypatch.setattr(pipeline, "decoder_versions", lambda: dict(FIXED_VERSIONS))


def convert_corpus(
    root: Path, version: str = "v1", *extra: str, corpus: int = FORMAT_VERSION, workers: str | None = "1"
) -> Path:
    """Convert root's manifest (of format version ``corpus``'s corpus) as a user would, from root, with
    a relative --source (``workers`` None: no --workers, the default)."""
    c = CORPORA[corpus]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        r = CliRunner().invoke(
            cli,
            [
                "convert",
                "--source",
                c.manifest,
                "--version",
                version,
                "--size",
                str(S),
                "--out",
                "shards",
                "--shard-size",
                "2",
                "--sanitize-keys",
                *(["--workers", workers] if workers is not None else []),
                "--quiet",
                *c.options,
                *extra,
            ],
        )
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


def golden_files(version: int = FORMAT_VERSION) -> dict[str, bytes]:
    out = {}
    for p in sorted(golden_dir(version).iterdir()):
        if p.name.endswith(".b64"):
            out[p.name.removesuffix(".b64")] = base64.decodebytes(p.read_bytes())
        else:
            out[p.name] = p.read_bytes()
    return out


def golden_folder(tmp_path: Path, version: int) -> Path:
    """Format version ``version``'s golden files, as a shards folder OUT/v1/8 a reader can open."""
    if not golden_dir(version).is_dir():
        pytest.fail(
            f"no golden files for format version {version}: write them with "
            f"WDS_TOOLS_WRITE_GOLDEN=1 pytest {Path(__file__).name}"
        )
    folder = tmp_path / f"golden-{version}" / "v1" / str(S)
    folder.mkdir(parents=True)
    for name, data in golden_files(version).items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture(params=READABLE_VERSIONS, ids=[f"format-v{v}" for v in READABLE_VERSIONS])
def golden(request, tmp_path) -> tuple[int, Path]:
    """(version, folder) for the golden files of every format version the readers read."""
    return request.param, golden_folder(tmp_path, request.param)


def test_the_writer_reproduces_the_golden_bytes(tmp_path, fixed_provenance):
    write_corpus(tmp_path / "a")
    made = folder_files(convert_corpus(tmp_path / "a"))
    if os.environ.get("WDS_TOOLS_WRITE_GOLDEN"):
        if FORMAT_VERSION in RELEASED:
            pytest.fail(
                f"format version {FORMAT_VERSION} is released: its golden files are never rewritten; "
                "raise FORMAT_VERSION (and docs/FORMAT.md) for a new format"
            )
        shutil.rmtree(golden_dir(), ignore_errors=True)
        golden_dir().mkdir(parents=True)
        for name, data in made.items():
            enc_name, enc = encode(name, data)
            (golden_dir() / enc_name).write_bytes(enc)
    want = golden_files()
    assert sorted(made) == sorted(want), "the conversion writes other files than the golden set"
    for name in want:
        assert made[name] == want[name], (
            f"{name} differs from tests/golden/{golden_dir().name}: the bytes of format version {FORMAT_VERSION} "
            "changed. Readers of existing shards depend on them; if the change is meant, raise FORMAT_VERSION, "
            "document it in docs/FORMAT.md and write new golden files"
        )


@pytest.mark.parametrize("workers", ["2", "3", None], ids=["workers-2", "workers-3", "default-workers"])
def test_every_worker_count_reproduces_the_golden_bytes(tmp_path, fixed_provenance, workers):
    """A pool (the default --workers is the usable cores) writes the golden bytes too: each batch placed
    in plan order, written by a worker, each shard sealed by one."""
    write_corpus(tmp_path / "a")
    made = folder_files(convert_corpus(tmp_path / "a", workers=workers))
    assert made == golden_files()


def test_a_plain_manifest_differs_from_version_1_only_as_format_md_says(tmp_path, fixed_provenance):
    """Version 1's corpus converted today, against version 1's golden files, sample by sample: the same
    pixels, labels and source facts; added only the .i32 member (the label as int32), the .json's
    dataset_version, classes_digest and original_key (the key itself when not mapped); samples.npz
    without src_mtime_ns, with i32 offsets; index.json with classes_digest, the new members and the
    decode's colour rule."""
    write_corpus(tmp_path / "a", 1)
    made_dir = convert_corpus(tmp_path / "a", corpus=1)
    old = golden_folder(tmp_path, 1)
    new_meta, old_meta = load_index(made_dir).meta, load_index(old).meta
    assert new_meta["sample"]["members"] == ["cls", "i32", "json", "npy"] and old_meta["sample"]["members"] == [
        "cls",
        "json",
        "npy",
    ]
    assert new_meta["classes_digest"] == classes_digest(old_meta["classes"])
    for m in (new_meta, old_meta):
        for k in ("format_version", "classes_digest", "sample", "samples_file", "shards"):
            m.pop(k, None)
    # the colour rule (an embedded ICC profile converted to sRGB) is recorded; version 1 ignored profiles
    assert new_meta["decode"].pop("colour") == "srgb" and "colour" not in old_meta["decode"]
    assert new_meta.pop("phash_flat_rules") == 2 and "phash_flat_rules" not in old_meta  # the phash column's flags
    assert new_meta == old_meta
    samples = {}
    for folder in (old, made_dir):
        got = samples.setdefault(folder, {})
        for tar in sorted(folder.glob("*.tar")):
            with tarfile.open(tar) as tf:
                for m in tf:
                    key, ext = m.name.split(".", 1)
                    got.setdefault((tar.name, key), {})[ext] = tf.extractfile(m).read()
    assert samples[old].keys() == samples[made_dir].keys()
    for where, o in samples[old].items():
        n = samples[made_dir][where]
        assert set(n) == set(o) | {"i32"} and n["i32"] == int(o["cls"]).to_bytes(4, "little")
        assert (n["cls"], n["npy"]) == (o["cls"], o["npy"])
        js, was = json.loads(n["json"]), json.loads(o["json"])
        assert (js.pop("dataset_version"), js.pop("classes_digest")) == ("v1", classes_digest(["benign", "malignant"]))
        assert js.pop("original_key") == was.pop("original_key", where[1]) and js == was
    a, b = read_npz(made_dir / "samples.npz"), read_npz(old / "samples.npz")
    assert set(a) == set(b) - {"src_mtime_ns"} | {"i32_offset", "i32_length", "phash"}
    for name in set(a) & set(b):
        if not name.endswith(("_offset", "json_length")) or name == "path_offsets":  # members moved; .json grew
            assert np.array_equal(a[name], b[name]), name


def test_golden_files_hold_what_the_format_promises(golden):
    """Read with the standard library and numpy only: the fixed arrays, labels, members, order, and in
    version 2 each sample's metadata (types, missing values, unicode) in its .json and in samples.npz."""
    version, folder = golden
    meta = load_index(folder).meta
    assert meta["format_version"] == version and meta["classes"] == ["benign", "malignant"]
    stored = {}
    for shard in meta["shards"]:
        with tarfile.open(folder / shard["name"]) as tf:
            members = tf.getmembers()
            assert all(m.mtime == 0 and m.uid == 0 and m.mode == 0o644 and not m.pax_headers for m in members)
            names = [m.name for m in members]
            exts = ["cls", "json", "npy"] if version == 1 else ["cls", "i32", "json", "npy"]
            M = len(exts)
            assert len(names) == M * shard["samples"]
            for j in range(0, len(names), M):
                key = names[j][:-4]
                assert names[j : j + M] == [f"{key}.{e}" for e in exts]
                data = {e: tf.extractfile(members[j + t]).read() for t, e in enumerate(exts)}
                stored[key] = (
                    int(data["cls"]),
                    np.load(io.BytesIO(data["npy"])),
                    json.loads(data["json"].decode("utf-8")),
                    shard["split"],
                )
                if version >= 2:  # the label as int32; the dataset named; every optional field present
                    assert data["i32"] == int(data["cls"]).to_bytes(4, "little")
                    js = stored[key][2]
                    assert (js["dataset_version"], js["classes_digest"]) == ("v1", meta["classes_digest"])
                    assert js["original_key"] == ("ISIC 0006" if key == "ISIC_0006" else key)
    columns = np.load(folder / "samples.npz")
    keys = columns["key"].astype("U").tolist()
    for i, (key, label, _) in enumerate(ROWS, 1):
        key = key.replace(" ", "_")
        assert stored[key][0] == meta["classes"].index(label)
        assert np.array_equal(stored[key][1], pixels(i)), key
        if version == 1:
            assert "meta" not in stored[key][2] and "metadata" not in meta
            continue
        want = META_TYPED[i - 1]
        got = stored[key][2]["meta"]
        assert got == want and [type(got[k]) for k in want] == [type(want[k]) for k in want], key
        row = keys.index(key)
        assert [c["name"] for c in meta["metadata"]] == ["lesion", "age", "site", "target"]
        assert [c["type"] for c in meta["metadata"]] == ["string", "float", "string", "int"]
        lesions = bytes(columns["meta0_data"]).decode()
        assert np.isnan(columns["meta1"][row]) if want["age"] is None else columns["meta1"][row] == want["age"]
        assert (columns["meta3"][row], columns["meta3_missing"][row]) == (want["target"], False)
        site = columns["meta2"][row]
        if want["site"] is None:
            assert site == -1
        else:
            o = columns["meta2_offsets"]
            assert bytes(columns["meta2_data"][o[site] : o[site + 1]]).decode() == want["site"]
        assert lesions == "L1L2L3L4"
    if version >= 2:  # every lesion in one split
        splits: dict[str, set] = {}
        for _key, (_, _, js, split) in stored.items():
            splits.setdefault(js["meta"]["lesion"], set()).add(split)
        assert all(len(s) == 1 for s in splits.values()) and {"train", "val"} <= set().union(*splits.values())


def test_format_doc_names_the_version():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md").read_text()
    assert re.match(rf"# wds-tools on-disk format — version {FORMAT_VERSION}\n", doc)


@pytest.mark.parametrize("reader", ["auto", "stream"])
def test_the_loader_reads_the_golden_files(golden, reader):
    from training_adapter import make_loader

    version, folder = golden
    split_of = {s["name"]: s["split"] for s in load_index(folder).meta["shards"]}
    keys = [k.replace(" ", "_") for k, _, _ in ROWS]
    total = 0
    for split in ("train", "val"):
        loader = make_loader(
            folder, batch_size=2, train=False, split=split, num_workers=0, return_keys=True, reader=reader
        )
        seen = 0
        for images, labels, batch_keys in loader:
            for im, lab, k in zip(images, labels, batch_keys):
                i = keys.index(k)
                assert np.array_equal(im.permute(1, 2, 0).numpy(), pixels(i + 1)), k
                assert int(lab) == ["benign", "malignant"].index(ROWS[i][1])
                seen += 1
        n = sum(s["samples"] for s in load_index(folder).meta["shards"] if split_of[s["name"]] == split)
        assert seen == n > 0
        total += seen
    assert total == len(ROWS)


def test_stats_verify_and_diff_read_the_golden_files(golden, tmp_path, fixed_provenance):
    from wds_tools.inspect.diff import diff_versions
    from wds_tools.inspect.stats import compute_stats
    from wds_tools.inspect.verify import verify

    version, folder = golden
    report = verify(folder)
    assert report.ok and report.samples == 6 and report.shards == 3, report.to_text()
    assert verify(folder, scan=True).ok
    st = compute_stats(folder, workers=1).to_dict()
    assert st["samples"] == 6 and sum(sp["shards"] for sp in st["splits"].values()) == 3
    # the next version of the same corpus, by today's converter: one image changed, one relabeled, one removed
    root = tmp_path / "v2"
    manifest = write_corpus(root, version)
    lines = manifest.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].replace("benign", "malignant")
    del lines[3]
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / CORPORA[version].image(4)).write_bytes(f"P6\n{S} {S}\n255\n".encode() + (255 - pixels(4)).tobytes())
    (root / "shards" / "v1").mkdir(parents=True)
    shutil.copytree(folder, root / "shards" / "v1" / str(S))
    new = convert_corpus(root, "v2", corpus=version)
    d = diff_versions(folder, new).to_dict()
    assert (d["added"], d["removed"], d["changed"], d["relabeled"]) == ([], ["ISIC_0003"], ["ISIC_0004"], ["ISIC_0001"])


def test_an_incremental_conversion_takes_the_golden_files_as_its_base(golden, tmp_path, fixed_provenance, monkeypatch):
    """v2 of the same corpus copies every sample from the golden shards (none decoded) and is the
    golden set but for the version's name, the base it came from (and the format version it is
    written in)."""
    from wds_tools.convert import convert

    version, folder = golden
    root = tmp_path / "inc"
    write_corpus(root, version)
    (root / "shards" / "v1").mkdir(parents=True)
    shutil.copytree(folder, root / "shards" / "v1" / str(S))
    monkeypatch.chdir(root)  # the relative --source the golden index records
    options = CORPORA[version].options
    named = dict(zip(options[::2], options[1::2])) if version >= 2 else {}
    kw = (
        {
            "key": named["--key"],
            "label": named["--label"],
            "path": named["--path"],
            "group": named["--group"],
            "stratify": True,
            "val_fraction": 0.34,
        }
        if named
        else {}
    )
    if "colour" not in json.loads((folder / "index.json").read_text())["decode"]:
        # an index from before the colour rule was made ignoring ICC profiles: a base for --colour raw only
        from wds_tools.convert.decode import DecodeSettings

        kw["decode"] = DecodeSettings(colour="raw")
    r = convert(
        CORPORA[version].manifest,
        version="v2",
        size=S,
        out="shards",
        shard_size=2,
        sanitize_keys=True,
        workers=1,
        progress=False,
        **kw,
    )
    assert (r.decoded, r.reused, r.base) == (0, 6, "v1")
    made = folder_files(root / "shards" / "v2" / str(S))
    # byte-identical to a conversion without a base (the .json of a copied sample names the new version)
    fresh = convert(
        CORPORA[version].manifest,
        version="v2",
        size=S,
        out="fresh",
        shard_size=2,
        sanitize_keys=True,
        workers=1,
        progress=False,
        reuse=False,
        **kw,
    )
    assert fresh.decoded == 6
    plain = folder_files(root / "fresh" / "v2" / str(S))
    assert made.keys() == plain.keys()
    for name in plain:
        if name == "index.json":
            m, w = json.loads(made[name]), json.loads(plain[name])
            assert (m["build"].pop("base"), w["build"].pop("base")) == ("v1", None)
            if "split_base" in w["build"]:  # the golden lesions kept their splits
                assert (m["build"].pop("split_base"), w["build"].pop("split_base")) == ("v1", None)
            assert m == w
        else:
            assert made[name] == plain[name], name
    if version != FORMAT_VERSION:
        return
    want = golden_files(version)  # and the golden set itself, but for the version's name and its base
    assert made.keys() == want.keys()
    for name in want:
        if name.endswith(".json"):
            m, w = json.loads(made[name]), json.loads(want[name])
            if name == "index.json":
                assert (m.pop("dataset_version"), m["build"].pop("base"), m.pop("samples_file")) == (
                    "v2",
                    "v1",
                    w.pop("samples_file"),
                )
                w.pop("dataset_version"), w["build"].pop("base")
                assert (m["build"].pop("split_base"), w["build"].pop("split_base")) == ("v1", None)
                for a_, b_ in zip(m.pop("shards"), w.pop("shards")):  # each .json names v2: other sha256
                    assert a_.pop("sha256") != b_.pop("sha256") and a_ == b_
            else:
                assert m.pop("name") == w.pop("name").replace("v1/", "v2/")
            assert m == w, name
        elif name.endswith(".tar"):  # "v1" and "v2" have one length: nothing moves
            assert made[name] == want[name].replace(b'"dataset_version":"v1"', b'"dataset_version":"v2"'), name
        else:
            assert made[name] == want[name], name
