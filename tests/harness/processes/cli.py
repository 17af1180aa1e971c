"""The ``mdb`` command in a process of its own, as an operator runs it with careless or hostile
input (docs/security.md): its address space bounded, so that a reader without bound fails
fast instead of swapping, and the line it ends with; and an ``mdb run`` a test started, waited
for until ready and stopped as an operator stops it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path


def mdb(*args: str, cwd: Path, env: dict[str, str] | None = None,
        stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    def limit_memory() -> None:  # a reader without bound fails fast instead of swapping
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([sys.executable, "-m", "mdb.commands.cli", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, input=stdin,
                          capture_output=True, timeout=120, preexec_fn=limit_memory)


def one_line(stderr: bytes) -> str:
    """The last line of ``stderr``, which holds no traceback: mdb says what failed in a line."""
    lines = stderr.decode().strip().splitlines()
    assert "Traceback" not in stderr.decode()
    return lines[-1]


def until_ready(process: subprocess.Popen[str]) -> None:
    """Read the output of ``process``, an ``mdb run``, until it says ``mdb: ready`` (or ends)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("mdb: ready"):
            break


def stopped(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM to ``process``, then its output and error output to their end."""
    process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=60)
