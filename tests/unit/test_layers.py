"""The import rules of docs/architecture.md, "Layers": the folders of ``mdb/`` are its layers,
and a module's layer is its folder's; every module imports only from its own layer or those
below; no two modules import each other, however indirectly; the core imports no broker
library; adapters import the seam and the models, never the container; the delivery path knows
no database; no module is longer than 400 lines. The architecture page names every module, and
every path it names exists. No two classes of the core and the adapters, and no two modules of
the core, share a name."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BROKER_LIBRARIES = {"stomp", "pyspark", "py4j"}

# Bottom up: what is right under mdb/ (a folder, or a root module), one layer each. A module may
# import its own layer and those below, never one above; folders on one layer may import each
# other. The package's face, mdb/__init__.py, re-exports from every layer up to the commands'
# (the dead-letter library): only the commands and the testing kit may import from it, so that
# no module the face imports imports the face while it is being made.
LAYERS: list[tuple[str, set[str]]] = [
    ("the roots", {"errors", "clock"}),
    ("models and the seam", {"seam", "messages", "listeners", "config", "observability"}),
    ("one path to a broker, and the plan", {"routing"}),
    ("delivery", {"delivery"}),
    ("exactly-once", {"exactly_once"}),
    ("the container", {"container"}),
    ("serving it", {"serving"}),
    ("the commands, and the package's face", {"commands", "__init__"}),
    ("the testing kit", {"testing"}),
]
CONTAINER = next(i for i, (_, folders) in enumerate(LAYERS) if "container" in folders)
MOST_MODULES_FLAT = 15  # in a folder of mdb/, adapters/ or tests/harness/
MOST_LINES = 400  # of a module of mdb/: past it, split it by concern


def _module(path: Path) -> str:
    """The import name of ``path``: adapters are imported from their folder of
    ``adapters/`` (``adapters/brokers/mdb_stomp/broker.py`` is ``mdb_stomp.broker``)."""
    relative = path.relative_to(ROOT)
    if relative.parts[0] == "adapters":
        relative = relative.relative_to(*relative.parts[:2])
    return ".".join(relative.with_suffix("").parts).removesuffix(".__init__")


def _modules(folder: str) -> dict[str, Path]:
    return {_module(path): path for path in (ROOT / folder).rglob("*.py")}


CORE = _modules("mdb")


def _imports(path: Path, known: set[str]) -> set[str]:
    """The modules ``path`` imports: ``from mdb.messages import codec`` is
    ``mdb.messages.codec`` (a module of ``known``), ``from mdb import Context`` is ``mdb``."""
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
    """The layer of ``module`` of the core: that of its entry right under ``mdb/``."""
    parts = module.split(".")
    entry = parts[1] if len(parts) > 1 else "__init__"
    return next((i for i, (_, entries) in enumerate(LAYERS) if entry in entries), None)


def test_every_module_of_the_core_has_a_layer() -> None:
    unplaced = sorted({m.split(".")[1] for m in CORE if _layer(m) is None})
    assert not unplaced, f"add to LAYERS (and to docs/architecture.md, \"Layers\"): {unplaced}"


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
        above = {name for name in _imports(path, set(CORE)) if name in CORE and name != "mdb"
                 and (_layer(name) or 0) >= CONTAINER}
        assert not above, f"{module} imports {sorted(above)}"


def test_the_delivery_path_knows_no_database() -> None:
    # Each guarantee is a run chosen when the slots are built (mdb.delivery.runs): the
    # exactly-once one is mdb.exactly_once's, above the delivery path.
    for module, path in CORE.items():
        if _under(module, {"mdb.delivery"}):
            found = {name for name in _imports(path, set(CORE)) if _under(
                name, {"sqlalchemy", "mdb.exactly_once", "mdb.config.database_settings"})}
            assert not found, f"{module} imports {sorted(found)}"


def test_no_folder_holds_more_than_fifteen_modules_flat() -> None:
    crowded = {}
    for top in ("mdb", "adapters", "tests/harness"):
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > MOST_MODULES_FLAT:
                crowded[str(folder.relative_to(ROOT))] = len(modules)
    assert not crowded, f"split these by concern: {crowded}"


def test_no_module_of_the_core_is_longer_than_four_hundred_lines() -> None:
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for path in CORE.values()}
    long = {path: count for path, count in lines.items() if count > MOST_LINES}
    assert not long, f"split these by concern: {long}"


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


# A path in backticks: a folder or a file, from the top of the repository (`mdb/seam/`).
PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]*|[\w-]+\.(?:py|toml|md|xml))`")


def test_every_path_the_architecture_page_names_exists() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted({path for path in PATH.findall(page) if not (ROOT / path).exists()})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_a_class_name_means_one_thing() -> None:
    # docs/architecture.md, "Glossary": one name, one thing. A class of the core or an adapter
    # whose name another has would make a reader (and a grep) take one for the other.
    where: dict[str, list[str]] = {}
    for folder in ("mdb", "adapters"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, f"rename one of each: {shared}"


def test_a_module_name_means_one_thing_in_the_core() -> None:
    where: dict[str, list[str]] = {}
    for path in sorted(CORE.values()):
        if path.name != "__init__.py":
            where.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, f"rename one of each: {shared}"
