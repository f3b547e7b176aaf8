"""The layers' import rules (docs/architecture.md, "Import rules"), checked on the source:
the API (and explain, which it serves) never imports the conductor or the agent, the agent
never imports the conductor, and drivers import neither, directly or through any module
they import (every ``import`` statement counts, those inside functions included).

Inside the conductor the packages keep the layout's direction (docs/architecture.md, "The
conductor's layout"): the fleet knows nothing of binding, placement or programming; the
Placement mirror (sync, audit) and binding know nothing of each other, and the rest of
placement only the bind target its checks judge (binding.target); programming, fencing,
reconcile and health nothing of binding or placement; service.py no component (COMPONENTS
names them as strings).

The agent and drivers also never load the database layer: importing every module of
``acceld.agent`` and ``acceld.drivers`` (in a fresh interpreter) loads no ``acceld.db``,
``acceld.conductor``, ``acceld.api`` nor SQLAlchemy. That one is checked by loading, not on
the source: shared modules (the health check, metrics, the conductor's keyring in
acceld.runtime.secrets) import the database inside functions only the API and the
conductor call.

No module imports itself back: acceld/ and bench/ hold no import circle, whether its
imports are at module level or inside functions (a function's import runs whenever
the function does, so a circle through one is as real; only ``if TYPE_CHECKING:``
imports never run, and they count too: a type a module names is still a module it
knows). An import of ``pkg.mod`` counts as an import of that module, not of ``pkg``'s
``__init__`` (which Python runs first, but which a package's own modules rely on
without it being a circle). The options (acceld/conf/) import nothing of acceld outside
that package: the modules that use options import it, never the reverse."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "acceld"
TREES = ("acceld", "bench")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for tree in TREES for p in (ROOT / tree).rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module of ours ``name`` is, or the nearest package of ours holding it."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path, name: str) -> set[str]:
    """The acceld and bench modules (and packages) ``path`` imports, anywhere in it: ``from
    pkg import mod`` is an import of pkg.mod, ``from pkg import name`` one of pkg."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(_resolve(f"{base}.{alias.name}"))
    found.discard(name)
    return {n for n in found if n is not None}


GRAPH: dict[str, set[str]] = {name: _imports(path, name) for name, path in MODULES.items()}


def _reachable(start: str) -> dict[str, str]:
    """Every module ``start`` imports, directly or not, with the module that imports it."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        current = todo.pop()
        for target in GRAPH.get(current, ()):
            # ``from acceld.x import y``: y may be a module of package x, or a name in it.
            if target not in GRAPH or target in seen:
                continue
            seen[target] = current
            todo.append(target)
    return seen


def _violations(layer: str, forbidden: tuple[str, ...],
                allowed: frozenset[str] = frozenset()) -> list[str]:
    """Each module of ``layer`` that reaches a module under ``forbidden`` (one named in
    ``allowed`` excepted), with the chain's last link."""
    out = []
    for module in sorted(m for m in GRAPH if m == layer or m.startswith(layer + ".")):
        for target, via in _reachable(module).items():
            if target.startswith(forbidden) and target not in allowed:
                out.append(f"{module} reaches {target} (imported by {via})")
    return out


@pytest.mark.parametrize("layer, forbidden", [
    ("acceld.api", ("acceld.conductor", "acceld.agent")),
    ("acceld.explain", ("acceld.conductor", "acceld.agent")),
    ("acceld.agent", ("acceld.conductor",)),
    ("acceld.drivers", ("acceld.conductor", "acceld.agent")),
])
def test_layers_keep_their_import_rules(layer: str, forbidden: tuple[str, ...]) -> None:
    assert _violations(layer, forbidden) == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle of ``graph``: its strongly connected components of more than one
    module (Tarjan's), each as the modules on it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def _describe(graph: dict[str, set[str]], circle: list[str]) -> str:
    """One loop around ``circle``: each module with the one of the circle it imports."""
    members = set(circle)
    path, current = [circle[0]], circle[0]
    while True:
        current = min(graph[current] & members, key=lambda m: (m in path, m))
        path.append(current)
        if current in path[:-1]:
            return " -> ".join(path[path.index(current):])


def test_no_import_circle() -> None:
    assert [_describe(GRAPH, c) for c in _circles(GRAPH)] == []


def test_a_circle_is_found() -> None:
    """The check above finds a circle where one exists, through a function's import too:
    acceld.config imports acceld.conf; make a group module import it back."""
    assert "acceld.conf" in GRAPH["acceld.config"]
    looped = {**GRAPH, "acceld.conf.api": GRAPH["acceld.conf.api"] | {"acceld.config"}}
    circles = _circles(looped)
    assert any({"acceld.config", "acceld.conf", "acceld.conf.api"} <= set(c) for c in circles)
    assert "acceld.config -> " in " ".join(_describe(looped, c) for c in circles)


def test_the_options_import_nothing_of_acceld_outside_them() -> None:
    conf = [m for m in GRAPH if m == "acceld.conf" or m.startswith("acceld.conf.")]
    assert len(conf) > 10
    assert {m: sorted(t for t in GRAPH[m] if t.startswith("acceld.")
                      and t != "acceld.conf" and not t.startswith("acceld.conf."))
            for m in conf} == {m: [] for m in conf}


C = "acceld.conductor."


@pytest.mark.parametrize("layer, forbidden, allowed", [
    # Who is alive, where, and what it holds: nothing of what is done with the hosts.
    (C + "fleet", (C + "binding", C + "placement", C + "programming", C + "fencing",
                   C + "health"), ()),
    # The inventory mirror never binds; a bind never writes the mirror.
    (C + "placement.sync", (C + "binding",), ()),
    (C + "placement.audit", (C + "binding",), ()),
    (C + "binding", (C + "placement.sync", C + "placement.audit"), ()),
    # A bind's Placement checks and claim allocations refuse the bind target they judge.
    (C + "placement", (C + "binding",), (C + "binding", C + "binding.target")),
    # Binding uses programming, never the reverse; fencing serves both and needs neither.
    (C + "programming", (C + "binding", C + "placement", C + "health", C + "reconcile"), ()),
    (C + "fencing", ("acceld.conductor",), ()),
    # A report's diff is the database's business only.
    (C + "reconcile", ("acceld.conductor",), ()),
    (C + "health", (C + "binding", C + "placement", C + "programming", C + "reconcile",
                    C + "fencing"), ()),
    # Components import service.py; it builds them from COMPONENTS' strings, and holds
    # only the ring it gives them.
    (C + "service", ("acceld.conductor",), (C + "fleet.membership", C + "fleet.hashring")),
])
def test_the_conductors_packages_keep_their_direction(layer: str, forbidden: tuple[str, ...],
                                                       allowed: tuple[str, ...]) -> None:
    assert any(m == layer or m.startswith(layer + ".") for m in GRAPH), layer  # it exists
    assert _violations(layer, forbidden, frozenset(allowed)) == []


def test_the_graph_is_read() -> None:
    """The rules above would pass on an empty graph: it holds known edges, and a
    violation is found where one exists."""
    assert "acceld.quarantine" in GRAPH["acceld.api.handlers.devices"]
    assert "acceld.db.models" in _reachable("acceld.quarantine")
    assert _violations("acceld.conductor", ("acceld.db",))
    assert _violations(C + "placement", (C + "binding",))  # without its allowance


_LOAD = """
import importlib, json, pkgutil, sys
import acceld.agent, acceld.drivers
names = [f"{package.__name__}.{m.name}" for package in (acceld.agent, acceld.drivers)
         for m in pkgutil.iter_modules(package.__path__)]
for name in names:
    importlib.import_module(name)
print(json.dumps([len(names), sorted(m for m in sys.modules if m.split(".")[0] == "sqlalchemy"
                  or m.startswith(("acceld.db", "acceld.conductor", "acceld.api")))]))
"""


def test_loading_the_agent_and_every_driver_loads_no_database_code() -> None:
    done = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=60, check=True)
    count, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert count > 20  # every agent module and driver was imported
    assert loaded == []
