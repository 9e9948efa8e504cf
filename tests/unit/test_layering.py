"""The import graph between qcal's folders has no circle, the kernels import nothing of
qcal, and pyproject's package list names every package folder."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "qcal_kernels":
        return "qcal_kernels"
    if parts[0] == "qcal":
        return "qcal." + parts[1] if len(parts) > 1 else "qcal"
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "kernels":
        parts[0] = "qcal_kernels"
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Folder (or top-level module) -> the folders it imports, type-checking imports included."""
    graph: dict[str, set[str]] = {}
    for path in [*ROOT.glob("qcal/**/*.py"), *ROOT.glob("kernels/*.py")]:
        src = _unit(_module_name(path))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                target = _unit(name)
                if target and target != src:
                    graph.setdefault(src, set()).add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_folders() -> None:
    assert find_cycle(import_graph()) is None, find_cycle(import_graph())


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_layers_point_down() -> None:
    graph = import_graph()
    assert graph.get("qcal_kernels", set()) == set(), "the kernels must not import qcal"
    assert graph["qcal.quant"] <= {"qcal.config", "qcal.errors"}, "quant/ is pure tensor math"
    for low in ("qcal.quant", "qcal.packing", "qcal.model", "qcal.methods"):
        assert not graph.get(low, set()) & {"qcal.pipeline", "qcal.grid", "qcal.commands",
                                             "qcal.recipe"}, low


def test_pyproject_lists_every_package_folder() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {_module_name(p.parent / "__init__.py") for p in ROOT.glob("qcal/**/__init__.py")}
    assert listed == folders | {"qcal_kernels"}
