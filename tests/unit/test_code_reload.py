"""``mdb run --reload``: the container started again, with the new code, when a ``.py`` file
of its module's directory changes; one that no longer imports waits for the next change; a
watcher killed with SIGKILL leaves no container behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdb.errors import ConfigurationError
from mdb.serving.process.code_watch import directories

MODULE = '''
from mdb import listener

print("code version {version}", flush=True)


@listener("queue:work")
async def on_work(body: bytes) -> None:
    pass
'''


def until(lines: Iterator[str], wanted: str, seen: list[str]) -> None:
    """Read the process's output until a line starts with ``wanted``."""
    for line in lines:
        seen.append(line)
        if line.startswith(wanted):
            return
    raise AssertionError(f"the output ended before {wanted!r}:\n{''.join(seen)}")


def test_a_changed_module_restarts_the_container_with_the_new_code(tmp_path: Path) -> None:
    module = tmp_path / "reloaded_app.py"
    module.write_text(MODULE.format(version=1))
    # At the default log level: a restart says what changed, and nothing else of its own.
    env = {k: v for k, v in os.environ.items() if k != "MDB_LOG_LEVEL"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "reloaded_app", "--reload"], cwd=tmp_path,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines, seen = iter(process.stdout), list[str]()
    try:
        until(lines, "mdb: --reload: watching", seen)
        until(lines, "code version 1", seen)
        until(lines, "mdb: ready", seen)

        module.write_text(MODULE.format(version=2))
        until(lines, "mdb: --reload: reloaded_app.py changed", seen)
        until(lines, "code version 2", seen)
        until(lines, "mdb: ready", seen)

        # A module that no longer imports: the container exits 2, and waits for a fix.
        module.write_text("raise RuntimeError('half-written')\n")
        until(lines, "mdb: --reload: the container exited with status 2", seen)
        module.write_text(MODULE.format(version=3))
        until(lines, "code version 3", seen)
        until(lines, "mdb: ready", seen)
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    assert process.returncode == 0, "".join(seen) + rest
    assert "mdb: stopped" in rest  # the container stopped in order
    assert sum(line.startswith("mdb: ready") for line in seen) == 3
    said = seen + rest.splitlines(keepends=True)
    assert not [line for line in said if "watchfiles" in line], "".join(said)
    # The watcher's own line for the final SIGTERM; none from the container, stopped by it.
    assert [line for line in said if "SIGTERM" in line] == [
        "mdb: --reload: SIGTERM: stopping the container (signal again to kill it)\n"]


def test_a_watcher_killed_with_sigkill_leaves_no_container_running(tmp_path: Path) -> None:
    (tmp_path / "orphan_app.py").write_text(
        "import os\n\nprint('container pid', os.getpid(), flush=True)\n" +
        MODULE.format(version=1))
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "orphan_app", "--reload"], cwd=tmp_path,
        env={**os.environ, "MDB_LOG_LEVEL": "WARNING"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines, seen = iter(process.stdout), list[str]()
    until(lines, "container pid", seen)
    container = int(seen[-1].split()[-1])
    try:
        until(lines, "mdb: ready", seen)
        process.kill()
        # The container holds the other copy of the output pipe: the output ends as it exits.
        rest, _ = process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(container, signal.SIGKILL)  # when it ran on, orphaned
    assert "mdb: the --reload watcher is gone; stopping" in rest, "".join(seen) + rest
    assert "mdb: stopped" in rest  # in order


def test_the_directory_of_each_module_is_watched(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "listeners.py").write_text("")
    (tmp_path / "top.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert directories(["pkg.listeners", "top"]) == sorted(
        [tmp_path.resolve(), (tmp_path / "pkg").resolve()])
    with pytest.raises(ConfigurationError, match="cannot find listener module 'nowhere'"):
        directories(["nowhere"])
