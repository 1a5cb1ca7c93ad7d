"""The tree keeps the architecture: who may import whom, checked on the source (ast)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "pipeline"

ACTORS = [*(f"engine.actors.{name}" for name in ("bus", "enqueuer", "poller", "pools", "leases")), "backends.sqlite.ledger"]
SQLITE_INTERNALS = {f"pipeline.backends.sqlite.{name}" for name in ("store", "queries", "db", "ledger", "migrations", "bulk")}
# where the application (the bundled site) is chosen; pipeline.cli is a package: its modules too
ENTRY_POINTS = {"pipeline.cli", "pipeline.service", "pipeline.supervisor"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, TYPE_CHECKING and function-level imports included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import store`
    return found


MODULES = {module_name(path): imports_of(path) for path in ROOT.rglob("*.py")}


def test_the_scan_sees_the_tree() -> None:
    assert "pipeline.engine.actors.poller" in MODULES and "pipeline.backends.sqlite.store" in MODULES["pipeline.backends.sqlite.ledger"]


@pytest.mark.parametrize("actor", ACTORS)
def test_no_actor_imports_the_wiring(actor: str) -> None:
    imported = MODULES[f"pipeline.{actor}"]
    assert "pipeline.engine.wiring" not in imported, f"pipeline.{actor} imports the wiring module"


def test_nothing_outside_the_sqlite_backend_imports_its_store_or_database() -> None:
    offenders = {
        name: sorted(imported & SQLITE_INTERNALS)
        for name, imported in MODULES.items()
        if not name.startswith("pipeline.backends.sqlite") and imported & SQLITE_INTERNALS
    }
    assert offenders == {}


def test_the_engine_does_not_depend_on_the_bundled_site() -> None:
    offenders = {
        name: sorted(m for m in imported if m.startswith("pipeline.site"))
        for name, imported in MODULES.items()
        if not name.startswith("pipeline.site") and not any(name == e or name.startswith(e + ".") for e in ENTRY_POINTS)
        and any(m.startswith("pipeline.site") for m in imported)
    }
    # the outbox's default registry is the site's types, imported only when no registry is given
    assert offenders == {"pipeline.backends.sqlite.outbox": ["pipeline.site", "pipeline.site.types_registry"]}


def test_the_site_reaches_jobs_only_through_the_engines_public_names() -> None:
    offenders = {
        name: sorted(m for m in imported if m.startswith("pipeline.backends"))
        for name, imported in MODULES.items()
        if name.startswith("pipeline.site") and any(m.startswith("pipeline.backends") for m in imported)
    }
    assert offenders == {}


def test_the_stores_import_nothing_from_the_engine() -> None:
    """Issue 22, item 9: what the engine and the stores share (the one-shot Reply) lives beneath
    both (pipeline.replies); what a store asks of the engine is a Protocol of backends.base
    (HealthReport, Topology). TYPE_CHECKING imports count too."""
    offenders = {
        name: sorted(m for m in imported if m.startswith("pipeline.engine"))
        for name, imported in MODULES.items()
        if name.startswith("pipeline.backends") and any(m.startswith("pipeline.engine") for m in imported)
    }
    assert offenders == {}


def test_no_module_imports_one_that_imports_it_back() -> None:
    """Issue 22, item 9: no circle in the tree (the package's own __init__, which re-exports the
    public names, aside; TYPE_CHECKING imports count). JobContext has a module of its own
    (pipeline.context), beneath the registry and the handler pools."""
    modules = set(MODULES)

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {name: {owner(m) for m in imported} - {"", "pipeline", name} for name, imported in MODULES.items()}
    graph = {name: {m for m in found if m.startswith("pipeline.") and not name.startswith(m + ".")}
             for name, found in graph.items()}
    circles = []
    for start in sorted(graph):  # a depth-first walk from each module, back to itself
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert circles == []
