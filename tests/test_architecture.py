"""The packages and layers docs/notes/architecture.md describes: every toolkit module or package
in a layer, each importing only from its own layer or those below it, and no import, between modules
or between packages, going in a circle. Read from the source with ``ast``: imports inside
functions count too, and so do those under ``if TYPE_CHECKING:`` (a circle a type checker
follows is one a reader follows: the plan and the rules read :mod:`toolkit.experiment`'s
fields, not the config that calls them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

LAYERS = {  # bottom to top, as docs/notes/architecture.md's table gives them (top first)
    "foundations": {
        "backends",
        "config",
        "experiment",
        "plan",
        "communication",
        "errors",
        "catalog",
        "optimizer_rules",
        "codecs",
        "dgc",
        "sections",
        "config_rules",
        "host_list",
        "rates",
        "registry",
        "safe_yaml",
        "files",
        "cache",
        "advice",
        "words",
        "flags",
        "plugins",
    },
    "run directory": {"runs"},
    "arithmetic": {"optimizers", "scaling", "parallel"},
    "a worker": {"training", "train"},
    "launching": {"launching"},
    "doors": {"__main__", "__init__", "terminal"},
}
LEVEL = {module: level for level, modules in enumerate(LAYERS.values()) for module in modules}
PARALLEL = {("run directory", "arithmetic")}  # neither imports the other


SOURCES = sorted((ROOT / "toolkit").rglob("*.py"))
# Every package but two whose __init__ is their API: optimizers (optimizers.get, SGD, LARS;
# all of it needs Keras anyway) and backends (backends.current(), .of(name): the backends'
# classes, which import no Keras, so a launcher reads what each can do).
LAZY_PACKAGES = sorted(
    path.parent
    for path in (ROOT / "toolkit").glob("*/__init__.py")
    if path.parent.name not in ("optimizers", "backends")
)


def dotted(path: Path) -> str:
    """``toolkit/runs/events.py`` -> ``toolkit.runs.events``; a package's ``__init__.py`` is the
    package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {dotted(path) for path in SOURCES}


def imports(path: Path) -> set[str]:
    """The toolkit modules ``path`` imports, by dotted name: ``from toolkit.runs import events``
    is ``toolkit.runs.events``, ``from toolkit.runs.events import EventTail`` the same."""
    found, tree = set(), ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "toolkit":
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "toolkit"}
    return found - {dotted(path), "toolkit"}


GRAPH = {dotted(path): imports(path) for path in SOURCES}


def unit(module: str) -> str:
    """The layer's unit a module belongs to: its package, or itself at the top
    (``toolkit.runs.events`` -> ``runs``, ``toolkit.train`` -> ``train``)."""
    return module.split(".")[1] if "." in module else "__init__"


def test_every_module_has_a_layer():
    assert {unit(module) for module in MODULES} == set(LEVEL)


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_each_module_imports_only_from_its_layer_or_below(path):
    own, names = unit(dotted(path)), list(LAYERS)
    for imported in {unit(module) for module in GRAPH[dotted(path)]} - {own}:
        assert LEVEL[imported] <= LEVEL[own], (
            f"{own} ({names[LEVEL[own]]}) imports {imported} ({names[LEVEL[imported]]})"
        )
        assert (names[LEVEL[imported]], names[LEVEL[own]]) not in PARALLEL, (own, imported)


def circles(graph: dict[str, set[str]]) -> list[str]:
    """The nodes of ``graph`` that reach themselves."""

    def reaches_itself(start: str) -> bool:
        stack, seen = list(graph[start]), set()
        while stack:
            node = stack.pop()
            if node == start:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(graph.get(node, ()))
        return False

    return [node for node in graph if reaches_itself(node)]


def test_no_import_goes_in_a_circle_between_modules():
    assert circles(GRAPH) == []


def test_no_import_goes_in_a_circle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, found in GRAPH.items():
        own = unit(module)
        graph.setdefault(own, set()).update({unit(imported) for imported in found} - {own})
    assert circles(graph) == []


@pytest.mark.parametrize("package", LAZY_PACKAGES, ids=[p.name for p in LAZY_PACKAGES])
def test_importing_a_package_imports_none_of_its_modules(package):
    """``toolkit.runs.events`` costs what events.py imports, not what the rest of runs/ does
    (the app reads runs without TensorFlow)."""
    tree = ast.parse((package / "__init__.py").read_text())
    assert [type(node).__name__ for node in tree.body] == ["Expr"]  # its docstring only


@pytest.mark.parametrize("kind", ["DATASETS", "MODELS", "OPTIMIZERS", "SCHEDULES"])
def test_every_name_a_config_can_say_reaches_its_constructor(kind):
    """The catalog names its constructors as ``"module:attribute"`` strings (so a config is
    checked without TensorFlow), which no import above sees: each must still land after a move."""
    from toolkit import catalog

    registry = getattr(catalog, kind)
    for name in registry.names():
        assert callable(registry.constructor(name)), f"{kind}: {name}"
