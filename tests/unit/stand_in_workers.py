"""The supervisor of ``mdb run --workers N`` over stand-in workers, for
``tests/unit/test_supervisor.py``: what the supervisor does when workers get ready, end, hang or
cannot start, without a broker.

    python -m tests.unit.stand_in_workers supervise FOLDER COUNT [READY_TIMEOUT]

runs ``mdb.serving.process.supervisor.Supervisor`` (with its signals, its lines on stderr and its
exit status) over COUNT stand-in workers, ``python -m tests.unit.stand_in_workers work FOLDER
INDEX:FD``. At each start, the worker in place INDEX appends its pid to ``FOLDER/INDEX.pids`` and
does what ``FOLDER/INDEX`` says then:

* ``ready``: tells the supervisor it is ready and runs until SIGTERM (exit 0);
* ``exit N``: exits with status N before it is ready (2: as a configuration error);
* ``hang``: serves a health endpoint saying broker ``main`` is down, never gets ready, and
  runs until SIGTERM.

The pauses between restarts are a hundredth of mdb's, so that a test waits for no pause.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import anyio

from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from mdb.observability.health import BrokerHealth, Health
from mdb.serving.http.routes import HealthServer
from mdb.serving.process import supervisor
from mdb.serving.process.worker_channel import WorkerAssignment


def supervise(folder: Path, count: int, ready_timeout: float | None) -> int:
    supervisor.FIRST_PAUSE /= 100
    supervisor.LONGEST_PAUSE /= 100
    if ready_timeout is not None:
        supervisor.READY_TIMEOUT = ready_timeout
    settings = Settings(app="stand_in", server="s1", brokers={
        "main": BrokerSettings(url="stomp+activemq://127.0.0.1:1")})  # never connected to

    def command(place: WorkerAssignment) -> list[str]:
        return [sys.executable, "-m", "tests.unit.stand_in_workers", "work", str(folder),
                str(place)]

    return anyio.run(supervisor.Supervisor(settings, count, command).run)


def work(folder: Path, place: WorkerAssignment) -> int:
    with (folder / f"{place.index}.pids").open("a") as pids:
        pids.write(f"{os.getpid()}\n")
    what = (folder / str(place.index)).read_text().split()
    if what[0] == "exit":
        return int(what[1])
    channel = socket.socket(fileno=place.fd)

    def report(**fields: object) -> None:
        channel.sendall(json.dumps(fields).encode() + b"\n")

    async def serve() -> None:
        down = Health(live=True, ready=False, brokers=(BrokerHealth("main", "down", time.time()),))
        health = HealthServer(lambda: down)
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            if what[0] == "ready":
                report(ready=True)
            else:
                health.start()
                report(health=f"http://127.0.0.1:{health.port}")
            try:
                await signals.__anext__()
            finally:
                health.close()

    anyio.run(serve)
    return 0


def main() -> int:
    mode, folder = sys.argv[1], Path(sys.argv[2])
    if mode == "supervise":
        timeout = float(sys.argv[4]) if len(sys.argv) > 4 else None
        return supervise(folder, int(sys.argv[3]), timeout)
    return work(folder, WorkerAssignment.parse(sys.argv[3]))


if __name__ == "__main__":
    sys.exit(main())
