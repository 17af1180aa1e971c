"""Where the tests' own code lives (docs/testing.md, "mdb's own suite"): no module of the tests
or the examples imports a test module (``test_*.py``) or a conftest module, nor names one to
be imported (``mdb run``, ``import_modules``). What tests share lives in ``tests/harness``
(or a suite's support module); fixtures reach a test through pytest."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("tests", "examples")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _modules() -> dict[str, Path]:
    return {_module(path): path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py")}


def _is_test_or_conftest(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def _imported(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports (``from tests.unit import test_x`` as
    ``tests.unit.test_x``, relative imports resolved), and every string naming one."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    modules = _modules()
    forbidden = {name for name in modules if _is_test_or_conftest(name)}
    assert "tests.unit.test_test_imports" in forbidden  # the walk finds the test modules
    offences = sorted(
        f"{name} imports {target}"
        for name, path in modules.items()
        for target in _imported(path, name) & forbidden
        if target != name)
    assert not offences, "\n".join(offences)
