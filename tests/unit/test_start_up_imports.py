"""``mdb run`` imports SQLAlchemy and the exactly-once modules only for a listener that uses
them, and the modules of another command (``mdb migrate``, ``mdb console``, ``mdb db``) not
at all: a container without a database starts, serves and stops without them
(docs/performance.md, "What the figures say": the start-up is mostly imports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness.processes.cli import stopped, until_ready

# As if SQLAlchemy were not installed: importing it raises ImportError.
WITHOUT_SQLALCHEMY = ("import sys\nsys.modules['sqlalchemy'] = None\n"
                      "from mdb.commands.cli import main\nmain()\n")


def test_mdb_run_without_a_database_never_imports_sqlalchemy(tmp_path: Path) -> None:
    (tmp_path / "app_listeners.py").write_text(
        "from mdb import Context, listener\n\n"
        "@listener('queue:orders')\n"
        "async def on_order(body: bytes, ctx: Context) -> None:\n"
        "    pass\n")
    process = subprocess.Popen([sys.executable, "-c", WITHOUT_SQLALCHEMY, "run",
                                "app_listeners"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    until_ready(process)
    out, err = stopped(process)
    assert process.returncode == 0, err
    assert out.splitlines()[-1] == "mdb: stopped; processed 0, in flight 0"


# What the command line imports before it knows its command: none of these.
OTHER_COMMANDS = ("sqlalchemy", "mdb.exactly_once", "mdb.commands.migrate.command",
                  "mdb.commands.console.console_command")


def test_the_command_line_imports_no_other_commands_modules() -> None:
    listed = subprocess.run(
        [sys.executable, "-c", "import sys, mdb.commands.cli\nprint(*sorted(sys.modules))"],
        capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert [name for name in OTHER_COMMANDS if name in listed] == []
