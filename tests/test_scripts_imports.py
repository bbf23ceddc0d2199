"""Every import of the package in scripts/ names a module and names that exist, including the imports inside
functions that only a long benchmark run reaches: a module moved or a name removed fails here, not in the
next person's benchmark (scripts/ have no other test of their own)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wds_tools", "training_adapter")


def _imports() -> list[tuple[str, int, str, str | None]]:
    """(script, line, module, name or None) of each import of the package in scripts/."""
    found = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] in PACKAGES:
                    found += [(path.name, node.lineno, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [
                    (path.name, node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] in PACKAGES
                ]
    return found


def test_scripts_import_the_package():
    assert len(_imports()) > 50  # the scripts do use the package: a parse that finds nothing cannot pass


@pytest.mark.parametrize("script, line, module, name", _imports(), ids=lambda v: str(v))
def test_each_import_resolves(script, line, module, name):
    mod = importlib.import_module(module)
    if name is not None and name != "*":
        has = hasattr(mod, name)
        if not has:  # a submodule named in `from package import module`
            try:
                importlib.import_module(f"{module}.{name}")
                has = True
            except ImportError:
                has = False
        assert has, f"scripts/{script}:{line}: from {module} import {name}: no such name"
