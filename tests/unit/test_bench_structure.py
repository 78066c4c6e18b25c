"""bench/ holds together without an import loop, and no module of it imports another's private (``_name``) names:
what scenarios share lives in a module of its own (bench/job_load.py). Read from the source, imports inside
functions included (a loop broken by a late import is still a loop)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Each bench module's imports of bench modules: (module, names imported from it)."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(BENCH.glob("*.py")):
        imports = found.setdefault(path.stem, [])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 1 and module:
                    imports.append((module.split(".")[0], [alias.name for alias in node.names]))
                elif node.level == 1:  # from . import soak
                    imports += [(alias.name, []) for alias in node.names]
                elif module.startswith("bench."):
                    imports.append((module.split(".")[1], [alias.name for alias in node.names]))
                elif module == "bench":
                    imports += [(alias.name, []) for alias in node.names]
            elif isinstance(node, ast.Import):
                imports += [(a.name.split(".")[1], []) for a in node.names if a.name.startswith("bench.")]
    return found


def test_no_bench_module_imports_another_ones_private_names():
    private = [
        (module, source, name)
        for module, imports in bench_imports().items()
        for source, names in imports
        for name in names
        if name.startswith("_")
    ]
    assert private == []


def test_bench_has_no_import_loop():
    graph = {module: {source for source, _ in imports} for module, imports in bench_imports().items()}
    assert {"scenarios", "mixed", "soak", "job_load"} <= set(graph)

    def loop_from(module: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        if module in path:
            return (*path[path.index(module) :], module)
        for imported in sorted(graph.get(module, ())):
            loop = loop_from(imported, (*path, module))
            if loop:
                return loop
        return None

    loops = [loop for module in sorted(graph) if (loop := loop_from(module, ()))]
    assert loops == []
