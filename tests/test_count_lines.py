"""scripts/count_lines.py: the counts of issue 39's size figure, checked on a file whose lines were counted by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from count_lines import count_checkout, count_source  # noqa: E402

SOURCE = '''"""A module's docstring,
over three lines.
"""

import os

X = 1
"""X's docstring."""


class A:
    """One line."""

    # only a comment
    y = 2  # a comment after code is code

    def f(self):
        """Two
        lines."""
        return "not a docstring"
'''


def test_each_line_has_its_kind_as_counted_by_hand():
    # by line: 1-3 docstring, 4 blank, 5 code, 6 blank, 7 code, 8 docstring (X's), 9-10 blank, 11 code,
    # 12 docstring, 13 blank, 14 comment, 15 code, 16 blank, 17 code, 18-19 docstring, 20 code
    assert count_source(SOURCE) == dict(lines=20, blank=6, docstring=7, comment=1, code=6)


def test_a_checkout_sums_its_two_packages(tmp_path):
    for package in ("wds_tools", "training_adapter"):
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "m.py").write_text(SOURCE)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "other.py").write_text(SOURCE)  # not the package: not counted
    assert count_checkout(tmp_path) == dict(files=2, lines=40, blank=12, docstring=14, comment=2, code=12)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "count_lines.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert f"| {tmp_path} | 2 | 40 | 12 | 14 | 2 | 12 |" in out.stdout
