"""docs/READERS.md: every recipe, taken from the doc as written, run on a real conversion.

Each Python recipe leaves ``samples``, an iterable of (key, label, pixels); each must give every
sample of its split exactly once, equal to what samples.npz and the shards hold. DALI cannot be
installed here: its recipe's inputs (the .idx files, checked by DALI's own parsing rules against
tarfile's offsets) and its label step are checked instead. A reader that is missing is skipped with
the line that installs it; under CI (``CI`` set) it fails, since CI must run them all.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import xxhash
from conftest import write_manifest

from wds_tools.convert import convert
from wds_tools.convert.plan import key_hash
from wds_tools.synth import jpeg_bytes, photo_like

DOC = Path(__file__).resolve().parent.parent / "docs" / "READERS.md"
ROOT_LINE = 'root = "shards/v1/224"'
# A recipe that leaks a file (json.load(open(...)) did, issue 32) fails its test: a ResourceWarning is an error,
# and one raised in a finaliser, which Python only prints, reaches pytest as PytestUnraisableExceptionWarning.
# Except webdataset 1.0.2's own: it leaves each shard's file to the garbage collector (webdataset issue #311),
# whatever the recipe does; READERS.md says so.
WDS_SHARD_LEAK = r"unclosed file <_io\.BufferedReader name='[^']*\.tar'>"
pytestmark = [
    pytest.mark.filterwarnings("error::ResourceWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings(f"ignore:{WDS_SHARD_LEAK}:ResourceWarning"),
]
SH_ROOT_LINE = "root=shards/v1/224"
S = 16
CLASSES = [f"c{i:02d}" for i in range(12)]  # label 10 and 11: two ASCII digits in .cls
PIP_TEST = "pip install -c constraints.txt -e '.[test]'"
_RECIPE = re.compile(r"<!-- recipe: ([\w-]+)[^\n]*-->\n```(\w+)\n(.*?)```", re.S)


# ------------------------------------------------------------------ the conversion and its truth


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """56 JPEG and PNG sources in 12 classes: train in 5 shards, val in one; three keys mapped by
    --sanitize-keys, none of them among the first 5 samples of train-000000 (``original_key`` is
    in every sample's json all the same: the key itself when it was not mapped)."""
    root = tmp_path_factory.mktemp("readers")
    (root / "img").mkdir()
    rows = []
    for i in range(56):
        im = photo_like(72 + 8 * (i % 4), 96 - 8 * (i % 3), seed=i)
        if i % 4 == 3:
            rel = f"img/{i:04d}.png"
            (im.convert("RGBA") if i % 8 == 7 else im).save(root / rel)
        else:
            rel = f"img/{i:04d}.jpg"
            (root / rel).write_bytes(jpeg_bytes(im, quality=90))
        rows.append(
            {
                "key": f"s{i:04d}",
                "path": rel,
                "label": CLASSES[i % len(CLASSES)],
                "split": "val" if i % 10 == 0 else "train",
            }
        )
    train = [r for r in rows if r["split"] == "train"]
    for r in sorted(train, key=lambda r: key_hash(f"s_{r['key'][1:]}", 0))[-3:]:
        r["key"] = f"s {r['key'][1:]}"  # sanitized to s_NNNN, original kept in the json
    write_manifest(root / "m.csv", rows)
    convert(
        root / "m.csv",
        version="v1",
        size=S,
        out=root / "out",
        shard_size=10,
        workers=1,
        progress=False,
        sanitize_keys=True,
    )
    out = root / "out" / "v1" / str(S)
    meta = json.loads((out / "index.json").read_text())
    assert meta["splits"]["train"]["shards"] == 5 and meta["splits"]["val"]["shards"] == 1
    with tarfile.open(out / "train-000000.tar") as tf:
        first = [json.loads(tf.extractfile(m).read()) for m in tf if m.name.endswith(".json")][:5]
    assert all(j["original_key"] == j["key"] for j in first)  # in every json (format version 2)
    return out


def truth(folder: Path, split: str) -> dict[str, tuple[int, np.ndarray]]:
    """key -> (label, pixels) of a split, from samples.npz and the shard bytes it points at
    (each .npy checked against its recorded XXH3-64)."""
    meta = json.loads((folder / "index.json").read_text())
    with np.load(folder / "samples.npz") as z:
        cols = {name: z[name] for name in z.files}
    out = {}
    for r in range(len(cols["key"])):
        shard = meta["shards"][int(cols["shard"][r])]
        if shard["split"] != split:
            continue
        with open(folder / shard["name"], "rb") as f:
            f.seek(int(cols["npy_offset"][r]))
            data = f.read(int(cols["npy_length"][r]))
        assert xxhash.xxh3_64_intdigest(data) == int(cols["npy_xxh3"][r])
        out[cols["key"][r].decode()] = (int(cols["label"][r]), np.load(io.BytesIO(data)))
    assert len(out) == meta["splits"][split]["samples"]
    return out


def check(samples, want: dict[str, tuple[int, np.ndarray]]) -> list[str]:
    """Every sample of ``want`` exactly once, each with its label and pixels; returns the keys."""
    keys = []
    for key, label, pixels in samples:
        pixels = np.asarray(pixels)
        assert key in want, f"{key!r} is not a sample of this split"
        assert int(label) == want[key][0], key
        assert pixels.dtype == np.uint8 and pixels.shape == (S, S, 3), (key, pixels.dtype, pixels.shape)
        assert np.array_equal(pixels, want[key][1]), key
        keys.append(key)
    assert len(keys) == len(set(keys)), "a sample came twice"
    assert sorted(keys) == sorted(want)
    return keys


# ------------------------------------------------------------------ the recipes, from the doc


def recipe(name: str) -> tuple[str, str]:
    """(language, code) of the block under ``<!-- recipe: name -->`` in docs/READERS.md."""
    found = {m.group(1): (m.group(2), m.group(3)) for m in _RECIPE.finditer(DOC.read_text())}
    assert name in found, f"docs/READERS.md has no recipe {name!r} (has {sorted(found)})"
    return found[name]


def with_root(code: str, line: str, root: Path) -> str:
    assert code.count(line) == 1, f"the recipe must set {line!r} once"
    return code.replace(line, line.split("=")[0] + "=" + (repr(str(root)) if " " in line else str(root)))


def run_recipe(name: str, root: Path | None = None, **names):
    """Run a Python recipe with ``root`` pointed at ``root``; returns its namespace."""
    lang, code = recipe(name)
    assert lang == "python", name
    if root is not None:
        code = with_root(code, ROOT_LINE, root)
    ns = dict(names)
    exec(compile(code, f"READERS.md:{name}", "exec"), ns)
    return ns


def need(module: str, install: str = PIP_TEST):
    """Import ``module``, or skip naming the install line (fail under CI)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        message = f"{module} is not installed ({e}); install it with: {install}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run every reader recipe, but {message}")
        pytest.skip(message)


def need_tool(name: str, install: str, version_has: str) -> str:
    path = shutil.which(name)
    ok = path is not None and version_has in subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    if not ok:
        message = f"{name} ({version_has}) is not installed; install it with: {install}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run every reader recipe, but {message}")
        pytest.skip(message)
    return path


def test_every_recipe_in_the_doc_is_run_here():
    names = {m.group(1) for m in _RECIPE.finditer(DOC.read_text())}
    tested = {
        "webdataset",
        "webdataset-ranks",
        "webdataset-one-shard",
        "wids",
        "hf-datasets",
        "hf-datasets-metadata",
        "ray-data",
        "dali",
        "gnu-tar",
        "bsdtar",
        "extracted-files",
        "python-tarfile",
    }
    assert names == tested
    assert DOC.read_text().count("```python") + DOC.read_text().count("```sh") == len(names)


# ------------------------------------------------------------------ webdataset


def test_webdataset(folder):
    wds = need("webdataset")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the recipe warns about nothing (but for webdataset's own leak)
        warnings.filterwarnings("ignore", WDS_SHARD_LEAK, ResourceWarning)
        check(run_recipe("webdataset", folder)["samples"], truth(folder, "train"))
    with pytest.warns(UserWarning, match="shardshuffle"):  # why the recipe names shardshuffle
        wds.WebDataset(str(folder / "train-000000.tar"))


def test_webdataset_on_two_ranks_with_workers(folder, monkeypatch):
    wds = need("webdataset")
    want = truth(folder, "train")
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        seen.append(set(check_part(run_recipe("webdataset-ranks", folder)["samples"], want)))
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(want)
    with pytest.raises(ValueError, match="nodesplitter"):  # why the recipe names the node splitter
        next(iter(wds.WebDataset(str(folder / "train-000000.tar"), shardshuffle=False)))


def check_part(samples, want: dict) -> list[str]:
    """``check`` for one rank's share: every sample correct and once, a subset of ``want``."""
    got = list(samples)
    return check(got, {k: want[k] for k, _, _ in got})


def test_webdataset_one_shard_split_with_two_workers(folder):
    wds = need("webdataset")
    torch = need("torch")
    check(run_recipe("webdataset-one-shard", folder)["samples"], truth(folder, "val"))
    ds = wds.WebDataset(str(folder / "val-000000.tar"), shardshuffle=False).decode()
    with pytest.raises(ValueError, match="No samples found"):  # why the recipe sets empty_check=False
        list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))


# ------------------------------------------------------------------ wids, Hugging Face, Ray


def test_wids_reads_in_place(folder):
    need("wids")
    before = sorted(p.name for p in folder.iterdir())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(run_recipe("wids", folder)["samples"], truth(folder, "train"))
    assert sorted(p.name for p in folder.iterdir()) == before  # no copy, no lock file left


def test_hugging_face_datasets(folder, tmp_path, monkeypatch):
    datasets = need("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    ns = run_recipe("hf-datasets", folder)
    want = truth(folder, "train")
    check(ns["samples"], want)
    originals = {x["json"]["key"]: x["json"]["original_key"] for x in ns["ds"]}
    assert sorted(k for k, o in originals.items() if o != k) == sorted(k for k in want if k.startswith("s_"))
    # no features= needed: every json has original_key (none of the first 5 was mapped), and the
    # recipe's dtype gives uint8 pixels
    assert "original_key" in ns["ds"].features["json"]
    assert sorted(ns["ds"].features["json"]) == sorted(
        json.loads(next(m for m in _members(folder / "train-000000.tar") if m[0].endswith(".json"))[1])
    )
    # the recipe with features= from index.json reads a set without metadata columns the same
    with_features = run_recipe("hf-datasets-metadata", folder)
    check(with_features["samples"], want)
    assert [x["json"] for x in with_features["ds"]] == [x["json"] for x in ns["ds"]]


@pytest.fixture(scope="module")
def ray_local():
    ray = need("ray")
    need("ray.data", "pip install -c constraints.txt 'ray[data]'")
    owns = not ray.is_initialized()
    if owns:
        import logging

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    yield ray
    if owns:
        ray.shutdown()


def test_ray_data(folder, ray_local):
    check(run_recipe("ray-data", folder)["samples"], truth(folder, "train"))
    with pytest.raises(Exception, match="invalid header"):  # why the recipe names the tars
        ray_local.data.read_webdataset(str(folder)).take_all()


# ------------------------------------------------------------------ DALI, on its inputs


def _members(tar: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(tar) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isfile()]


def dali_reader(paths: list[str], index_paths: list[str], ext: list[str], dtype_sizes: list[int]):
    """What ``fn.readers.webdataset`` reads for these arguments, by the rules of DALI's loader
    (webdataset_loader.cc): per sample, the raw bytes of each ``ext`` and the member names."""
    for path, index_path in zip(paths, index_paths, strict=True):
        head, *lines = Path(index_path).read_text().split("\n")
        version, count = head.split(" ")
        assert version == "v1.2" and int(count) > 0, f"{index_path}: DALI refuses {head!r}"
        assert len(lines) == int(count) + 1 and lines[-1] == ""
        data = Path(path).read_bytes()
        for line in lines[:-1]:
            parts = line.split(" ")
            assert len(parts) % 4 == 0, line
            members = {parts[i]: (int(parts[i + 1]), int(parts[i + 2]), parts[i + 3]) for i in range(0, len(parts), 4)}
            for offset, _size, _name in members.values():
                assert offset % 512 == 0 and offset < len(data), line
            for e, dsize in zip(ext, dtype_sizes):
                assert e in members, f"{index_path}: no {e!r} in {line!r}"
                assert members[e][1] % dsize == 0, f"{index_path}: component size and dtype incompatible"
            yield {e: data[members[e][0] : members[e][0] + members[e][1]] for e in ext}, members[ext[0]][2]


def test_dali_recipe_inputs_and_labels(folder):
    _, code = recipe("dali")
    for needed in (
        'ext=["npy", "i32"]',
        "dtypes=[types.UINT8, types.INT32]",
        "start=[128]",
        "shape=[S * S * 3]",
        "shape=[S, S, 3]",
    ):
        assert needed in code, needed  # what the emulation below assumes
    setup = with_root(
        code.split("\n\n\n@pipeline_def")[0].replace("from nvidia.dali import fn, pipeline_def, types\n", ""),
        ROOT_LINE,
        folder,
    )
    ns: dict = {}
    exec(setup, ns)  # the recipe's own paths, index paths and S
    assert ns["S"] == S
    for shard, index_path in zip(ns["shards"], ns["index_paths"], strict=True):
        with tarfile.open(shard) as tf:
            members = [(m.name, m.offset_data, m.size) for m in tf if m.isfile()]
        listed = [
            (p[i + 3], int(p[i + 1]), int(p[i + 2]))
            for line in Path(index_path).read_text().splitlines()[1:]
            for p in [line.split(" ")]
            for i in range(0, len(p), 4)
        ]
        assert listed == members  # every member tarfile sees, at its data offset, in file order
    reads = list(dali_reader(ns["shards"], ns["index_paths"], ["npy", "i32"], [1, 4]))
    npy = [r["npy"] for r, _ in reads]
    labels = [np.frombuffer(r["i32"], "<i4") for r, _ in reads]  # DALI's INT32 output: one value per sample
    assert all(lab.shape == (1,) for lab in labels) and {int(lab[0]) for lab in labels} >= {10, 11}
    with pytest.raises(AssertionError, match="component size and dtype incompatible"):  # why not .cls
        list(dali_reader(ns["shards"], ns["index_paths"], ["npy", "cls"], [1, 4]))
    labels = [int(lab[0]) for lab in labels]
    pixels = [np.frombuffer(b, np.uint8, count=S * S * 3, offset=128).reshape(S, S, 3) for b in npy]
    keys = [name.split(".")[0] for _, name in reads]
    check(zip(keys, labels, pixels), truth(folder, "train"))


# ------------------------------------------------------------------ tar tools


def run_sh(name: str, root: Path, cwd: Path) -> None:
    lang, code = recipe(name)
    assert lang == "sh"
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", with_root(code, SH_ROOT_LINE, root)], cwd=cwd, capture_output=True, text=True
    )
    assert r.returncode == 0 and not r.stderr, r.stderr


@pytest.mark.parametrize("tool", ["gnu-tar", "bsdtar", "python-tarfile"])
def test_tar_tools(folder, tmp_path, monkeypatch, tool):
    monkeypatch.chdir(tmp_path)
    if tool == "gnu-tar":
        need_tool("tar", "apt-get install tar", "GNU tar")
        run_sh(tool, folder, tmp_path)
    elif tool == "bsdtar":
        need_tool("bsdtar", "apt-get install libarchive-tools", "libarchive")
        run_sh(tool, folder, tmp_path)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run_recipe(tool, folder)
    check(run_recipe("extracted-files")["samples"], truth(folder, "train"))
    for p in (tmp_path / "extracted" / "train").iterdir():
        assert p.stat().st_mode & 0o777 == 0o644 and p.stat().st_mtime == 0, p


# ------------------------------------------------------------------ review of issues 14/16: metadata


def test_hugging_face_datasets_reads_a_sparse_metadata_column(tmp_path, monkeypatch):
    datasets = need("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    (tmp_path / "c" / "img").mkdir(parents=True)
    keys = [f"s{i:04d}" for i in range(30)]
    last = max(keys, key=lambda k: (key_hash(k, 0), k))  # written last in the one train shard
    rows = []
    for i, key in enumerate(keys):
        (tmp_path / "c" / f"img/{key}.jpg").write_bytes(jpeg_bytes(photo_like(24, 20, seed=i), quality=90))
        rows.append(
            {
                "key": key,
                "path": f"img/{key}.jpg",
                "label": "ab"[i % 2],
                "split": "train",
                "visits": "3" if key == last else "",
            }
        )  # an int column, present in one row only
    write_manifest(tmp_path / "c" / "m.csv", rows, fields=("key", "path", "label", "split", "visits"))
    convert(tmp_path / "c" / "m.csv", version="v1", size=S, out=tmp_path / "out", workers=1, progress=False)
    folder = tmp_path / "out" / "v1" / str(S)
    stored = {
        json.loads(d)["key"]: json.loads(d) for n, d in _members(folder / "train-000000.tar") if n.endswith(".json")
    }
    assert [j["meta"]["visits"] for j in stored.values()][:5] == [None] * 5 and stored[last]["meta"]["visits"] == 3
    with pytest.raises(Exception) as failed:  # without features=, as READERS.md says
        run_recipe("hf-datasets", folder)
    chain, e = [], failed.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert any("Couldn't cast array of type int64 to null" in c for c in chain), chain
    ns = run_recipe("hf-datasets-metadata", folder)
    check(ns["samples"], truth(folder, "train"))
    assert {x["json"]["key"]: x["json"]["meta"]["visits"] for x in ns["ds"]} == {
        k: j["meta"]["visits"] for k, j in stored.items()
    }
    assert {x["json"]["key"]: x["json"] for x in ns["ds"]} == stored  # every field, typed as stored
