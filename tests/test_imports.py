"""The package's import graph: no module imports itself through others."""

from __future__ import annotations

import ast
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def package_modules() -> dict[str, Path]:
    """Every module of the package by its installed name, found through pyproject's package-dir
    (the `games/` folder installs as `selfplay.games`, and so on)."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    modules = {}
    for package, folder in package_dir.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def imported_names(path: Path, module: str) -> set[str]:
    """What `module` imports, anywhere in it (inside functions too): each `import X` and
    `from X import Y` gives X and X.Y, relative imports resolved."""
    is_package = path.name == "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            else:
                base = node.module
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports."""
    modules = package_modules()
    return {
        module: {name for name in imported_names(path, module) if name in modules and name != module}
        for module, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop of `graph` (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            cycle = visit(imported)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return None


def test_the_graph_covers_every_folder_of_the_package():
    graph = import_graph()
    assert {"selfplay.league.store", "selfplay.games.base", "selfplay.roles.base", "selfplay.configs"} <= set(graph)
    assert "selfplay.games" in graph["selfplay.evaluation.evaluate"]
    assert "selfplay.train" in graph["selfplay.cli"]  # imported inside a function


def test_imports_inside_functions_and_relative_imports_count(tmp_path):
    path = tmp_path / "module.py"
    path.write_text("from . import sibling\n\n\ndef f():\n    from ..other import thing\n    import selfplay.x\n")
    names = imported_names(path, "selfplay.package.module")
    assert {"selfplay.package.sibling", "selfplay.other.thing", "selfplay.x"} <= names


def test_a_loop_is_found_and_only_a_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_loops():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import loop: " + " -> ".join(cycle)


def test_evaluation_never_imports_the_league():
    """The league is built on evaluation's measures (exploitability, Elo, meta-solvers), never the
    other way round."""
    graph = import_graph()
    in_league = [name for name in graph if name == "selfplay.league" or name.startswith("selfplay.league.")]
    evaluation = {module: imported for module, imported in graph.items() if module.startswith("selfplay.evaluation")}
    assert {module: sorted(imported & set(in_league)) for module, imported in evaluation.items()} == {
        module: [] for module in evaluation
    }
    assert "selfplay.evaluation.meta_solvers" in graph["selfplay.league.meta_game"]
