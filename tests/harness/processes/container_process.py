"""A container process: ``mdb run <module>`` as a user starts it, its ledger (the JSON lines a
ledger app prints, ``tests.harness.apps.queue_ledger_app`` or
``tests.harness.apps.topic_ledger_app``) and the CLI's own lines read from its stdout, so a test can
wait for them and then kill it."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mdb import Settings
from tests.harness.apps.in_process import WAIT
from tests.harness.processes.application_secret import ENVIRONMENT as SECRET_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[3]


def topology_environment(url: str | Settings) -> dict[str, str]:
    """Environment variables giving a container process one broker, or ``url``'s topology."""
    if isinstance(url, str):
        return {"MDB_BROKERS__DEFAULT__URL": url}
    brokers = {name: {**broker.model_dump(mode="json", exclude_none=True),
                      **({"password": broker.password.get_secret_value()}
                         if broker.password is not None else {})}
               for name, broker in url.brokers.items()}
    destinations = {key: entry.model_dump(mode="json", exclude_none=True)
                    for key, entry in url.destinations.items()}
    return {"MDB_BROKERS": json.dumps(brokers), "MDB_DESTINATIONS": json.dumps(destinations)}


class ContainerProcess:
    """``mdb run <module>`` in its own process, its ledger read from stdout.

    ``url`` is the one broker's URL, or settings whose topology (``brokers`` and
    ``destinations``) the process gets, as ``MDB_BROKERS`` and ``MDB_DESTINATIONS`` in JSON.
    ``module`` defaults to ``tests.harness.apps.queue_ledger_app``; ``env`` adds environment
    variables; ``args`` are options of ``mdb run`` (``--workers 2``); ``prefix`` is put before the
    command (``ip netns exec NAME`` runs it in a namespace).
    Processes given one ``lines`` queue share it. Besides the ledger's JSON lines, the queue gets
    ``ready``, ``stopping`` and ``stopped`` events from the CLI's own lines, and
    ``redelivering`` and ``connection-lost`` from its log.
    """

    def __init__(self, url: str | Settings, ledger_queue: str, app: str, server: str, hang: bool,
                 grace: float = 1, *, module: str = "tests.harness.apps.queue_ledger_app",
                 env: Mapping[str, str] | None = None,
                 lines: queue.Queue[dict[str, Any]] | None = None,
                 args: Sequence[str] = (), prefix: Sequence[str] = ()) -> None:
        environment = {**{k: v for k, v in os.environ.items() if not k.startswith("MDB_")},
                       **SECRET_ENVIRONMENT,
                       "LEDGER_QUEUE": ledger_queue, "MDB_APP": app, "MDB_SERVER": server,
                       **topology_environment(url),
                       "MDB_SHUTDOWN_GRACE_PERIOD": str(grace), "MDB_LOG_LEVEL": "WARNING",
                       **(env or {})}
        if hang:
            environment["HANG_FIRST_DELIVERY"] = "1"
        self.server = server
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue() if lines is None else lines
        # Its last lines of output, whatever they are: why a process that exited did.
        self.tail: deque[str] = deque(maxlen=30)
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "mdb.commands.cli", "run", module, *args],
            cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.tail.append(line.rstrip("\n"))
            if line.startswith("{"):
                self.lines.put(json.loads(line))
            elif line.startswith("mdb: ready"):
                self.lines.put({"event": "ready", "server": self.server,
                                "pid": self.process.pid, "line": line})
            elif line.startswith("mdb: stopped"):
                self.lines.put({"event": "stopped", "server": self.server,
                                "pid": self.process.pid, "line": line})
            elif "stopping" in line:
                self.lines.put({"event": "stopping", "line": line})
            elif " of at most " in line:  # a failure settled for a redelivery (at INFO)
                self.lines.put({"event": "redelivering", "line": line})
            elif "connection-lost: broker" in line:
                self.lines.put({"event": "connection-lost", "line": line})

    def take(self, count: int, event: str) -> list[dict[str, Any]]:
        """The next ``count`` ledger entries of ``event`` (others are kept in ``seen``)."""
        taken: list[dict[str, Any]] = []
        while len(taken) < count:
            try:
                entry = self.lines.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(
                    f"{self.server}: no {event!r} in {WAIT} s (exit status "
                    f"{self.process.poll()}); its last lines:\n" + "\n".join(self.tail)
                ) from None
            self.seen.append(entry)
            if entry["event"] == event:
                taken.append(entry)
        return taken

    seen: list[dict[str, Any]]

    def __enter__(self) -> ContainerProcess:
        self.seen = []
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=WAIT)
