"""scripts/bench_index.py runs: its synthetic index is one the format accepts (it was refused once the
model checked every field, and nothing noticed), and it reads back with the rows it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_index_writes_an_index_the_format_accepts(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/bench_index.py"), "--samples", "2000", "--shards", "3"]
        + ["--repeats", "1", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ratio baseline/ours" in out.stdout
    (index,) = tmp_path.rglob("index.json")
    meta = json.loads(index.read_text())
    assert meta["samples"] == 2000 and len(meta["shards"]) == 3
    with zipfile.ZipFile(index.parent / "samples.npz") as z:  # stock zipfile: the table holds every row
        assert "key.npy" in z.namelist()
    baseline = (index.parent / "baseline.jsonl").read_text().splitlines()
    assert len(baseline) == 2000
