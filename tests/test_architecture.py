"""The layers docs/architecture.md describes: every toolkit module in one, and each importing only
from its own layer or those below it, so no import goes in a circle. Read from the source with
``ast``: imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

LAYERS = {  # bottom to top, as docs/architecture.md's table gives them (top first)
    "foundations": {
        "config", "catalog", "registry", "safe_yaml", "files", "noise_scale", "adaptive_batch",
        "system", "curves", "theme",
    },
    "run directory": {"rundir", "events", "processes", "checkpoints", "monitor", "hosts", "remote"},
    "arithmetic": {"optimizers", "schedules", "compression", "sync", "adascale"},
    "a worker": {"train", "callbacks", "experiment", "distributed", "elastic", "data", "models"},
    "runs": {
        "launch", "slots", "preflight", "sweep", "probe", "cluster", "tensorboard_export",
        "jupyter",
    },
    "doors": {"__main__", "__init__"},
}  # fmt: skip
LEVEL = {module: level for level, modules in enumerate(LAYERS.values()) for module in modules}
PARALLEL = {("run directory", "arithmetic")}  # neither imports the other


def toolkit_imports(path: Path) -> set[str]:
    """The top-level toolkit modules ``path`` imports (``toolkit.optimizers.lars`` counts as
    ``optimizers``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "toolkit"
        ):
            parts = node.module.split(".")
            found |= {parts[1]} if len(parts) > 1 else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("toolkit.")}
    return found


def module_of(path: Path) -> str:
    relative = path.relative_to(ROOT / "toolkit")
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


SOURCES = sorted((ROOT / "toolkit").rglob("*.py"))


def test_every_module_has_a_layer():
    assert {module_of(path) for path in SOURCES} == set(LEVEL)


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_each_module_imports_only_from_its_layer_or_below(path):
    own = module_of(path)
    names = list(LAYERS)
    for imported in toolkit_imports(path) - {own}:
        assert LEVEL[imported] <= LEVEL[own], (
            f"{own} ({names[LEVEL[own]]}) imports {imported} ({names[LEVEL[imported]]})"
        )
        assert (names[LEVEL[imported]], names[LEVEL[own]]) not in PARALLEL, (own, imported)


def test_no_import_goes_in_a_circle():
    graph = {}
    for path in SOURCES:
        graph.setdefault(module_of(path), set()).update(toolkit_imports(path) - {module_of(path)})

    def reaches_itself(start: str) -> bool:
        stack, seen = list(graph[start]), set()
        while stack:
            module = stack.pop()
            if module == start:
                return True
            if module not in seen:
                seen.add(module)
                stack.extend(graph.get(module, ()))
        return False

    assert [module for module in graph if reaches_itself(module)] == []
