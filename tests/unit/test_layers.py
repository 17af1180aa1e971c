"""The import rules of docs/architecture.md, "Layers": the core imports no broker library,
the seam and the models import nothing above them, and adapters never import the container."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BROKER_LIBRARIES = {"stomp", "pyspark", "py4j"}
# The seam and the models: everything above them may import them, never the other way round.
BELOW_THE_CONTAINER = {
    "mdb.broker", "mdb.broker_settings", "mdb.clock", "mdb.codec", "mdb.context",
    "mdb.database_settings",
    "mdb.destinations", "mdb.errors", "mdb.events", "mdb.identity", "mdb.jms_names",
    "mdb.listener",
    "mdb.logs", "mdb.message", "mdb.options", "mdb.redaction", "mdb.selector",
    "mdb.selector_check", "mdb.settings", "mdb.telemetry", "mdb.topology",
}
# The container and what drives it: no adapter imports these.
CONTAINER_AND_ABOVE = (
    "mdb.container", "mdb.slots", "mdb.health", "mdb.delivery", "mdb.planning", "mdb.cli",
    "mdb.serve", "mdb.supervisor", "mdb.reload", "mdb.report", "mdb.wiring",
    "mdb.worker_channel", "mdb.lifeline", "mdb.testing",
)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT / "adapters" if "adapters" in path.parts else ROOT)
    name = ".".join(parts.with_suffix("").parts)
    return name.removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, ``from mdb import codec`` as ``mdb.codec``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _under(name: str, packages: tuple[str, ...] | set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_core_imports_no_broker_library() -> None:
    for path in (ROOT / "mdb").rglob("*.py"):
        libraries = {name for name in _imports(path) if _under(name, BROKER_LIBRARIES)}
        assert not libraries, f"{_module(path)} imports {sorted(libraries)}"


def test_the_seam_and_the_models_import_nothing_above_them() -> None:
    for path in (ROOT / "mdb").rglob("*.py"):
        if _module(path) not in BELOW_THE_CONTAINER:
            continue
        above = {name for name in _imports(path)
                 if _under(name, ("mdb",)) and name != "mdb"
                 and not _under(name, BELOW_THE_CONTAINER)}
        assert not above, f"{_module(path)} imports {sorted(above)}"


def test_adapters_never_import_the_container() -> None:
    paths = list((ROOT / "adapters").rglob("*.py"))
    assert paths
    for path in paths:
        above = {name for name in _imports(path) if _under(name, CONTAINER_AND_ABOVE)}
        assert not above, f"{_module(path)} imports {sorted(above)}"
