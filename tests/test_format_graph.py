"""wds_tools/format/ imports its own modules at module level only, and without a circle: each
module can be read knowing only the ones it imports."""

from __future__ import annotations

import ast
from pathlib import Path

FORMAT = Path(__file__).resolve().parents[1] / "wds_tools" / "format"


def _format_imports(path: Path) -> tuple[set[str], list[str]]:
    """(format modules imported at module level, those imported inside a function or class)."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    nested: list[str] = []

    def names(node: ast.Import | ast.ImportFrom) -> set[str]:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1:  # from .x import y / from . import x
                return {base} if base else {a.name for a in node.names}
            if base.startswith("wds_tools.format."):
                return {base.split(".")[2]}
            if base == "wds_tools.format":
                return {a.name for a in node.names}
            return set()
        return {a.name.split(".")[2] for a in node.names if a.name.startswith("wds_tools.format.")}

    def walk(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found = {n.split(".")[0] for n in names(child)}
                (nested.extend(sorted(found)) if inside else top.update(found))
            else:
                walk(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    walk(tree, False)
    return top, nested


def test_format_modules_form_a_dag_of_module_level_imports():
    graph, hidden = {}, {}
    for path in sorted(FORMAT.glob("*.py")):
        top, nested = _format_imports(path)
        graph[path.stem] = top - {path.stem}
        if nested:
            hidden[path.stem] = nested
    assert {"names", "index", "model", "meta", "tar"} <= set(graph)  # the walk saw the package
    assert graph["index"] >= {"meta", "model", "sidecars"}  # ... and its imports
    assert hidden == {}, f"function-level imports of format modules (a circle hidden?): {hidden}"
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            raise AssertionError(f"import circle: {' -> '.join(path[path.index(module) :] + (module,))}")
        if module in done:
            return
        for dep in sorted(graph.get(module, ())):
            visit(dep, path + (module,))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())
