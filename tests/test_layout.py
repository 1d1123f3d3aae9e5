"""The repository's three layers depend one way: ``coursetools`` -> ``grader`` -> ``llmcourse``.

- ``llmcourse/`` (the student library) imports neither ``grader`` nor ``coursetools``;
- ``grader/`` (checks, bug catalogs, isolated runner) never imports ``coursetools``;
- no import circles between modules of the three packages.

Every ``import`` and ``from ... import`` statement counts, at module level or inside a function (a lazy
import is still a dependency), and so does ``importlib.import_module("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llmcourse", "grader", "coursetools")
FORBIDDEN = {"llmcourse": ("grader", "coursetools"), "grader": ("coursetools",), "coursetools": ()}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
            if "__pycache__" not in p.parts}


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module name) for every import in the file, relative imports resolved."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for _, target in _imports(name, path):
            # the longest known module the name refers to (``from a.b import c``: module a.b.c, or a.b)
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


@pytest.mark.parametrize("package", PACKAGES)
def test_layers_depend_one_way(package):
    bad = []
    for name, path in _modules().items():
        if name.split(".")[0] != package:
            continue
        for line, target in _imports(name, path):
            if target.split(".")[0] in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, f"{package}/ must not import {' or '.join(FORBIDDEN[package])}:\n" + "\n".join(sorted(set(bad)))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    cycles = _cycles(_graph())
    assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_check_detects_a_layer_violation_and_a_circle(tmp_path):
    """The two checks above can fail: a forbidden import and a two-module circle are reported."""
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(graph) == [["a", "b"]]
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from grader.core import Verdict\n")
    assert (2, "grader.core") in _imports("llmcourse.m", f)
