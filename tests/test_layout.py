"""The package's layout promise (issue 10): no import circles — counting the imports
inside functions, which hide a circle at import time without removing it (names imported
under ``TYPE_CHECKING`` are for the type checker only and left out). Modules are sized by
concept, not by a line count (issue 38: the 600-line cap made files split to meet it)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "ctxwarden"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every ctxwarden module ``path`` imports, anywhere in the file; ``from a import b``
    names module ``a.b`` when that is a module, else ``a``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue  # names for the type checker only: never imported at run time
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    found.add(sub)
                elif base in modules:
                    found.add(base)
    return found - {name}


def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports. The package's own ``__init__`` gathers the public
    API: what a module takes from it (``from ctxwarden import Usage``) is left out here,
    as the modules it re-exports are counted where they are defined."""
    modules = _modules()
    return {name: _imports(path, modules) - {"ctxwarden"} for name, path in modules.items()}


def test_the_import_graph_is_read() -> None:
    graph = _graph()
    assert len(graph) > 100
    assert "ctxwarden.steps.ledger" in graph["ctxwarden.pipeline.cascade"]  # a plain import
    # the fit knows the ledger only as the typed LedgerBlocks of steps.base (issue 38)
    assert "ctxwarden.steps.ledger" not in graph["ctxwarden.steps.fit"]
    assert "ctxwarden.pipeline.engine" in graph["ctxwarden.session.session"]  # in a function
    assert "ctxwarden.pipeline.policy" in graph["ctxwarden.session.session"]  # TYPE_CHECKING


def test_no_import_circles() -> None:
    try:
        TopologicalSorter(_graph()).prepare()
    except CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def _package(module: str) -> str:
    """The package a module belongs to: ``ctxwarden.core.tokens.counter`` -> ``core``;
    a top-level module (``ctxwarden._version``) is its own."""
    return module.split(".")[1] if "." in module else module


def test_no_package_circles() -> None:
    """Issue 38: the packages form layers (the contracts in pyproject.toml, checked by
    ``lint-imports`` in CI); here, at least, no two packages reach each other."""
    packages: dict[str, set[str]] = {}
    for module, imported in _graph().items():
        here = _package(module)
        packages.setdefault(here, set()).update(
            _package(m) for m in imported if _package(m) != here
        )
    try:
        TopologicalSorter(packages).prepare()
    except CycleError as exc:
        pytest.fail(f"package circle: {' -> '.join(exc.args[1])}")
    assert packages["core"] <= {"ctxwarden"}, packages["core"]  # core imports no package
