"""The import graph between qcal's folders has no circle, nor has the graph between its
files, the kernels import nothing of qcal, and pyproject's package list names every package
folder."""

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


def _imported_names(tree: ast.AST, package: str) -> list[str]:
    """Every module name an import in `tree` may load (function-level and type-checking
    imports included): for `from a.b import c`, both `a.b` and `a.b.c`."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names += [base, *(f"{base}.{a.name}" for a in node.names)]
    return names


def module_graph() -> dict[str, set[str]]:
    """qcal module (file) -> the qcal modules it imports; a name resolves to the longest
    module it starts with (`qcal.calib.io.CalibSet` -> qcal.calib.io)."""
    paths = {_module_name(p): p for p in ROOT.glob("qcal/**/*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = {resolve(n) for n in _imported_names(ast.parse(path.read_text()), package)}
        graph[module] = {t for t in targets if t and t != module}
    return graph


def test_no_import_cycle_between_files() -> None:
    cycle = find_cycle(module_graph())
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle or [])


def test_module_graph_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    tree = ast.parse("def f():\n    from qcal.calib.io import CalibSet\nfrom . import windows\n")
    names = _imported_names(tree, "qcal.calib")
    assert {"qcal.calib.io", "qcal.calib.io.CalibSet", "qcal.calib.windows"} <= set(names)
    graph = module_graph()
    assert "qcal.calib.io" in graph["qcal.calib.base"]  # a real edge is found


OUTSIDE_CORE = ("qcal.studies", "qcal.provision")
# The one door to each: a command that imports it inside its function (lazily).
GATEWAYS = {"qcal.commands.provision": "qcal.provision", "qcal.commands.compare": "qcal.studies"}


def _outside_core(module: str) -> bool:
    return any(module == top or module.startswith(top + ".") for top in OUTSIDE_CORE)


def test_core_imports_no_study_and_no_provisioning() -> None:
    """The library knows no paper and no particular data source: only `qcal provision`
    reaches the provisioning code and only `qcal report --study` the studies, each inside
    its function (lazily)."""
    offenders = {}
    for module, targets in module_graph().items():
        if _outside_core(module):
            continue
        bad = {t for t in targets if _outside_core(t)}
        if module in GATEWAYS:
            bad = {t for t in bad if not t.startswith(GATEWAYS[module])}
        if bad:
            offenders[module] = sorted(bad)
    assert offenders == {}, f"core modules import studies or provisioning: {offenders}"
    for module in GATEWAYS:
        path = ROOT / (module.replace(".", "/") + ".py")
        top_level = ast.Module(body=[n for n in ast.parse(path.read_text()).body
                                     if isinstance(n, (ast.Import, ast.ImportFrom))],
                               type_ignores=[])
        eager = [n for n in _imported_names(top_level, "qcal.commands") if _outside_core(n)]
        assert eager == [], f"{module} imports {eager} at module level; import it lazily"


def test_no_import_cycle_between_folders() -> None:
    assert find_cycle(import_graph()) is None, find_cycle(import_graph())


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_layers_point_down() -> None:
    graph = import_graph()
    assert graph.get("qcal_kernels", set()) == set(), "the kernels must not import qcal"
    assert graph["qcal.quant"] <= {"qcal.config", "qcal.errors"}, "quant/ is pure tensor math"
    for low in ("qcal.quant", "qcal.packing", "qcal.model", "qcal.methods"):
        assert not graph.get(low, set()) & {"qcal.run", "qcal.output", "qcal.export", "qcal.grid",
                                             "qcal.commands", "qcal.recipe"}, low


def test_pyproject_lists_every_package_folder() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {_module_name(p.parent / "__init__.py") for p in ROOT.glob("qcal/**/__init__.py")}
    assert listed == folders | {"qcal_kernels"}
