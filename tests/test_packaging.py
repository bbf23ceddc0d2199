"""What a wheel and an sdist of the project carry: both packages' py.typed (PEP 561), the report page's
template, the license metadata (PEP 639) and the LICENSE text; and that the wheel, installed into a fresh venv, runs the README's Quick
start. Built offline with setuptools' PEP 517 hooks on a copy of the tree."""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

# slow, all of it: the module's fixture builds a wheel and an sdist (0.9 s of CPU in the fast run, for three
# checks of what they carry), and the fresh-venv test takes most of a minute
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wds_tools", "training_adapter")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, sdist) built from a copy of the files the build reads (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    out = src / "dist"
    for hook in ("build_wheel", "build_sdist"):  # one process each: in one, setuptools puts the sdist elsewhere
        code = f"import sys, setuptools.build_meta as b; b.{hook}(sys.argv[1])"
        run = subprocess.run([sys.executable, "-c", code, out], cwd=src, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return wheel, sdist


def test_the_wheel_carries_py_typed_in_both_packages(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    for pkg in PACKAGES:
        assert f"{pkg}/py.typed" in names, sorted(n for n in names if n.startswith(pkg))[:5]
        assert f"{pkg}/__init__.py" in names


def test_the_wheel_carries_the_report_page_template(built):
    """wds-tools report renders wds_tools/inspect/page/templates/ (package data): a wheel without them writes no page."""
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {
        f"wds_tools/inspect/page/templates/{p.name}" for p in (ROOT / "wds_tools/inspect/page/templates").iterdir()
    }
    assert templates >= {
        "wds_tools/inspect/page/templates/report.html.j2",
        "wds_tools/inspect/page/templates/report.css",
    }
    assert templates <= names, sorted(templates - names)


def test_the_sdist_carries_py_typed_and_the_license(built):
    _, sdist = built
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert {"wds_tools/py.typed", "training_adapter/py.typed", "LICENSE"} <= names


def test_the_wheel_says_apache_2_and_carries_the_license_text(built):
    wheel, _ = built
    z = zipfile.ZipFile(wheel)
    info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = email.message_from_bytes(z.read(info))
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    # no legacy License/classifier that could contradict the expression (PEP 639 forbids both together)
    assert meta["License"] is None
    assert not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    text = z.read(info.replace("METADATA", "licenses/LICENSE")).decode()
    assert text.startswith("Copyright 2026 the wds-tools authors\n")
    for words in ("Apache License", "Version 2.0, January 2004", "END OF TERMS AND CONDITIONS"):
        assert words in text
    assert text == (ROOT / "LICENSE").read_text()


def _quick_start() -> list[tuple[str, str]]:
    """(language, code) of the README's Quick start blocks, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(bash|python)\n(.*?)^```", section, flags=re.S | re.M)


# 51 s on the 2-core VM at load 6-8 (the Quick start's convert 22 s, its training 15 s)
def test_the_wheel_installs_into_a_fresh_venv_and_runs_the_quick_start(built, tmp_path):
    """wds-tools is not on PyPI: a wheel built from the checkout is how it reaches another environment
    (issue 32, point 11). The wheel goes into a fresh venv with --no-deps; its dependencies are this test
    environment's, made visible through a .pth file (so no network is needed, here or on CI), while
    wds_tools and training_adapter come from the wheel alone; then the README's Quick start runs from a
    folder outside the checkout, its shell blocks with the venv's wds-tools and python first on PATH."""
    wheel, _ = built
    from wds_tools.version import __version__

    assert wheel.name == f"wds_tools-{__version__}-py3-none-any.whl"  # the name README.md and docs give
    venv, ws = tmp_path / "venv", tmp_path / "ws"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"  # this environment's pip installs into it (ensurepip would take 5-10 s)
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps", "--no-index"]
    run = subprocess.run([*pip, "--disable-pip-version-check", str(wheel)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    borrowed = [p for p in sys.path if p.endswith("site-packages")]
    Path(purelib, "test-deps.pth").write_text("".join(f"{p}\n" for p in borrowed))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COLUMNS")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", PYTHONNOUSERSITE="1")
    ws.mkdir()
    (ws / "scripts").symlink_to(ROOT / "scripts", target_is_directory=True)  # the Quick start's corpus script

    where = "import wds_tools, training_adapter; print(wds_tools.__file__); print(training_adapter.__file__)"
    files = subprocess.run([str(py), "-c", where], cwd=ws, env=env, capture_output=True, text=True, timeout=60)
    assert files.returncode == 0, files.stderr
    assert all(line.startswith(purelib) for line in files.stdout.splitlines()), files.stdout  # the wheel's code
    blocks = _quick_start()
    assert [lang for lang, _ in blocks] == ["bash", "bash", "python"]
    for lang, code in blocks:
        if lang == "python":
            (ws / "quick_start.py").write_text(code)
            cmd = [str(py), "quick_start.py"]
        else:
            cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
        done = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{code}\nexited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    index = json.loads((ws / "shards" / "v1" / "224" / "index.json").read_text())
    assert index["splits"]["train"]["samples"] + index["splits"]["val"]["samples"] == 300
