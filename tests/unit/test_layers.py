"""The import rules of docs/architecture.md, "Layers": every module of the core has its layer
and imports only from its own layer or those below; no two modules import each other, however
indirectly; the core imports no broker library; adapters import the seam and the models, never
the container; the delivery path knows no database."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BROKER_LIBRARIES = {"stomp", "pyspark", "py4j"}

# Bottom up: a module may import its own layer and those below, never one above. A name is a
# module or a package (all of its modules).
LAYERS: list[tuple[str, set[str]]] = [
    ("models and the seam", {
        "mdb.adapters", "mdb.broker", "mdb.broker_settings", "mdb.clock", "mdb.codec",
        "mdb.context", "mdb.copies", "mdb.database_settings", "mdb.destinations", "mdb.errors",
        "mdb.events", "mdb.health", "mdb.identity", "mdb.jms_names", "mdb.listener", "mdb.logs",
        "mdb.message", "mdb.options", "mdb.redaction", "mdb.selector", "mdb.selector_check",
        "mdb.settings", "mdb.telemetry", "mdb.topology",
    }),
    ("one path to a broker, and the plan", {
        "mdb.brokers", "mdb.links", "mdb.producer", "mdb.planning", "mdb.failed",
    }),
    ("delivery", {"mdb.delivery"}),
    ("exactly-once", {"mdb.exactly_once"}),
    ("the container", {"mdb.container", "mdb.slots", "mdb.wiring", "mdb.report"}),
    ("serving it", {"mdb.http", "mdb.testing"}),
    ("processes and the command", {
        "mdb", "mdb.process", "mdb.cli", "mdb.failed_command", "mdb.asyncapi", "mdb.reference",
    }),
]
CONTAINER_AND_ABOVE = set().union(*(names for _, names in LAYERS[4:])) - {"mdb"}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT / "adapters" if "adapters" in path.parts else ROOT)
    name = ".".join(parts.with_suffix("").parts)
    return name.removesuffix(".__init__")


def _modules(folder: str) -> dict[str, Path]:
    return {_module(path): path for path in (ROOT / folder).rglob("*.py")}


CORE = _modules("mdb")


def _imports(path: Path, known: set[str]) -> set[str]:
    """The modules ``path`` imports: ``from mdb import codec`` is ``mdb.codec`` (a module of
    ``known``), ``from mdb import Context`` is ``mdb``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return found


def _under(name: str, packages: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _layer(module: str) -> int | None:
    """The layer of ``module``: that of the longest name of ``LAYERS`` it is under."""
    best: tuple[int, int] | None = None  # (length of the name, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if _under(module, {name}) and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def test_every_module_of_the_core_has_a_layer() -> None:
    unplaced = sorted(m for m in CORE if _layer(m) is None)
    assert not unplaced, f"add to LAYERS (and to docs/architecture.md): {unplaced}"


def test_imports_only_point_down() -> None:
    for module, path in CORE.items():
        layer = _layer(module)
        assert layer is not None
        above = {f"{name} ({LAYERS[found][0]})" for name in _imports(path, set(CORE))
                 if _under(name, {"mdb"}) and (found := _layer(name)) is not None
                 and found > layer}
        assert not above, f"{module} ({LAYERS[layer][0]}) imports {sorted(above)}"


def test_no_module_imports_itself_through_others() -> None:
    graph = {module: {name for name in _imports(path, set(CORE)) if name in CORE
                      and name != module and not module.startswith(name + ".")}
             for module, path in CORE.items()}
    # A package's own __init__ re-exports its modules: an edge from it to one of them is the
    # package's face, not a dependency of theirs.
    graph = {module: {n for n in names if not n.startswith(module + ".")}
             for module, names in graph.items()}
    cycle = next(_a_cycle(graph), None)
    assert cycle is None, " -> ".join(cycle or [])


def _a_cycle(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> Iterator[list[str]]:
        if node in visiting:
            yield [*visiting[visiting.index(node):], node]
            return
        if node in done:
            return
        visiting.append(node)
        for following in sorted(graph.get(node, ())):
            yield from visit(following)
        visiting.pop()
        done.add(node)

    for start in sorted(graph):
        yield from visit(start)


def test_the_core_imports_no_broker_library() -> None:
    for module, path in CORE.items():
        libraries = {name for name in _imports(path, set(CORE))
                     if _under(name, BROKER_LIBRARIES)}
        assert not libraries, f"{module} imports {sorted(libraries)}"


def test_adapters_never_import_the_container() -> None:
    adapters = _modules("adapters")
    assert adapters
    for module, path in adapters.items():
        above = {name for name in _imports(path, set(CORE))
                 if _under(name, CONTAINER_AND_ABOVE)}
        assert not above, f"{module} imports {sorted(above)}"


def test_the_delivery_path_knows_no_database() -> None:
    # Each guarantee is a run chosen when the slots are built (mdb.delivery.runs): the
    # exactly-once one is mdb.exactly_once's, above the delivery path.
    for module, path in CORE.items():
        if _under(module, {"mdb.delivery"}):
            found = {name for name in _imports(path, set(CORE))
                     if _under(name, {"sqlalchemy", "mdb.exactly_once", "mdb.database_settings"})}
            assert not found, f"{module} imports {sorted(found)}"


def test_the_architecture_page_names_every_module() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    unnamed = []
    for module, path in CORE.items():
        relative = path.relative_to(ROOT)
        package = f"`{relative.parent}/`"
        if f"`{relative}`" not in page and f"`{relative.stem}`" not in page \
                and not (relative.stem == "__init__" and package in page):
            unnamed.append(module)
    assert not unnamed, f"docs/architecture.md, \"Every module\", lacks {unnamed}"
