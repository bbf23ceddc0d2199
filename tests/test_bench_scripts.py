"""scripts/bench_report.py and scripts/bench_resume.py run end to end at a tiny size: their synthetic data is
data the format and the loader accept (both failed once their checks grew, and nothing noticed: the report's
hand-written index.json lacked decode fields, the resume bench's tars named other keys than its index), and they
print their figures. Expected values come from stock json, zipfile/numpy and tarfile, not from the package."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def _keys(folder: Path) -> list[str]:
    """samples.npz's keys, read with stock zipfile and numpy."""
    with zipfile.ZipFile(folder / "samples.npz") as z:
        return [k.decode() for k in np.load(io.BytesIO(z.read("key.npy"))).tolist()]


def _npy_members(folder: Path) -> dict[str, int]:
    """{key: size} of every .npy member of the folder's tars, read with stock tarfile."""
    found: dict[str, int] = {}
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                if m.name.endswith(".npy"):
                    assert m.name[:-4] not in found, f"{m.name} twice"
                    found[m.name[:-4]] = m.size
    return found


def test_bench_report_runs_and_prints_its_figures(tmp_path):
    out = _run(
        "scripts/bench_report.py", "--samples", "400", "--shards", "20", "--rounds", "1", "--keep", str(tmp_path)
    )
    rows = {m[0]: [float(x) for x in m[1:]] for m in re.findall(r"^\| (report|stats \+ diff) \| ([\d.]+) \| ([\d.]+) \| (\d+) \|", out, re.M)}  # fmt: skip
    assert set(rows) == {"report", "stats + diff"}, out
    for wall, cpu, rss in rows.values():
        assert 0 < wall < 120 and 0 <= cpu < 120 and 20 < rss < 4096, out
    page = re.search(r"the page ([\d.]+) MB, (\d+) thumbnails", out)
    assert page and 0 < float(page[1]) <= 10 and int(page[2]) > 0, out
    ratio = re.search(r"ratio report / \(stats \+ diff\): ([\d.]+)", out)
    assert ratio and 0 < float(ratio[1]) < 100, out
    assert out.count("PASS") == 3, out
    assert abs((tmp_path / "report.html").stat().st_size / 1e6 - float(page[1])) <= 0.005  # the page it timed
    v0, v1 = tmp_path / "shards/v0/224", tmp_path / "shards/v1/224"
    m0, m1 = (json.loads((v / "index.json").read_text()) for v in (v0, v1))
    assert m0["samples"] == m1["samples"] == 400 and m1["build"]["base"] == "v0"
    assert sum(s["samples"] for s in m1["shards"]) == 400 and {s["split"] for s in m1["shards"]} == {"train", "val"}
    k0, k1 = _keys(v0), _keys(v1)
    assert len(set(k0)) == len(set(k1)) == 400 and set(k0) != set(k1)  # keys removed and added
    for v, keys in ((v0, k0), (v1, k1)):
        written = _npy_members(v)
        assert written and set(written) <= set(keys)  # every .npy a tar holds is named by a key of the index
        assert set(written.values()) == {128 + 224 * 224 * 3}


def test_bench_resume_runs_and_prints_its_figures(tmp_path):
    out = _run("scripts/bench_resume.py", "--samples", "3000", "--per-shard", "500", "--rounds", "1", "--work", str(tmp_path))  # fmt: skip
    assert "index of 3,000 samples" in out, out
    state = re.search(r"state after batch (\d+) of (\d+): position ([\d,]+)", out)
    assert state and int(state[2]) == 3000 // 64 and int(state[1]) == int(0.9 * 46) + 1, out
    assert int(state[3].replace(",", "")) == int(state[1]) * 64  # the state names the samples read
    rows = re.findall(r"^\s+([02]) +(\d+) ms +(\d+) ms +([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["0", "2"], out
    for _, fresh, resumed, ratio in rows:
        assert 0 < int(fresh) < 60_000 and 0 < int(resumed) < 60_000 and float(ratio) > 0, out
    (folder,) = [p.parent for p in tmp_path.glob("resume-*/index.json")]
    meta = json.loads((folder / "index.json").read_text())
    assert meta["samples"] == 3000 and len(meta["shards"]) == 6
    keys = _keys(folder)
    assert keys == [f"r{i:07d}" for i in range(3000)]
    written = _npy_members(folder)  # every key's .npy, under its own name, as the converter writes them
    assert sorted(written) == keys and set(written.values()) == {128 + 32 * 32 * 3}


def test_bench_resume_stream_runs_and_prints_its_figures(tmp_path):
    out = _run("scripts/bench_resume.py", "--reader", "stream", "--stream-samples", "1000", "--rounds", "1", "--work", str(tmp_path))  # fmt: skip
    rows = re.findall(r"^\s+([02]) +(\d+) ms +(\d+) ms +(\d+) ms +([\d.]+) +([\d.]+)\s+\(stop after (\d+) of (\d+)\)", out, re.M)  # fmt: skip
    assert [r[0] for r in rows] == ["0", "2"], out
    for _, fresh, head, resumed, _, _, stop, total in rows:
        assert 0 < int(fresh) and 0 < int(head) and 0 < int(resumed) and 0 < int(stop) < int(total), out
