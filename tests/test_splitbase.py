"""convert/splitbase.py: splits that stay put across versions (a base's groups keep their split), through
real conversions of HAM10000-shaped sets."""

import json
import shutil

import pytest
from conftest import write_ham
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wds_tools.convert import convert
from wds_tools.convert.splitbase import base_units, find_split_base
from wds_tools.errors import OptionError, OutputExistsError
from wds_tools.format.index import load_index

HAM = {"key": "image_id", "label": "dx", "path": "images/{image_id}.jpg", "group": "lesion_id"}


def _convert(manifest, out, version, **kw):
    kw = {**HAM, "val_fraction": 0.3, "shard_size": 4, "workers": 1, "progress": False, **kw}
    return convert(manifest, version=version, size=8, out=out, **kw)


def _group_splits(folder) -> dict[str, set]:
    """lesion -> the splits of its samples, from the index's metadata column and shard list."""
    idx = load_index(folder)
    lesion = idx.metadata["lesion_id"]
    found: dict[str, set] = {}
    for i, shard in enumerate(idx.samples["shard"].tolist()):
        found.setdefault(lesion.value(i), set()).add(idx.shards[shard]["split"])
    return found


@st.composite
def lesion_versions(draw):
    """(v1 lesion sizes, v2 lesion sizes): v2 keeps a prefix of v1's lesions, resized (0 removes one), and
    adds new ones."""
    v1 = draw(st.lists(st.integers(1, 4), min_size=2, max_size=14))
    kept = [draw(st.integers(0, 5)) for _ in v1]
    added = draw(st.lists(st.integers(1, 4), max_size=8))
    return v1, kept + added


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lesion_versions(), st.booleans(), st.sampled_from([0.2, 0.4]))
def test_no_lesion_in_two_splits_and_each_keeps_its_split_in_the_next_version(
    tmp_path_factory, versions, stratify, frac
):
    v1, v2 = versions
    root = tmp_path_factory.mktemp("ham")
    out = root / "out"
    _convert(write_ham(root / "a", v1), out, "v1", stratify=stratify, val_fraction=frac)
    sizes = [n for n in v2]
    if not any(sizes):
        sizes.append(1)
    # v2's manifest names lesions by position, as v1's did, so lesion j is the same lesion in both
    r = _convert(write_ham(root / "b", sizes), out, "v2", stratify=stratify, val_fraction=frac)
    first, second = _group_splits(out / "v1" / "8"), _group_splits(out / "v2" / "8")
    assert all(len(s) == 1 for s in first.values()) and all(len(s) == 1 for s in second.values())
    for lesion in set(first) & set(second):
        assert first[lesion] == second[lesion], lesion
    assert load_index(out / "v2" / "8").meta["build"]["split_base"] == "v1"
    assert r.samples_written == sum(sizes)


def test_splits_do_not_depend_on_reusing_pixels_and_follow_from(tmp_path):
    out = tmp_path / "out"
    _convert(write_ham(tmp_path / "a", [3, 2, 2, 1, 4, 2, 1, 1]), out, "v1", val_fraction=0.5)
    manifest = write_ham(tmp_path / "b", [3, 2, 2, 1, 4, 2, 1, 1, 2, 3])
    _convert(manifest, out, "v2", val_fraction=0.1)  # another fraction: the old lesions still keep theirs
    _convert(manifest, out, "v3", reuse=False, val_fraction=0.1, base=None)
    a, b, c = (_group_splits(out / v / "8") for v in ("v1", "v2", "v3"))
    assert all(b[k] == a[k] for k in a) and all(c[k] == b[k] for k in c)
    assert load_index(out / "v3" / "8").meta["build"]["split_base"] == "v2"  # the newest other version
    _convert(manifest, out, "v4", base="v1")
    assert load_index(out / "v4" / "8").meta["build"]["split_base"] == "v1"


def test_a_recorded_split_base_of_a_damaged_index_is_not_followed(tmp_path):
    """An index.json whose build.split_base is no version name is damaged: not followed (which would fail on the
    value), and the run refuses the folder naming the file and the field."""
    out = tmp_path / "out"
    _convert(write_ham(tmp_path / "a", [2, 2, 2, 1]), out, "v1")
    manifest = write_ham(tmp_path / "b", [2, 2, 2, 1, 3])
    _convert(manifest, out, "v2")
    index = out / "v2" / "8" / "index.json"
    meta = json.loads(index.read_text())
    meta["build"]["split_base"] = 5
    index.write_text(json.dumps(meta))
    with pytest.raises(
        OutputExistsError, match=rf"^{index}: build\.split_base is 5 \(int\); expected a string or null"
    ):
        _convert(manifest, out, "v2")


def test_running_the_command_again_follows_the_recorded_base(tmp_path, interrupt_writes):
    out = tmp_path / "out"
    _convert(write_ham(tmp_path / "a", [2, 2, 2, 1]), out, "v1")
    manifest = write_ham(tmp_path / "b", [2, 2, 2, 1, 3, 1, 2])
    written = interrupt_writes(1)
    with pytest.raises(KeyboardInterrupt):
        _convert(manifest, out, "v2")
    written.restore()
    # meanwhile a v3 is made (from v1: v2 has no index yet), with other splits for the new lesions
    _convert(write_ham(tmp_path / "c", [2, 2, 2, 1, 1]), out, "v3", val_fraction=0.9)
    r = _convert(manifest, out, "v2")  # resumes, still against v1 (run.json says so), not v3
    assert r.shards_resumed == 1 and load_index(out / "v2" / "8").meta["build"]["split_base"] == "v1"
    again = _convert(manifest, out, "v2")  # complete: the index records v1
    assert again.already_complete


def test_base_units_and_groups_found_in_two_splits(tmp_path):
    out = tmp_path / "out"
    manifest = write_ham(tmp_path / "a", [2, 2, 1])
    text = manifest.read_text(encoding="utf-8").splitlines()
    header = text[0] + ",split"
    rows = [line + f",{s}" for line, s in zip(text[1:], ["train", "val", "train", "train", "val"])]
    (tmp_path / "a" / "m.csv").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    # converted without --group: lesion HAM_0000000 straddles two splits, the others do not
    convert(
        tmp_path / "a" / "m.csv",
        version="v1",
        size=8,
        out=out,
        key="image_id",
        label="dx",
        path="images/{image_id}.jpg",
        workers=1,
        progress=False,
    )
    idx = load_index(out / "v1" / "8")
    assert base_units(idx, "lesion_id") == {("g", "HAM_0000001"): "train", ("g", "HAM_0000002"): "val"}
    assert base_units(idx, None) == {
        ("k", k): s for k, s in zip([f"ISIC_{i:07d}" for i in range(5)], ["train", "val", "train", "train", "val"])
    }
    assert base_units(idx, "no_such_column") == base_units(idx, None)
    base = find_split_base(out, "v2", [8], None, "lesion_id")
    assert base.version == "v1" and ("g", "HAM_0000000") not in base.splits  # drawn again, by the rule


def test_find_split_base_edge_cases(tmp_path):
    assert find_split_base(tmp_path / "nothing", "v1", [8], None, "g") is None
    assert find_split_base("s3://bucket/out", "v1", [8], None, "g") is None
    with pytest.raises(OptionError, match=r"--from v0: no finished conversion under .*v0 \(no index.json\)"):
        find_split_base(tmp_path, "v1", [8], "v0", "g")
    out = tmp_path / "out"
    _convert(write_ham(tmp_path / "a", [1, 2]), out, "v1")
    shutil.copytree(out / "v1" / "8", out / "v1" / "16")  # another size of the same version
    (out / "v1" / "16" / "index.json").write_text("{not json")
    assert find_split_base(out, "v2", [32], "v1", "lesion_id").version == "v1"  # any size of --from
    meta = json.loads((out / "v1" / "8" / "index.json").read_text())
    assert find_split_base(out, "v1", [8], None, "lesion_id") is None  # recorded: v1 had none
    assert meta["build"]["split_base"] is None


@pytest.mark.parametrize(
    "ids, new",
    [
        (lambda i: str(i // 2), "20.5"),  # int ids 0..19 in v1; one new non-integer id turns the column float
        (lambda i: f"{i // 2}.0" if i % 4 else f"{i // 2}.5", "P20"),  # float ids; one new text id turns it text
        (lambda i: str(i // 2), "P20"),  # int ids; turned text
    ],
    ids=["int to float", "float to text", "int to text"],
)
def test_a_new_cell_that_changes_the_group_columns_type_keeps_every_old_group_in_its_split(tmp_path, ids, new):
    from conftest import make_images, write_manifest

    rows = make_images(tmp_path / "c", 41)
    for i, r in enumerate(rows):
        r["patient"] = ids(i)
    fields = ("key", "path", "label", "patient")
    opts = {"key": "key", "label": "label", "path": "path", "group": "patient"}
    _convert(write_manifest(tmp_path / "c" / "v1.csv", rows[:40], fields), tmp_path / "out", "v1", **opts)
    rows[40]["patient"] = new  # one new row whose id changes the column's type
    _convert(write_manifest(tmp_path / "c" / "v2.csv", rows, fields), tmp_path / "out", "v2", **opts)

    def split_of(folder):
        idx = load_index(folder)
        return {k: idx.shards[int(s)]["split"] for k, s in zip(idx.samples.keys, idx.samples["shard"].tolist())}

    before, after = split_of(tmp_path / "out" / "v1" / "8"), split_of(tmp_path / "out" / "v2" / "8")
    assert load_index(tmp_path / "out" / "v2" / "8").meta["build"]["split_base"] == "v1"
    assert {k: after[k] for k in before} == before


# ---- issue 22 point 6 (converter side): no empty split, shares reported, --resplit


def _splits_of(folder) -> dict[str, int]:
    """split -> samples, read from the shards with stock tarfile (not from the index)."""
    import tarfile

    out: dict[str, int] = {}
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as tf:
            out[tar.name.split("-")[0]] = out.get(tar.name.split("-")[0], 0) + sum(
                1 for m in tf.getmembers() if m.name.endswith(".npy")
            )
    return out


def test_row14_the_readme_command_without_stratify_gives_a_val_split(tmp_path):
    """Row 14: 60 images / 30 lesions, --group lesion_id, default --val-fraction 0.1, no --stratify:
    every lesion hashed to train (no val split, exit 0). Now the lesion of the smallest hash goes to
    val, and the summary warns that val is far from 10%."""
    manifest = write_ham(tmp_path / "c", [2] * 30)
    res = _convert(manifest, tmp_path / "out", "v1", val_fraction=0.1)
    folder = tmp_path / "out/v1/8"
    got = _splits_of(folder)
    assert got == {"train": 58, "val": 2}
    assert res.split_shares == {"train": round(58 / 60, 4), "val": round(2 / 60, 4)}
    assert "split shares: train 96.7%, val 3.3%" in res.to_text()
    assert any(
        "val holds 3.3% of the samples, --val-fraction asks 10.0% (tolerance ±5.0%: 5 points or half "
        "--val-fraction, whichever is larger)" in w
        for w in res.split_warnings
    )
    assert "warning: val holds 3.3%" in res.to_text()
    # the lesion in val is the one of the smallest h_group, worked here from the documented hash
    import hashlib

    def h(text):
        return int.from_bytes(hashlib.blake2b(f"group:0:{text}".encode(), digest_size=8).digest(), "big")

    lesions = [f"HAM_{j:07d}" for j in range(30)]
    assert {g for g, s in _group_splits(folder).items() if s == {"val"}} == {min(lesions, key=h)}
    # the val shares per class are those of the shards
    idx = load_index(folder)
    classes = idx.classes
    val = {c: 0 for c in classes}
    whole = {c: 0 for c in classes}
    for i, shard in enumerate(idx.samples["shard"].tolist()):
        c = classes[int(idx.samples["label"][i])]
        whole[c] += 1
        val[c] += idx.shards[shard]["split"] == "val"
    assert res.class_val_shares == {c: round(val[c] / whole[c], 4) for c in classes}


def test_inherited_splits_are_said_and_resplit_redraws_them(tmp_path):
    """Row 14 continued: v2 with --stratify kept v1's groups where they were (build.split_base), said
    in the summary; --resplit draws every group again for v3, also said."""
    manifest = write_ham(tmp_path / "c", [2] * 30)
    out = tmp_path / "out"
    _convert(manifest, out, "v1", val_fraction=0.1)
    v2 = _convert(manifest, out, "v2", val_fraction=0.1, stratify=True)
    assert v2.split_base == "v1" and "groups that v1 holds keep its split (build.split_base)" in v2.to_text()
    assert _group_splits(out / "v2/8") == _group_splits(out / "v1/8")
    assert any("--resplit draws every group again" in w for w in v2.split_warnings)
    v3 = _convert(manifest, out, "v3", val_fraction=0.1, stratify=True, resplit=True)
    assert v3.split_base is None and v3.resplit
    assert "every group's split drawn afresh (--resplit)" in v3.to_text()
    assert json.loads((out / "v3/8/index.json").read_text())["build"]["split_base"] is None
    val = _splits_of(out / "v3/8")["val"]
    assert abs(val / 60 - 0.1) <= 0.05 and not v3.split_warnings  # stratified: each class near 10%
    # the same as a stratified v1 converted from nothing
    fresh = _convert(manifest, tmp_path / "fresh", "v1", val_fraction=0.1, stratify=True)
    assert fresh.split_base is None
    assert _group_splits(out / "v3/8") == _group_splits(tmp_path / "fresh/v1/8")


def test_resplit_through_the_cli(tmp_path):
    import subprocess
    import sys

    manifest = write_ham(tmp_path / "c", [2] * 10)
    common = [
        sys.executable,
        "-m",
        "wds_tools",
        "convert",
        "--source",
        str(manifest),
        "--key",
        "image_id",
        "--label",
        "dx",
        "--path",
        "images/{image_id}.jpg",
        "--group",
        "lesion_id",
        "--size",
        "8",
        "--out",
        str(tmp_path / "out"),
        "--workers",
        "1",
        "--quiet",
        "--json",
    ]
    first = subprocess.run(common + ["--version", "v1"], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    got = json.loads(
        subprocess.run(common + ["--version", "v2", "--resplit"], capture_output=True, text=True, timeout=120).stdout
    )
    assert got["resplit"] is True and got["split_base"] is None
    assert set(got["split_shares"]) == {"train", "val"} and abs(sum(got["split_shares"].values()) - 1) < 1e-3


@pytest.mark.parametrize("stratify", [False, True])
def test_two_groups_never_leave_a_split_empty(tmp_path, stratify):
    manifest = write_ham(tmp_path / "c", [3, 1])
    for frac in (0.01, 0.99):
        res = _convert(manifest, tmp_path / f"out{frac}", "v1", val_fraction=frac, stratify=stratify)
        assert set(_splits_of(tmp_path / f"out{frac}/v1/8")) == {"train", "val"}, (frac, res.to_text())
