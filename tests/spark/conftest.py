"""Spark fixtures: one local[2] SparkSession for the whole run, with the ``mdb`` format.

Skipped locally when PySpark (or Java) is missing, never in CI (``missing``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mdb.producer import Producer
from mdb.settings import load_settings
from tests.conftest import IN_CI, missing
from tests.harness.ledger import browse

# The test modules import PySpark: without it they are not collected here (locally), and fail
# loudly in CI, where the spark fixture's ``missing`` also refuses to skip.
if importlib.util.find_spec("pyspark") is None and not IN_CI:
    collect_ignore_glob = ["test_*.py", "bench_*.py", "query_process.py"]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if importlib.util.find_spec("pyspark") is None:
        missing("PySpark (pip install -e '.[spark]')")
    if shutil.which("java") is None:
        missing("Java (for PySpark)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import mdb_spark

    session = (SparkSession.builder.master("local[2]").appName("mdb-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "768m")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    mdb_spark.register(session)
    try:
        yield session
    finally:
        session.stop()


def settings_json(app: str, urls: list[str], destination: str = "topic:orders",
                  names: list[str] | None = None) -> dict[str, Any]:
    """Settings with one broker per URL and ``destination`` partitioned over them."""
    brokers = {f"b{i}": {"url": url, "reconnect_delay": 0.2, "reconnect_max_delay": 1.0,
                         "connect_timeout": 2.0, "send_wait_for_reconnect": 0.0}
               for i, url in enumerate(urls)}
    members = [{"broker": f"b{i}", **({"name": names[i]} if names else {})}
               for i in range(len(urls))]
    return {"app": app, "server": "tests", "brokers": brokers,
            "destinations": {destination: {"members": members}}}


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


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A moto S3 server (its own port and PID) with the bucket ``mdb``."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None:
        missing("moto[server] and s3fs (pip install -e '.[test,spark]')")
    from tests.harness.spark_cluster import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    try:
        server.filesystem().mkdir("mdb")  # type: ignore[attr-defined]
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_folder(s3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bucket ``mdb`` of ``s3`` mounted as a folder (s3fs-fuse), for Spark's checkpoint and
    output."""
    if shutil.which("s3fs") is None or not os.path.exists("/dev/fuse"):
        missing("s3fs-fuse and /dev/fuse (apt-get install s3fs)")
    from tests.harness.spark_cluster import S3Mount

    mount = S3Mount(s3, "mdb", tmp_path_factory.mktemp("s3-mount") / "mdb").start()
    try:
        yield mount.mountpoint
    finally:
        mount.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A standalone Spark master and two 1-core workers (their own ports, dirs and PIDs)."""
    if shutil.which("java") is None:
        missing("Java (for Spark)")
    from tests.harness.spark_cluster import SparkCluster

    with SparkCluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(params=["activemq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def stomp_broker(request: pytest.FixtureRequest) -> Any:
    """A private broker of each kind the source and sink run on: ActiveMQ, RabbitMQ."""
    return request.getfixturevalue(request.param)


@pytest.fixture(params=["activemq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def stomp_trio(request: pytest.FixtureRequest) -> list[Any]:
    """The brokers of a three-member topic, one per member: the session's three ActiveMQ
    brokers; on RabbitMQ the session's one node three times over, under three broker entries
    (the tests give the members distinct names). Each member still has its own connection and
    receive loop; what separate machines add is covered on ActiveMQ, and two more RabbitMQ
    nodes would add their startup to every CI run."""
    if request.param == "activemq":
        return list(request.getfixturevalue("activemq_trio"))
    return [request.getfixturevalue("rabbitmq")] * 3
