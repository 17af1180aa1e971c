"""Spark fixtures: one local[2] SparkSession for the whole run, with the ``mdb`` format.

Skipped locally when PySpark (or Java) is missing, never in CI (``missing``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.servers.brokers import IN_CI, missing

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


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A moto S3 server (its own port and PID) with the bucket ``mdb``."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None:
        missing("moto[server] and s3fs (pip install -e '.[test,spark]')")
    from tests.harness.servers.spark_cluster import S3Server

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
    from tests.harness.servers.spark_cluster import S3Mount

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
    from tests.harness.servers.spark_cluster import SparkCluster

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
