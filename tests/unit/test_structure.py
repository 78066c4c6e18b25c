"""The code's structure, read from its imports: no import loops among the modules of src/ and bench/, no module that
imports another module's private names, nothing Spark in the engine's rules, and no source file grown past what one
reader takes in."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "kafka_scheduler"
LARGEST_SOURCE_LINES = 700


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT / "src" if path.is_relative_to(ROOT / "src") else ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(*folders: Path) -> dict[str, Path]:
    return {module_name(p): p for folder in folders for p in sorted(folder.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str], bool]]:
    """(module imported, names taken from it, at module level) for each import of a module in ``known``. A name
    taken from a package that is itself a module of ``known`` counts as that module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.col_offset == 0) for alias in node.names if alias.name in known]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            top = node.col_offset == 0
            names = [alias.name for alias in node.names]
            submodules = [n for n in names if f"{target}.{n}" in known]
            if submodules:
                found += [(f"{target}.{n}", [], top) for n in submodules]
                names = [n for n in names if n not in submodules]
            if target in known and names:
                found.append((target, names, top))
    return found


def graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports, at its top or inside a function: an import put off into a function to
    dodge a loop at import time is still two modules that need each other."""
    known = set(modules)
    return {
        name: {target for target, _, _ in imports_of(name, path, known) if target != name}
        for name, path in modules.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def without_packages(edges: dict[str, set[str]], modules: dict[str, Path]) -> dict[str, set[str]]:
    """A package's __init__ importing its own modules is how a package is read, not a loop between them."""
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    return {
        name: {t for t in targets if not (name in packages and t.startswith(name + "."))}
        for name, targets in edges.items()
    }


def test_the_cycle_finder_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("folder", ["src", "bench"])
def test_no_import_loops(folder):
    modules = sources(PACKAGE) if folder == "src" else sources(ROOT / "bench")
    loops = cycles(without_packages(graph(modules), modules))
    assert loops == [], f"modules that import each other: {loops}"


def test_no_module_imports_another_modules_private_names():
    modules = {**sources(PACKAGE), **sources(ROOT / "bench"), **sources(ROOT / "chaos")}
    known = set(modules)
    reaches = [
        f"{name} imports {target}.{taken}"
        for name, path in modules.items()
        for target, names, _ in imports_of(name, path, known)
        for taken in names
        if taken.startswith("_") and not taken.startswith("__") and target != name
    ]
    assert reaches == []


def test_the_rules_import_no_spark():
    """The rules are tested without Spark and imported by tools that have none: importing every one of them in a
    fresh interpreter loads no pyspark."""
    rules = sorted(name for name in sources(PACKAGE / "engine" / "rules"))
    code = "import sys\n" + "".join(f"import {name}\n" for name in rules) + "print('pyspark' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"importing {rules} loads pyspark"


def test_no_source_file_is_too_long_to_read():
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {path: n for path, n in lengths.items() if n > LARGEST_SOURCE_LINES} == {}
