"""A newcomer's first minutes: a fresh virtual environment, ``pip install -e '.[train]'`` (the train extra
alone, as the README's Quick Start installs it; ``make demo`` adds the report extra for its last step), then the
Quick Start on the demo corpus: generate it, ``wds-tools convert``,
``wds-tools stats``, and the training loop ``make demo`` prints (scripts/demo_next_steps.py), run as printed.

What pip resolves for ``-c constraints.txt -e '.[train]'`` is checked from its ``--dry-run --report`` (the pinned
CPU torch, OpenCV and PyYAML; no test or bench extra, no CUDA package); the project itself is then installed
editable with ``--no-deps`` and its dependencies are this test environment's (the same pins), made visible
through a .pth file: unpacking torch again into every test run's venv cost more than a minute of the suite.
``make setup`` on CI's clean clone installs for real.

Slow (a venv, pip's resolution and an editable build); ``make test-fast`` leaves it out. It resolves from the
local index or cache as pip is configured; offline without one, pip fails and so does this test, saying so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("pyproject.toml", "README.md", "LICENSE", "constraints.txt", "wds_tools", "training_adapter", "scripts")


def _run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    run = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"{' '.join(args)} exited {run.returncode}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    return run


def _make_demo_commands() -> list[list[str]]:
    """The commands of the Makefile's demo target, each without its program ($(BIN)/python or wds-tools)."""
    lines = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return [line.strip().lstrip("@").split()[1:] for line in lines]


def test_fresh_venv_install_and_quick_start(tmp_path):
    repo = tmp_path / "wds-tools"  # a copy of the checkout, so that the editable install writes nothing into it
    repo.mkdir()
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, repo / name)
    venv = repo / ".venv"
    t0 = time.perf_counter()
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], repo)
    bin_ = venv / "bin"
    pip = [sys.executable, "-m", "pip", "--python", str(bin_ / "python"), "install", "--disable-pip-version-check"]
    _run([*pip, "--dry-run", "--quiet", "--report", "report.json", "-c", "constraints.txt", "-e", ".[train]"], repo)
    resolved = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.loads((repo / "report.json").read_text())["install"]
    }
    assert resolved["torch"].split("+")[0] == "2.13.0" and "opencv-python-headless" in resolved, resolved
    assert "pyyaml" in resolved and "wds-tools" in resolved, resolved
    # only the train extra: no test or bench dependency comes along, and no CUDA package
    assert not {"scikit-learn", "pytest", "hypothesis", "matplotlib"} & resolved.keys(), resolved
    assert not [n for n in resolved if n.startswith("nvidia")], resolved
    _run([*pip, "--quiet", "--no-deps", "-e", "."], repo)
    purelib = _run([str(bin_ / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], repo)
    borrowed = [p for p in sys.path if p.endswith("site-packages")]
    Path(purelib.stdout.strip(), "test-deps.pth").write_text("".join(f"{p}\n" for p in borrowed))
    installed = time.perf_counter() - t0
    where = _run([str(bin_ / "python"), "-c", "import wds_tools, cv2, yaml, torch; print(wds_tools.__file__)"], repo)
    assert where.stdout.strip() == str(repo / "wds_tools" / "__init__.py")  # the copy's code, editable

    # `source .venv/bin/activate` puts wds-tools on PATH (what the next steps say)
    out = _run(["bash", "-c", "source .venv/bin/activate && command -v wds-tools && wds-tools --help"], repo).stdout
    assert str(bin_ / "wds-tools") in out and "convert" in out

    py, cli = str(bin_ / "python"), str(bin_ / "wds-tools")
    # make demo's commands, in the checkout's root as the README's Quick start has them (issue 38, point 17)
    demo = _make_demo_commands()
    assert demo[0][:2] == ["scripts/make_demo_corpus.py", "--out"] and demo[0][2] == "corpus"
    _run([py, *demo[0][:3], "--count", "150"], repo)
    run = _run([cli, *demo[1]], repo)
    index = json.loads((repo / "shards/v1/224/index.json").read_text())
    train_samples = index["splits"]["train"]["samples"]
    assert train_samples + index["splits"]["val"]["samples"] == 150  # the 4 bad files are the failures
    assert "failed: 4" in run.stdout + run.stderr
    quick_start = (repo / "README.md").read_text(encoding="utf-8")
    assert "wds-tools stats shards/v1/224" in quick_start and "--out shards" in quick_start
    stats = json.loads(_run([cli, "stats", "shards/v1/224", "--json"], repo).stdout)  # as the README says
    assert stats["splits"]["train"]["samples"] == train_samples

    steps = _run([py, *demo[-1]], repo).stdout
    assert "source .venv/bin/activate" in steps and "make docs" in steps
    lines = steps.splitlines()
    snippet = "\n".join(lines[lines.index("--- train.py") + 1 : lines.index("---")])
    assert len(snippet.strip().splitlines()) <= 10
    (repo / "train.py").write_text(snippet + "\n")
    out = _run([py, "train.py"], repo).stdout
    assert f"{index['classes']} {train_samples // 64} batches per epoch" in out
    total = time.perf_counter() - t0
    print(f"\nnewcomer flow: venv + pip resolve and install {installed:.0f} s, whole flow {total:.0f} s")
