"""Every public name of ``wds_tools`` and ``training_adapter`` has a docstring (the API reference renders them).

Public: every module whose name does not start with ``_``; every name in a module's ``__all__`` (without one,
every module-level function and class defined there whose name does not start with ``_``); and every method,
property, classmethod and staticmethod of those classes whose name does not start with ``_``. A constant in
``__all__`` is documented by a string literal right after its assignment, the attribute docstring
mkdocstrings renders.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

PACKAGES = ("wds_tools", "training_adapter")


def _public_modules() -> list[ModuleType]:
    mods = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        mods.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            if any(part.startswith("_") for part in info.name.split(".")):
                continue
            mods.append(importlib.import_module(info.name))  # every module imports in the test venv
    return mods


def _auto_class_doc(cls: type, doc: str) -> bool:
    """True where ``doc`` is the signature dataclasses and NamedTuple write for a class without a docstring."""
    return doc.startswith(f"{cls.__name__}(") and doc.rstrip().endswith(")") and "\n" not in doc.strip()


def _has_doc(obj: object) -> bool:
    if _is_click_command(obj):  # its help text, the command function's docstring
        return bool((getattr(obj, "help", None) or "").strip())
    doc = obj.__doc__ if not isinstance(obj, type) else obj.__dict__.get("__doc__")
    if not isinstance(doc, str) or not doc.strip():
        return False
    return not (isinstance(obj, type) and _auto_class_doc(obj, doc))


def _is_click_command(obj: object) -> bool:
    return any(c.__module__ == "click.core" and c.__name__ == "Command" for c in type(obj).__mro__)


def _ours(obj: object) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] in PACKAGES


def _methods(cls: type) -> list[tuple[str, object]]:
    """(name, function) for each public method and property defined in the class body."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, staticmethod | classmethod):
            out.append((name, member.__func__))
        elif isinstance(member, property):
            out.append((name, member.fget))
        elif inspect.isfunction(member):
            out.append((name, member))
        elif type(member).__name__ == "cached_property":
            out.append((name, member.func))
    return out


def _attribute_documented(module: ModuleType, name: str, seen: set[str] | None = None) -> bool:
    """Whether ``name``'s module-level assignment (or the one it is imported from) is followed by a string."""
    seen = seen or set()
    if module.__name__ in seen:
        return False
    seen.add(module.__name__)
    tree = ast.parse(Path(module.__file__ or "").read_text())
    body = tree.body
    for i, node in enumerate(body):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            nxt = body[i + 1] if i + 1 < len(body) else None
            return (
                isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)
            )
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            base = module.__name__ if module.__file__ and module.__file__.endswith("__init__.py") else None
            package = base or module.__name__.rpartition(".")[0]
            home = importlib.import_module("." * node.level + (node.module or ""), package if node.level else None)
            return _attribute_documented(home, name, seen)
    return False


def missing_docstrings() -> list[str]:
    """The dotted names of public modules, names and methods without a docstring."""
    missing: list[str] = []
    checked_classes: set[type] = set()
    for module in _public_modules():
        mod = module.__name__
        if not _has_doc(module):
            missing.append(f"{mod} (module)")
        exported = getattr(module, "__all__", None)
        if exported is None:
            names = [
                n
                for n, v in vars(module).items()
                if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == mod
            ]
        else:
            names = [n for n in exported if not (n.startswith("__") and n.endswith("__"))]
        for name in names:
            obj = getattr(module, name)
            if _is_click_command(obj):
                if not _has_doc(obj):
                    missing.append(f"{mod}.{name} (a click command without help)")
            elif inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isroutine(obj):
                if _ours(obj) and not _has_doc(obj):
                    missing.append(f"{mod}.{name}")
                if inspect.isclass(obj) and _ours(obj) and obj not in checked_classes:
                    checked_classes.add(obj)
                    for meth_name, fn in _methods(obj):
                        if not _has_doc(fn):
                            missing.append(f"{obj.__module__}.{obj.__qualname__}.{meth_name}")
            elif isinstance(obj, ModuleType):
                continue  # checked as a module
            elif not _attribute_documented(module, name):
                missing.append(f"{mod}.{name} (constant: a string literal after its assignment)")
    return sorted(set(missing))


FRONT_DOORS = (  # the API reference's entry points: Google-style Args/Returns/Raises, every parameter named
    "wds_tools.convert:convert",
    "wds_tools.format.index:load_index",
    "wds_tools.inspect.stats:compute_stats",
    "wds_tools.inspect.verify:verify",
    "training_adapter.loader:make_loader",
    "training_adapter.loader:to_device",
    "training_adapter.mapstyle:ShardIndexDataset",
    "training_adapter.config:load_config",
    "training_adapter.augment:augment_batch",
)


def _args_section(doc: str) -> list[str]:
    """The parameter names an ``Args:`` section documents (Google style: ``name: text`` one level in)."""
    lines = inspect.cleandoc(doc).splitlines()
    start = lines.index("Args:") + 1
    names = []
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break  # the next section
        if line.startswith("    ") and not line.startswith("     ") and ":" in line:
            names.append(line.strip().split(":", 1)[0])
    return names


@pytest.mark.parametrize("target", FRONT_DOORS)
def test_front_doors_document_every_parameter(target):
    module, name = target.split(":")
    obj = getattr(importlib.import_module(module), name)
    params = [p for p in inspect.signature(obj).parameters if p != "self"]
    doc = inspect.getdoc(obj) or ""
    assert "Args:" in doc.splitlines(), f"{target}: no Args: section"
    assert _args_section(doc) == params, f"{target}: Args: does not name the parameters in order"
    if not inspect.isclass(obj):
        assert "Returns:" in doc.splitlines(), f"{target}: no Returns: section"


def test_every_public_name_has_a_docstring():
    missing = missing_docstrings()
    assert not missing, f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_docstring(tmp_path, monkeypatch):
    """The walker flags an undocumented function, method, dataclass and constant and passes documented ones."""
    pkg = tmp_path / "wds_tools_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""Probe."""\n')
    (pkg / "mod.py").write_text(
        "from dataclasses import dataclass\n"
        "__all__ = ['f', 'g', 'C', 'D', 'K', 'L']\n"
        "def f(): pass\n"
        "def g():\n    'Documented.'\n"
        "class C:\n    'Documented.'\n    def m(self): pass\n    @property\n    def p(self):\n        'Doc.'\n"
        "@dataclass\nclass D:\n    x: int\n"
        "K = 1\n"
        "L = 2\n'The L constant.'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("wds_tools_probe",))
    try:
        assert missing_docstrings() == [
            "wds_tools_probe.mod (module)",
            "wds_tools_probe.mod.C.m",
            "wds_tools_probe.mod.D",
            "wds_tools_probe.mod.K (constant: a string literal after its assignment)",
            "wds_tools_probe.mod.f",
        ]
    finally:
        for name in [n for n in sys.modules if n.startswith("wds_tools_probe")]:
            del sys.modules[name]


if __name__ == "__main__":  # pragma: no cover - a listing for whoever adds docstrings
    print("\n".join(missing_docstrings()))
