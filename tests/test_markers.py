"""conftest.SLOW_TESTS stays true to the suite: every name it lists is a test of that module (a renamed test
would otherwise turn fast unnoticed), and each module keeps fast tests for ``make test-fast``."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from conftest import SLOW_TESTS

TESTS = Path(__file__).resolve().parent
ALL_SLOW = {"test_learning.py"}  # its one test trains a CNN (31 s under load)


@cache
def _test_functions(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    }


def test_every_slow_name_is_a_test_of_its_module():
    unknown = [
        f"{module}::{name}"
        for module, names in SLOW_TESTS.items()
        for name in names
        if not (TESTS / module).is_file() or name not in _test_functions(TESTS / module)
    ]
    assert not unknown, f"conftest.SLOW_TESTS names no such test: {unknown}"


def test_each_module_keeps_fast_tests():
    emptied = [
        module
        for module, names in SLOW_TESTS.items()
        if module not in ALL_SLOW and not (_test_functions(TESTS / module) - set(names))
    ]
    assert not emptied, f"make test-fast would run nothing of {emptied}"
