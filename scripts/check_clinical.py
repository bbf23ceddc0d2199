"""Issue 14 as a new user meets it: a HAM10000-shaped set through the CLI, checked with other code.

Writes ``HAM10000_metadata.csv`` (HAM10000's columns and class mix: nv 67 %, mel 11 %, bkl 11 %,
bcc 5 %, akiec 3 %, vasc 1.4 %, df 1.1 %; 1 to 6 photos per lesion, ages with gaps, unicode sites)
with small synthetic JPEGs, then, each step through ``python -m wds_tools``:

1. ``convert`` with the issue's command line (``--group lesion_id``, ``--size 224``);
2. reads every shard with stock ``webdataset`` and checks each sample's json ``meta`` against its CSV
   row (parsed here with ``csv``, typed by hand), and that no lesion is in two splits;
3. ``stats --by localization`` and ``verify``;
4. appends new lesions and converts v2: every old lesion keeps its split, ``verify`` passes;
5. how close ``--stratify`` gets: per class, |val share − val_fraction|, with and without it, over
   ``--seeds`` seeds (size 16), printed as medians.

    .venv/bin/python scripts/check_clinical.py --lesions 400 --seeds 5
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from wds_tools.synth import jpeg_bytes, photo_like

COLUMNS = ["lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization"]
DX = {"nv": 0.67, "mel": 0.11, "bkl": 0.11, "bcc": 0.05, "akiec": 0.03, "vasc": 0.014, "df": 0.011}
SITES = [
    "back",
    "lower extremity",
    "trunk",
    "upper extremity",
    "abdomen",
    "face",
    "chest",
    "scalp",
    "épaule",
    "頭皮",
    "",
]


def write_lesions(root: Path, first: int, count: int, image0: int, rng: np.random.Generator) -> int:
    """Append ``count`` lesions from number ``first``; returns the next image number."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    path = root / "HAM10000_metadata.csv"
    new = not path.exists()
    n = image0
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        if new:
            w.writerow(COLUMNS)
        for j in range(first, first + count):
            dx = rng.choice(list(DX), p=np.array(list(DX.values())) / sum(DX.values()))
            for _ in range(int(rng.integers(1, 7)) if rng.random() < 0.4 else 1):
                image = f"ISIC_{n:07d}"
                (root / "images" / f"{image}.jpg").write_bytes(jpeg_bytes(photo_like(48, 36, seed=n), quality=90))
                age = "" if rng.random() < 0.05 else f"{int(rng.integers(1, 18)) * 5}.0"
                w.writerow(
                    [
                        f"HAM_{j:07d}",
                        image,
                        dx,
                        rng.choice(["histo", "follow_up", "consensus"]),
                        age,
                        rng.choice(["male", "female", "unknown"]),
                        rng.choice(SITES),
                    ]
                )
                n += 1
    return n


def cli(root: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "wds_tools", *args], cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"wds-tools {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def read_with_webdataset(folder: Path) -> dict[str, tuple[str, dict]]:
    import webdataset as wds

    out = {}
    for tar in sorted(folder.glob("*.tar")):
        for sample in wds.WebDataset(str(tar), shardshuffle=False, empty_check=False).decode():
            out[sample["__key__"]] = (tar.name.rsplit("-", 1)[0], sample["json"])
    return out


def check_version(root: Path, folder: Path) -> dict[str, str]:
    """Every sample's meta equals its CSV row; returns lesion -> split (refusing a lesion in two)."""
    with open(root / "HAM10000_metadata.csv", newline="", encoding="utf-8") as f:
        rows = {r["image_id"]: r for r in csv.DictReader(f)}
    samples = read_with_webdataset(folder)
    assert len(samples) == len(rows), (len(samples), len(rows))
    lesion_split: dict[str, set] = {}
    for key, (split, js) in samples.items():
        r = rows[key]
        want = {
            "lesion_id": r["lesion_id"],
            "dx_type": r["dx_type"],
            "age": float(r["age"]) if r["age"] else None,
            "sex": r["sex"],
            "localization": r["localization"] or None,
        }
        assert js["meta"] == want, (key, js["meta"], want)
        assert js["label"] == r["dx"] and js["source_path"] == f"images/{key}.jpg"
        lesion_split.setdefault(r["lesion_id"], set()).add(split)
    several = {g: s for g, s in lesion_split.items() if len(s) > 1}
    assert not several, f"lesions in several splits: {several}"
    return {g: next(iter(s)) for g, s in lesion_split.items()}


def val_share_error(index: dict, val_fraction: float) -> list[float]:
    """Per class, |val samples / class samples − val_fraction|."""
    classes = index["classes"]
    val = index["splits"].get("val", {}).get("class_counts", [0] * len(classes))
    return [abs(v / t - val_fraction) for v, t in zip(val, index["class_counts"]) if t]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lesions", type=int, default=400)
    ap.add_argument("--new-lesions", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--val-fraction", type=float, default=0.2)
    args = ap.parse_args()
    rng = np.random.default_rng(14)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        n = write_lesions(root, 0, args.lesions, 0, rng)
        print(f"HAM10000_metadata.csv: {n} images of {args.lesions} lesions")
        print(
            cli(
                root,
                "convert",
                "--source",
                "HAM10000_metadata.csv",
                "--key",
                "image_id",
                "--label",
                "dx",
                "--path",
                "images/{image_id}.jpg",
                "--group",
                "lesion_id",
                "--version",
                "v1",
                "--size",
                "224",
                "--quiet",
                "--json",
            )[:200],
            "...",
        )
        v1 = root / "shards" / "v1" / "224"
        splits1 = check_version(root, v1)
        print(
            f"1-2. webdataset read {n} samples; every json meta equals its CSV row; {len(splits1)} lesions, "
            "each in one split"
        )
        print("3. stats --by localization:\n" + cli(root, "stats", str(v1), "--by", "localization"))
        print(cli(root, "verify", str(v1)).strip().splitlines()[-1])
        n2 = write_lesions(root, args.lesions, args.new_lesions, n, rng)
        cli(
            root,
            "convert",
            "--source",
            "HAM10000_metadata.csv",
            "--key",
            "image_id",
            "--label",
            "dx",
            "--path",
            "images/{image_id}.jpg",
            "--group",
            "lesion_id",
            "--version",
            "v2",
            "--size",
            "224",
            "--quiet",
        )
        v2 = root / "shards" / "v2" / "224"
        splits2 = check_version(root, v2)
        moved = [g for g, s in splits1.items() if splits2[g] != s]
        assert not moved, f"lesions that changed split in v2: {moved[:5]}"
        print(
            f"4. v2: {n2 - n} new images of {args.new_lesions} new lesions; all {len(splits1)} old lesions kept "
            f"their split; split_base = {json.loads((v2 / 'index.json').read_text())['build']['split_base']}"
        )
        print(cli(root, "verify", str(v2)).strip().splitlines()[-1])
        plain, strat = [], []
        for seed in range(args.seeds):
            for flag, sink in (([], plain), (["--stratify"], strat)):
                out = f"s{seed}{'s' if flag else 'p'}"
                cli(
                    root,
                    "convert",
                    "--source",
                    "HAM10000_metadata.csv",
                    "--key",
                    "image_id",
                    "--label",
                    "dx",
                    "--path",
                    "images/{image_id}.jpg",
                    "--group",
                    "lesion_id",
                    "--version",
                    "v1",
                    "--size",
                    "16",
                    "--val-fraction",
                    str(args.val_fraction),
                    "--seed",
                    str(seed),
                    "--out",
                    out,
                    "--quiet",
                    *flag,
                )
                index = json.loads((root / out / "v1" / "16" / "index.json").read_text())
                err = val_share_error(index, args.val_fraction)
                sink.append((max(err), statistics.mean(err)))
        print(
            f"5. per-class val share vs --val-fraction {args.val_fraction} ({len(DX)} classes, {args.seeds} seeds, "
            "medians over seeds):"
        )
        for name, res in (("--group", plain), ("--group --stratify", strat)):
            print(
                f"   {name:20s} largest |share - fraction| {statistics.median(r[0] for r in res):.3f}, "
                f"mean over classes {statistics.median(r[1] for r in res):.3f}"
            )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
