"""Count the lines of a checkout's package (wds_tools/ and training_adapter/) by kind, as issue 39 counts them.

Every line of every ``.py`` file is one of: blank; docstring (a module's, class's or function's first string,
and the string after an assignment at module or class level: an attribute's docstring); comment (a line that
is only a comment); code (everything else). Counted as the files are, so run ``ruff format`` first.

    .venv/bin/python scripts/count_lines.py [CHECKOUT ...]      (default: this checkout)
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGES = ("wds_tools", "training_adapter")


def _docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers that docstrings take in a parsed module."""
    found: set[int] = set()

    def mark(node: ast.stmt) -> None:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            mark(node.body[0])
        if isinstance(node, (ast.Module, ast.ClassDef)):
            for before, after in zip(node.body, node.body[1:]):
                if isinstance(before, (ast.Assign, ast.AnnAssign)):
                    mark(after)
    return found


def count_source(source: str) -> dict[str, int]:
    """One file's lines by kind: ``lines``, ``blank``, ``docstring``, ``comment`` and ``code``."""
    docs = _docstring_lines(ast.parse(source))
    counts = dict(lines=0, blank=0, docstring=0, comment=0, code=0)
    for number, line in enumerate(source.splitlines(), 1):
        text = line.strip()
        kind = "blank" if not text else "docstring" if number in docs else "comment" if text[0] == "#" else "code"
        counts["lines"] += 1
        counts[kind] += 1
    return counts


def count_checkout(root: Path) -> dict[str, int]:
    """The package's lines by kind, and its ``files``."""
    total = dict(files=0, lines=0, blank=0, docstring=0, comment=0, code=0)
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            total["files"] += 1
            for kind, n in count_source(path.read_text()).items():
                total[kind] += n
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkouts", nargs="*", type=Path, default=[Path(__file__).resolve().parents[1]])
    args = ap.parse_args()
    print("| checkout | files | lines | code | docstring | comment | blank |")
    print("|---|---|---|---|---|---|---|")
    for root in args.checkouts:
        c = count_checkout(root)
        print(
            f"| {root} | {c['files']} | {c['lines']:,} | {c['code']:,} | {c['docstring']:,} | "
            f"{c['comment']:,} | {c['blank']:,} |"
        )


if __name__ == "__main__":
    main()
