"""Docs that are generated must be current, and their examples must run."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

from mdb.config import reference
from mdb.config.settings import load_settings
from mdb.messages.destinations import Destination
from mdb.testing import RunningApp
from tests.harness.processes.cli import mdb

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_reference_matches_the_settings_models() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    start, end = "<!-- reference:start -->\n", "<!-- reference:end -->"
    generated = text[text.index(start) + len(start):text.index(end)]
    assert generated == reference.markdown() + "\n", (
        "docs/configuration.md is stale: regenerate its reference section with "
        "`python -m mdb.config.reference --write`"
    )


def test_the_example_settings_in_the_docs_are_valid(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "mdb.toml").write_text(example)
    settings = load_settings(tmp_path / "mdb.toml")
    members = settings.topology().members(Destination.parse("topic:orders"))
    assert [str(m) for m in members] == ["topic:orders@main", "topic:orders_b@backup"]


def test_writing_the_reference_replaces_only_what_is_between_the_markers() -> None:
    text = "# Intro\n<!-- reference:start -->\nstale\n<!-- reference:end -->\n## After\n"
    assert reference.with_reference(text) == (
        "# Intro\n<!-- reference:start -->\n" + reference.markdown()
        + "\n<!-- reference:end -->\n## After\n"
    )


def test_the_shared_store_broker_config_differs_from_the_reference_only_in_its_store() -> None:
    # Two reference configs an operator copies: a fix to one must reach the other.
    def without_store(name: str) -> str:
        text = (ROOT / "adapters" / "brokers" / "mdb_stomp" / name).read_text()
        text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
        text = re.sub(r"<persistenceAdapter>.*?</persistenceAdapter>", "", text, flags=re.S)
        text = re.sub(r'\s*schedulerDirectory="[^"]*"', "", text)  # the scheduler's, shared
        return " ".join(text.split())

    assert without_store("activemq-shared-store.xml") == without_store("activemq.xml")


def test_the_examples_of_the_testing_doc_are_one_test_module_that_passes(tmp_path: Path) -> None:
    # A reader copies them: each name they use must be defined on the page, and they must pass.
    text = (ROOT / "docs" / "testing.md").read_text().split("## For adapter authors")[0]
    snippets = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (tmp_path / "test_from_the_doc.py").write_text("\n\n".join(snippets))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_from_the_doc.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "9 passed" in result.stdout


def test_the_testing_doc_shows_every_option_of_the_kit() -> None:
    # A reader learns the kit from the page: each option a wait or a send takes appears in a
    # call on it (a user who never saw take's timeout waited 30 s for each empty queue).
    text = (ROOT / "docs" / "testing.md").read_text()
    calls: dict[str, str] = {}
    for method, arguments in re.findall(r"app\.(\w+)\(((?:[^()]|\([^()]*\))*)\)", text):
        calls[method] = calls.get(method, "") + " " + arguments
    for method, function in inspect.getmembers(RunningApp, inspect.iscoroutinefunction):
        options = [name for name, p in inspect.signature(function).parameters.items()
                   if p.default is not inspect.Parameter.empty]
        missing = [name for name in options if not re.search(rf"\b{name}\b",
                                                             calls.get(method, ""))]
        assert not missing, f"docs/testing.md shows no app.{method}(...) with {missing}"


def _anchors(page: Path) -> set[str]:
    """The fragments a link may name on a page: each heading as GitHub makes it an id (lower
    case, punctuation but ``-`` and ``_`` dropped, a space a ``-``, a repeat numbered ``-1``...),
    and each ``<a name="...">`` a moved section left for the links to it."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in page.read_text().splitlines():
        in_code ^= line.startswith("```")
        anchors.update(re.findall(r'<a name="([^"]+)"></a>', line))
        heading = None if in_code else re.match(r"#{1,6} (.+)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_link_to_a_docs_page_reaches_the_page_and_its_heading() -> None:
    # Pages get split and their measurements moved to docs/evidence/: a reader must not land
    # on a page or a heading that is gone, whether a page links it or the code cites it.
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    dead: list[str] = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path, _, fragment = target.partition("#")
            if re.match(r"[a-z]+:", path):  # http:, mailto:
                continue
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists() or (fragment and linked.suffix == ".md"
                                       and fragment not in _anchors(linked)):
                dead.append(f"{page.relative_to(ROOT)}: {target}")
    code = [path for folder in ("mdb", "adapters", "examples", "tests", "deploy")
            for path in (ROOT / folder).rglob("*")
            if path.suffix in {".py", ".toml", ".yaml", ".xml"}]
    for source in [*pages, *code]:
        for name, fragment in re.findall(r"docs/([\w/-]+\.md)#([\w-]+)", source.read_text()):
            cited = ROOT / "docs" / name
            if not cited.exists() or fragment not in _anchors(cited):
                dead.append(f"{source.relative_to(ROOT)}: docs/{name}#{fragment}")
    assert not dead, dead


def test_the_readme_and_the_docs_name_the_exactly_once_database_alike() -> None:
    # One name, the one the docs' settings define ([databases.main]): a reader who copies
    # the README's listener and the docs' settings gets a listener that starts.
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    named = {name for page in pages
             for name in re.findall(r'exactly_once="(\w+)"', page.read_text())}
    assert named == {"main"}, named


def test_the_quickstart_project_passes_its_own_tests(tmp_path: Path) -> None:
    # docs/quickstart.md, copied as a reader would: the listener module, its tests, pytest's
    # configuration; run from the project folder.
    text = (ROOT / "docs" / "quickstart.md").read_text()
    listeners, tests = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    pytest_config = re.findall(r"```toml\n(.*?)```", text, flags=re.S)[0]
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "__init__.py").write_text("")
    (tmp_path / "svc" / "listeners.py").write_text(listeners)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_payments.py").write_text(tests)
    (tmp_path / "pyproject.toml").write_text(pytest_config)
    # The pytest command, not python -m pytest, which would put the folder on sys.path itself.
    result = subprocess.run(
        [str(Path(sys.executable).parent / "pytest"), "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "2 passed" in result.stdout


def test_the_docs_show_what_mdb_db_upgrade_prints(tmp_path: Path) -> None:
    # A reader compares the output line by line: a page showing fewer tables than the command
    # makes reads as an upgrade gone wrong.
    (tmp_path / "mdb.toml").write_text("[databases.main]\nurl = 'sqlite+aiosqlite:///x.db'\n")
    done = mdb("db", "upgrade", "--config", "mdb.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.decode().strip().split("): ", 1)[1]
    shown = {line.split("): ", 1)[1] for page in (ROOT / "docs").glob("*.md")
             for line in page.read_text().splitlines()
             if re.match(r"database main \(.*\): created ", line)}
    assert shown == {printed}
