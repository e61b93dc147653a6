"""The tower, read from the source: ``finnlite.core`` < ``custom_ops`` < ``streamline`` < ``verify`` < the faces
(every other module of ``finnlite``). Every import between two floors points down, with no exception, and no two
files import each other, directly or around a cycle (function-local imports count; ``if TYPE_CHECKING:`` blocks,
which never run, do not)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("finnlite", "finnlite/core", "custom_ops", "streamline", "verify")
#: the floors, bottom first; the faces are the modules of ``finnlite`` outside ``finnlite.core``
FLOORS = ("core", "custom_ops", "streamline", "verify", "face")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> nx.DiGraph:
    """Files of the four packages and the imports between them (an edge from importer to imported)."""
    files = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).glob("*.py"))}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                assert node.level == 0, f"{path}: a relative import (the packages use absolute ones)"
                base = node.module or ""
                # ``from pkg import mod`` imports the module; ``from pkg import name`` the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for target in targets:
                while target and target not in files and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in files and target != name:
                    graph.add_edge(name, target)
    return graph


def _layer(module: str) -> str:
    if module == "finnlite.core" or module.startswith("finnlite.core."):
        return "core"
    return "face" if module.split(".")[0] == "finnlite" else module.split(".")[0]


def test_the_walker_sees_the_packages() -> None:
    graph = import_graph()
    assert {"finnlite.core.model", "custom_ops.executor", "streamline.pipeline", "verify.hook"} <= set(graph)
    assert graph.has_edge("verify.hook", "verify.verifier") and graph.has_edge("finnlite.cli", "finnlite.build")


def test_every_import_between_floors_points_down() -> None:
    graph = import_graph()
    rank = {floor: i for i, floor in enumerate(FLOORS)}
    up = [(a, b) for a, b in graph.edges if rank[_layer(a)] < rank[_layer(b)]]
    assert up == [], f"imports pointing up the tower {FLOORS}: {up}"


def test_the_faces_are_the_modules_outside_the_core() -> None:
    graph = import_graph()
    faces = {m for m in graph if _layer(m) == "face"}
    assert {"finnlite", "finnlite.cli", "finnlite.build", "finnlite.report"} <= faces
    assert not faces & {"finnlite.core.model", "finnlite.core.passes", "finnlite.core.registry"}


def test_no_import_cycle() -> None:
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], f"import cycles: {cycles[:5]}"
