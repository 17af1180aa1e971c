"""What the Spark tests share besides their fixtures (``conftest.py``): settings of a
partitioned destination, a producer, a bounded poll, and what a broker still stores of a
source's subscription queues."""

from __future__ import annotations

import atexit
import json
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from mdb.config.settings import load_settings
from mdb.routing.producer import Producer
from tests.harness.processes.fleet import browse

# The application's identity secret, which the test's producers and the Spark processes
# read alike (docs/spark.md): the source knows a message by the mdb_id it proved.
SECRET_FILE = Path(tempfile.mkdtemp(prefix="mdb-spark-")) / "identity-secret"
SECRET_FILE.write_text(secrets.token_hex(32))
atexit.register(shutil.rmtree, SECRET_FILE.parent, True)


def settings_json(app: str, urls: list[str], destination: str = "topic:orders",
                  names: list[str] | None = None) -> dict[str, Any]:
    """Settings with one broker per URL and ``destination`` partitioned over them, and the
    application's identity secret."""
    brokers = {f"b{i}": {"url": url, "reconnect_delay": 0.2, "reconnect_max_delay": 1.0,
                         "connect_timeout": 2.0, "send_wait_for_reconnect": 0.0}
               for i, url in enumerate(urls)}
    members = [{"broker": f"b{i}", **({"name": names[i]} if names else {})}
               for i in range(len(urls))]
    return {"app": app, "server": "tests", "brokers": brokers,
            "destinations": {destination: {"members": members}},
            "identity_secret_file": str(SECRET_FILE)}


def publish(settings: dict[str, Any], destination: str, bodies: list[str],
            key: Callable[[int], str | None] = lambda i: None) -> list[str]:
    """Send ``bodies`` (round robin over the members unless ``key`` picks); return the ids."""

    async def send_all() -> list[str]:
        async with Producer(load_settings(None, **settings)) as producer:
            return [await producer.send(destination, body, key=key(i))
                    for i, body in enumerate(bodies)]

    return anyio.run(send_all)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Poll ``condition`` until true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def broker_kind(broker: Any) -> str:
    """``activemq`` or ``rabbitmq``."""
    return str(broker.scheme).split("+")[-1]


def subscription_queue(broker: Any, subscription: str, member: str) -> str:
    """The queue of the source's shared ``subscription`` (``<app>-<name>``) to topic
    ``member`` on ``broker``."""
    virtual = "VirtualTopic." if broker_kind(broker) == "activemq" else ""
    return f"Consumer.{subscription}.{virtual}{member}"


def stored(broker: Any, queues: list[str]) -> dict[str, int]:
    """How many messages each of ``queues`` still holds, delivered and not yet acked ones
    included (ActiveMQ's queue browser lists them, RabbitMQ's ``messages`` counts them); only
    the queues holding any."""
    if broker_kind(broker) == "rabbitmq":
        counts = {queue: broker.stored().get(queue, 0) for queue in queues}
    else:
        counts = {queue: len(browse(broker, queue)) for queue in queues}
    return {queue: count for queue, count in counts.items() if count}


def source_options(settings: dict[str, Any], journal: str, destination: str = "topic:orders",
                   **extra: str) -> dict[str, str]:
    return {"settings": json.dumps(settings), "destination": destination, "journal": journal,
            "name": "pipeline", **extra}
