"""scripts/bench_gpu.py runs end to end on the CPU at a tiny size, so that it cannot rot before a GPU runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu.py"


@pytest.mark.slow
def test_bench_gpu_tiny_on_the_cpu_writes_every_figure(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--work", str(tmp_path), "--seconds", "0.05"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "images_per_s" in r]
    feeds = [r["feed"] for r in trained]
    assert feeds[:8] == [
        "ceiling: one fixed batch on the device",
        "pinned cache, copied and normalised each step (to_device)",
        "make_loader defaults + to_device",
        "make_loader(device=...)",
        "make_loader(device_augment=True) + augment_batch",
        "make_loader(device_augment=True, device=...)",
        "make_loader(persistent_workers=True) + to_device",
        "make_loader(device=..., persistent_workers=True)",
    ]
    assert all(r["images_per_s"] > 0 and r["cpu_ms"] > 0 for r in trained)
    assert all(r["channels_last"] for r in trained)  # every feed gives the model channels-last batches
    assert trained[0]["ratio"] == 1.0
    assert not [r for r in rows if "error" in r]
    alone = [r for r in rows if "samples_per_s" in r]
    assert len(alone) == 6 and all(r["samples_per_s"] > 0 for r in alone)
    md = (tmp_path / "results.md").read_text()
    assert "| make_loader(device=...) |" in md and "no CUDA (CPU)" in md  # written as measured, with the machine
    for r in trained:
        assert f"| {r['ratio']:.3f} |" in run.stdout
    try:
        import torchvision  # noqa: F401
    except ImportError:
        assert "skipped: torchvision ImageFolder (torchvision is not installed)" in run.stdout
    else:
        assert any(f.startswith("torchvision ImageFolder") for f in feeds)
    # a second run finds the corpus and appends to the results
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--work", str(tmp_path), "--seconds", "0.01", "--feeds", "ceiling"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0 and "exists" not in again.stdout
    assert (tmp_path / "results.md").read_text().count("## bench_gpu") == 2


def test_bench_gpu_without_shards_says_how_to_make_them(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit, match="run with --make-corpus 8000 first"):
        bench.main(["--work", str(tmp_path)])


@pytest.mark.slow
def test_gpu_check_runs_the_stages_asked_each_under_its_limit(tmp_path):
    """scripts/gpu_check.sh on the CPU: the stages named run in order, each one's output in OUT/<stage>.log
    and its exit status in OUT/summary.txt; a stage past its limit is stopped and said to have timed out."""
    import os

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", TESTS_TIMEOUT="1")
    run = subprocess.run(
        ["sh", "scripts/gpu_check.sh", str(wheels), str(out), "preflight,tests"],
        cwd=SCRIPT.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["== preflight", "== tests"]
    assert summary[1].startswith("== tests: exit 124 after") and summary[1].endswith("(timed out)")
    assert f"torch {torch_version()}" in (out / "preflight.log").read_text()
    assert "/dev/shm" in (out / "preflight.log").read_text()
    bad = subprocess.run(
        ["sh", "scripts/gpu_check.sh", str(wheels), str(out), "figurez"], cwd=SCRIPT.parents[1], capture_output=True
    )
    assert bad.returncode == 2 and b"unknown stage 'figurez'" in bad.stderr


def torch_version() -> str:
    import torch

    return torch.__version__
