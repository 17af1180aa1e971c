"""Health endpoints for tests: snapshots of a container that is ready and of one that is not,
a blocking GET of a probe, and a ``HealthServer`` answering a snapshot from a thread
(docs/failover.md, "Health"; docs/deployment.md, "Probes")."""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import anyio.to_thread

from mdb.observability.health import BrokerHealth, DatabaseHealth, Health, ListenerHealth
from mdb.serving.http.routes import HealthServer

NOW = time.time()
READY = Health(
    live=True, ready=True,
    brokers=(BrokerHealth("main", "up", NOW - 90, "stomp+activemq://u:***@standby:61613"),),
    listeners=(ListenerHealth("on_order", members=3, subscribed=3, in_flight=1, processed=42),),
    events={"connection-lost": 1, "connection-restored": 1},
    databases=(DatabaseHealth("main", "up", NOW - 90, outbox=0, oldest=None),),
)
NOT_READY = Health(
    live=True, ready=False,
    brokers=(BrokerHealth("main", "up", NOW - 90), BrokerHealth("backup", "failed", NOW - 30)),
    listeners=(ListenerHealth("on_order", members=3, subscribed=2, in_flight=0, processed=7),),
    events={"broker-failed": 1},
    databases=(DatabaseHealth("orders", "down", NOW - 20, outbox=12, oldest=75.0),),
)


def get(url: str) -> tuple[int, dict[str, object]]:
    """Blocking GET: (status, JSON body), whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@contextmanager
def serving(health: Health) -> Iterator[str]:
    """A HealthServer answering ``health``, on its own event loop in a thread; yields its URL."""
    urls: queue.Queue[str] = queue.Queue()
    stop = threading.Event()

    async def serve() -> None:
        server = HealthServer(lambda: health)
        server.start()
        try:
            urls.put(f"http://127.0.0.1:{server.port}")
            await anyio.to_thread.run_sync(stop.wait)
        finally:
            server.close()

    thread = threading.Thread(target=anyio.run, args=(serve,), daemon=True)
    thread.start()
    try:
        yield urls.get(timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)
