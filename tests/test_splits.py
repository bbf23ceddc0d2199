"""Classes a split leaves out (dataset.splits), as convert's summary and stats warn of them, and the split
warnings that apply only where the splits were drawn (issue 38, points 16 and 19)."""

import csv
import json
import tarfile
from pathlib import Path

from click.testing import CliRunner
from conftest import make_images, write_ham, write_manifest

from wds_tools.cli import cli
from wds_tools.dataset.splits import class_gaps, gap_warnings


def test_class_gaps_by_hand():
    counts = {"train": [5, 0, 3, 0], "val": [1, 2, 0, 0], "test": [0, 0, 1, 4]}
    assert class_gaps(["a", "b", "c", "d"], counts) == [
        {"class": "b", "samples": 2, "train": 0, "val": 2, "missing": ["train"]},
        {"class": "c", "samples": 4, "train": 3, "val": 0, "missing": ["val"]},
        {"class": "d", "samples": 4, "train": 0, "val": 0, "missing": ["train", "val"]},
    ]
    assert class_gaps(["a", "b"], {"train": [3, 0], "test": [0, 0]}) == []  # no val split: only train checked
    assert gap_warnings(class_gaps(["a", "b"], {"train": [0, 1], "val": [1, 0]}), "why") == [
        "class 'a' has no train samples (train 0, val 1 of its 1 sample): a model never learns it",
        "class 'b' has no val samples (train 1, val 0 of its 1 sample): its accuracy is never measured; why",
    ]


def _splits_by_class(folder: Path) -> dict[str, dict[str, int]]:
    """class name -> split -> samples, read from the tars with stock tarfile."""
    out: dict[str, dict[str, int]] = {}
    for tar in folder.glob("*.tar"):
        with tarfile.open(tar) as tf:
            for m in tf:
                if m.name.endswith(".json"):
                    label = json.loads(tf.extractfile(m).read())["label"]
                    split = tar.name.rsplit("-", 1)[0]
                    out.setdefault(label, {}).setdefault(split, 0)
                    out[label][split] += 1
    return out


def test_a_class_that_vanishes_from_a_split_is_a_loud_warning_in_convert_and_stats(tmp_path):
    """HAM10000-shaped, --group lesion_id: six classes of one image each (df, vasc, ... as rare
    diagnoses are) land whole in train or in val. Each is named in capitals in convert's summary and
    in stats (text and --json), exactly the classes the shards show without train or val samples."""
    manifest = write_ham(tmp_path / "ham", [1] * 6 + [3] * 8)
    rows = list(csv.reader(manifest.open(newline="", encoding="utf-8")))
    for n, row in enumerate(rows[1:7]):
        row[2] = f"rare{n}"
    with open(manifest, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    out = tmp_path / "out"
    args = ["convert", "--source", str(manifest), "--key", "image_id", "--label", "dx"]
    args += ["--path", "images/{image_id}.jpg", "--group", "lesion_id", "--val-fraction", "0.5"]
    args += ["--version", "v1", "--size", "8", "--out", str(out), "--workers", "1", "-q"]
    run = CliRunner().invoke(cli, args)
    assert run.exit_code == 0, run.output
    shown = _splits_by_class(out / "v1" / "8")
    lacking = {c: [s for s in ("train", "val") if s not in by] for c, by in shown.items()}
    lacking = {c: m for c, m in lacking.items() if m}
    assert {f"rare{n}" for n in range(6)} <= set(lacking)  # one image: in one split only
    assert {"train", "val"} == {m[0] for c, m in lacking.items() if c.startswith("rare")}  # both kinds occur
    loud = [line for line in run.output.splitlines() if line.startswith("  WARNING: ")]
    assert [line.split("'")[1] for line in loud] == sorted(lacking)
    for line in loud:
        c = line.split("'")[1]
        assert f"has no {lacking[c][0]} samples" in line, line
    assert "splits are drawn per group of 'lesion_id'" in loud[-1]
    as_json = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert {g["class"]: g["missing"] for g in as_json["class_gaps"]} == lacking
    stats = CliRunner().invoke(cli, ["stats", str(out / "v1" / "8")])
    assert [line for line in stats.output.splitlines() if line.startswith("  WARNING: ")][:-1] == [
        line for line in loud[:-1]
    ]
    stats_json = json.loads(CliRunner().invoke(cli, ["stats", str(out / "v1" / "8"), "--json"]).output)
    assert sum(w.startswith("class '") and "has no" in w for w in stats_json["warnings"]) == len(lacking)


def test_a_manifest_split_column_gets_no_val_fraction_or_stratify_warning_only_true_ones(tmp_path):
    """An 80/20 split column of the user's own (named 'split', the default): no warning about
    --val-fraction or --stratify, which do not apply; a class the column leaves out of val is still
    named, with the reason."""
    rows = make_images(tmp_path, 50, classes=("a", "b"))
    for i, r in enumerate(rows):
        r["split"] = "val" if i % 5 == 0 else "train"
    manifest = write_manifest(tmp_path / "m.csv", rows)
    base = ["convert", "--source", str(manifest), "--size", "8", "--out", str(tmp_path / "out"), "--workers", "1"]
    run = CliRunner().invoke(cli, [*base, "--version", "v1", "--json", "-q"])
    assert run.exit_code == 0, run.output
    result = json.loads(run.output)
    assert result["split_shares"] == {"train": 0.8, "val": 0.2}
    assert result["split_warnings"] == [] and result["class_gaps"] == []
    for r in rows:  # class b: all in train by the user's choice
        r["split"] = "train" if r["label"] == "b" else r["split"]
    write_manifest(tmp_path / "m.csv", rows)
    run = CliRunner().invoke(cli, [*base, "--version", "v2", "-q"])
    assert run.exit_code == 0, run.output
    warnings = [line for line in run.output.splitlines() if "warning" in line.lower()]
    assert warnings == [
        "  WARNING: class 'b' has no val samples (train 25, val 0 of its 25 samples): its accuracy is never "
        "measured; the manifest's split column put them there"
    ]
