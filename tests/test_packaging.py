"""What a wheel and an sdist of the project carry: both packages' py.typed (PEP 561), the license metadata
(PEP 639) and the LICENSE text. Built offline with setuptools' PEP 517 hooks on a copy of the tree."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

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
