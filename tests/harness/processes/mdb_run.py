"""``mdb run`` of a module a test writes, as a user runs it: a process whose output a test reads
line by line and stops with SIGTERM."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.harness.apps.in_process import WAIT


class MdbRun:
    """``mdb run`` of ``app`` (the source of a module, written to ``folder``) in a
    subprocess, with ``env`` and a short ``shutdown_grace_period``; its output lines in
    ``lines``."""

    def __init__(self, folder: Path, env: dict[str, str], app: str) -> None:
        (folder / "test_app.py").write_text(app)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mdb.commands.cli", "run", "test_app"], cwd=folder,
            env={**os.environ, "MDB_SHUTDOWN_GRACE_PERIOD": "0.2", **env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str) -> None:
        while not any(text in line for line in self.seen):
            self.seen.append(self.lines.get(timeout=WAIT))

    def stop(self) -> int:
        """SIGTERM, then its exit status (waited for generously: a hang fails the test)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=WAIT)
        finally:
            self.process.kill()
            self.process.wait()
            while not self.lines.empty():
                self.seen.append(self.lines.get_nowait())
