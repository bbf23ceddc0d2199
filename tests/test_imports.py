"""The package's import structure: layers, no circles, and a trainer that loads no converter.

The graph is read from the source with ``ast`` (not by importing), so a circle hidden by an import
inside a function is still seen.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wds_tools", "training_adapter")


def _modules() -> dict[str, Path]:
    """Every module of the two packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The project modules an import statement names (relative imports resolved; ``from pkg import mod`` is mod)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")
            base = base if is_package else base[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
    out = []
    for name in names:
        # the longest project module the name starts with
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def _edges() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level imports, imports inside functions) between project modules.

    Imports under ``if TYPE_CHECKING:`` are left out: they never run.
    """
    top: dict[str, set[str]] = {m: set() for m in MODULES}
    inner: dict[str, set[str]] = {m: set() for m in MODULES}

    def visit(module: str, is_package: bool, node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _resolve(module, is_package, child):
                    if target != module:
                        (inner if in_function else top)[module].add(target)
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(module, is_package, child, nested)

    for module, path in MODULES.items():
        visit(module, path.name == "__init__.py", ast.parse(path.read_text(), filename=str(path)), False)
    return top, inner


TOP, INNER = _edges()


def _with_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first: add those edges."""
    out = {m: set(targets) for m, targets in graph.items()}
    for m, targets in graph.items():
        for t in targets:
            parts = t.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent in MODULES and parent != m and not m.startswith(parent + "."):
                    out[m].add(parent)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in the graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state:
                found = walk(t)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = walk(m)
            if found:
                return found
    return None


def test_the_graph_was_read():
    # the walk sees real edges (a guard against a test that passes because it read nothing)
    assert "wds_tools.errors" in TOP["wds_tools.format.index"]
    assert any(t.startswith("wds_tools.") for t in TOP["training_adapter.loader"])
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles():
    assert _cycle(_with_parents(TOP)) is None


def _path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A chain of imports from start to goal, or None."""
    seen = {start}
    todo = [[start]]
    while todo:
        chain = todo.pop()
        if chain[-1] == goal:
            return chain
        for t in sorted(graph.get(chain[-1], ())):
            if t not in seen:
                seen.add(t)
                todo.append(chain + [t])
    return None


def test_no_function_level_import_hides_a_circle():
    """An import inside a function is fine for a heavy or optional dependency, never to dodge a circle.

    It dodges one when the imported module already imports, at module level, the importing module.
    """
    graph = _with_parents(TOP)
    assert _path({"a": {"b"}, "b": {"c"}}, "a", "c") == ["a", "b", "c"]
    hidden = []
    for module, targets in INNER.items():
        for target in sorted(targets):
            back = _path(graph, target, module)
            if back:
                hidden.append(f"{module} imports {target} inside a function: {' -> '.join([module] + back)}")
    assert hidden == []


_ABOVE_FORMAT = ("wds_tools.dataset", "wds_tools.similar", "wds_tools.convert", "wds_tools.inspect", "wds_tools.cli")
LOADER_MAY_IMPORT = (
    "wds_tools.errors",
    "wds_tools.cpus",
    "wds_tools.ranks",
    "wds_tools.storage",
    "wds_tools.format",
    "wds_tools.dataset",
)
"""What the loader (training_adapter) may import of wds_tools: the bytes and what reads them, no converter or inspector."""


@pytest.mark.parametrize(
    "lower, upper",
    [
        ("wds_tools.errors", ("wds_tools.",)),
        ("wds_tools.cpus", ("wds_tools.storage", "wds_tools.format", *_ABOVE_FORMAT, "training_adapter")),
        ("wds_tools.ranks", ("wds_tools.storage", "wds_tools.format", *_ABOVE_FORMAT, "training_adapter")),
        ("wds_tools.storage", ("wds_tools.format", *_ABOVE_FORMAT, "training_adapter")),
        ("wds_tools.format", (*_ABOVE_FORMAT, "training_adapter")),
        (
            "wds_tools.dataset",
            ("wds_tools.similar", "wds_tools.convert", "wds_tools.inspect", "wds_tools.cli", "training_adapter"),
        ),
        ("wds_tools.similar", ("wds_tools.convert", "wds_tools.inspect", "wds_tools.cli", "training_adapter")),
        ("wds_tools.convert", ("wds_tools.inspect", "wds_tools.cli", "training_adapter")),
        ("wds_tools.inspect", ("wds_tools.cli", "training_adapter")),
    ],
)
def test_layers(lower, upper):
    """errors, then cpus, ranks and storage, then format (the bytes); dataset and similar above it; convert and
    inspect above those; the CLI on top; the loader beside convert."""
    wrong = sorted(
        f"{m} -> {t}"
        for m, ts in [*TOP.items(), *INNER.items()]
        if m == lower or m.startswith(lower + ".")
        for t in ts
        if t != lower and t.startswith(upper)
    )
    assert wrong == []


def test_training_adapter_imports_only_the_format_and_what_reads_it():
    """The loader depends on the format and the layers that read it (``LOADER_MAY_IMPORT``), not on the
    converter's, the inspectors' or the CLI's modules (source view)."""
    found = {
        t
        for m, ts in [*TOP.items(), *INNER.items()]
        if m.startswith("training_adapter")
        for t in ts
        if t.startswith("wds_tools")
    }
    assert any(t.startswith("wds_tools.format.") for t in found)  # the walk saw the imports
    assert {"wds_tools.dataset.resolve", "wds_tools.storage.transport", "wds_tools.cpus"} <= found
    assert {t for t in found if t != "wds_tools" and not t.startswith(LOADER_MAY_IMPORT)} == set()


def _loaded_after(statement: str) -> list[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_trainer_loads_no_converter_and_no_pillow():
    """At run time too: ``import training_adapter`` in a fresh interpreter loads neither Pillow nor the converter."""
    loaded = _loaded_after("import training_adapter; from training_adapter import make_loader")
    assert "training_adapter" in loaded and "wds_tools.format" in loaded
    unwanted = [
        m
        for m in loaded
        if m == "PIL" or m.startswith(("PIL.", "wds_tools.convert", "wds_tools.inspect", "wds_tools.cli", "click"))
    ]
    assert unwanted == []


def test_the_package_exports_lazily():
    """``import wds_tools`` is cheap; its exported names still resolve, each from its own module."""
    loaded = _loaded_after("import wds_tools; wds_tools.__version__")
    assert [m for m in loaded if m == "PIL" or m.startswith(("PIL.", "wds_tools.convert"))] == []
    import wds_tools

    for name in wds_tools.__all__:
        assert getattr(wds_tools, name) is not None, name
    with pytest.raises(AttributeError):
        wds_tools.no_such_name  # noqa: B018
