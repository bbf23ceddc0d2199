"""conftest.SLOW_TESTS stays true to the suite: every name it lists is a test of that module (a renamed test
would otherwise turn fast unnoticed), and each module keeps fast tests for ``make test-fast``."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from conftest import SLOW_TESTS

TESTS = Path(__file__).resolve().parent
# test_learning.py: its one test trains a CNN (31 s under load); test_loader_oracle.py: every test compares epochs
# with the reference loader, or needs its module's fixtures (2.9 s of CPU for one test of an error message)
ALL_SLOW = {"test_bench_scripts.py", "test_learning.py", "test_loader_oracle.py"}


@cache
def _test_functions(module: Path) -> set[str]:
    """The test functions a module defines, at any depth (a line-start ``def test_...``: parsing every module
    with ast took half a second of the fast run)."""
    return set(re.findall(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(test_\w+)", module.read_text(), re.M))


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
