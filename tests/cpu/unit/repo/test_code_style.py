# SPDX-License-Identifier: Apache-2.0
"""The sources follow the project's ruff settings (pyproject.toml: lint rules, line length 120) and carry the
SPDX licence identifier of pyproject.toml's licence; the plugin imports no NeMo Gym module, and no module of the
plugin imports itself through others (no import cycle, read from the sources with `ast`)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.helpers import REPO_ROOT as REPO


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_python_sources_are_ruff_clean(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_source_file_names_the_pyproject_licence_in_an_spdx_header():
    licence = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py", "*.sh", ".ci/run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    header = f"# SPDX-License-Identifier: {licence}"
    missing = [
        name for name in listed if (REPO / name).is_file() and header not in (REPO / name).read_text().splitlines()[:3]
    ]
    assert listed and not missing, f"files without {header!r} in their first lines: {missing}"


def test_the_plugin_imports_no_nemo_gym_module():
    # NeMo Gym runs in its own Python (3.13 for Gym 0.5+) as a process tree of its own; the plugin speaks HTTP to it.
    found = subprocess.run(
        ["grep", "-rnE", r"^\s*(import|from) nemo_gym", "recipe/nemo_gym"], cwd=REPO, capture_output=True, text=True
    )
    assert found.returncode == 1 and found.stdout == "", found.stdout


def test_nothing_under_recipe_imports_the_tests_support():
    # The plugin, its CPU backend and the demo are what users run; `tests/support/` is test support, never deployed.
    found = subprocess.run(
        ["grep", "-rnE", r"^\s*(import|from) tests(\.|\s)", "recipe"], cwd=REPO, capture_output=True, text=True
    )
    assert found.returncode == 1 and found.stdout == "", found.stdout


def module_imports(package: Path, name: str, *, in_functions: bool = False) -> dict[str, set[str]]:
    """The imports each module of `package` (dotted `name`) runs when it is imported: module-level statements only
    (an import inside a function runs later, and one under `if TYPE_CHECKING:` never), each resolved to the module
    files of `package` it loads, the packages above them included (but for its own). With `in_functions`, the
    imports inside its functions too (what it loads once called)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = (*name.split("."), *path.relative_to(package).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def loaded(target: str) -> set[str]:
        parts = target.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(modules)

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree) if in_functions else tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edges |= loaded(alias.name)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= loaded(node.module)
                edges |= {f"{node.module}.{a.name}" for a in node.names} & set(modules)
        # A module's own packages are imported before it is, whatever it names: never an edge that closes a cycle.
        graph[module] = {e for e in edges if not (module == e or module.startswith(f"{e}."))}
    assert name in graph, f"no package {name} at {package}"
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each sorted: a cycle runs through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return groups


def test_import_cycles_are_found_where_there_is_one():
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert import_cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert import_cycles({"p.a": {"p.b"}, "p.b": set()}) == []


def test_the_plugin_package_has_no_import_cycle_even_through_the_imports_inside_functions():
    assert import_cycles(module_imports(REPO / "recipe" / "nemo_gym", "recipe.nemo_gym", in_functions=True)) == []


def test_the_manager_reaches_nemo_gym_through_the_facade_only():
    graph = module_imports(REPO / "recipe" / "nemo_gym", "recipe.nemo_gym", in_functions=True)
    gym = {m for m in graph["recipe.nemo_gym.agent_loop"] if m.startswith("recipe.nemo_gym.gym")}
    assert gym == {"recipe.nemo_gym.gym", "recipe.nemo_gym.gym.connect", "recipe.nemo_gym.gym.types"}


def test_the_plugin_package_and_the_demo_have_no_import_cycle():
    graph = module_imports(REPO / "recipe" / "nemo_gym", "recipe.nemo_gym")
    assert len(graph) > 40 and "recipe.nemo_gym.gym.owned.launch" in graph["recipe.nemo_gym.gym.connect"]
    assert import_cycles(graph) == []
    demo = module_imports(REPO / "recipe" / "nemo_gym_demo", "recipe.nemo_gym_demo")
    assert "recipe.nemo_gym_demo.console" in demo["recipe.nemo_gym_demo.__main__"]
    assert import_cycles(demo) == []
