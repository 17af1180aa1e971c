"""The pipeline example on a real standalone cluster: a master and two workers (their own
JVMs, executors and Python workers), submitted with ``spark-submit --master spark://…`` and
``--py-files`` of this checkout's mdb, the source's journal on an S3 server (moto) through
s3fs, the checkpoint and the totals on the same bucket mounted by s3fs-fuse: on ActiveMQ and
on RabbitMQ; and three faults there (on ActiveMQ, docs/spark.md): kill -9 of the driver, of a
worker mid-batch, of the broker mid-stream. Each test ends with every order counted once in
the parquet totals and nothing left in the source's subscription queues."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

import mdb_spark
from examples.spark_orders.pipeline import orders, send
from tests.harness.servers.brokers import private_brokers
from tests.harness.servers.process import free_port
from tests.harness.servers.spark_cluster import (
    HOST,
    Daemon,
    S3Server,
    SparkCluster,
    http_get,
    shipped_code,
)
from tests.spark.support import broker_kind, stored, subscription_queue, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.activemq]

ROOT = Path(__file__).resolve().parents[2]
ORDERS = 60  # over two one-minute windows, then a later order that closes both
TOML = """app = "{app}"

[brokers.a]
url = "{url}"
reconnect_max_delay = 2.0  # the broker kill test waits for the source to reconnect

[destinations."topic:orders"]
members = [{{ broker = "a", name = "{app}_p0" }}, {{ broker = "a", name = "{app}_p1" }},
           {{ broker = "a", name = "{app}_p2" }}]
"""


def _totals(output: Path) -> list[dict[str, Any]]:
    """The rows of the example's parquet table so far (none while it has no complete file)."""
    import pyarrow.parquet as pq

    if not output.is_dir():
        return []
    try:
        rows: list[dict[str, Any]] = pq.read_table(output).to_pylist()
    except (OSError, ValueError):  # a batch folder being written
        return []
    return rows


def _submit(cluster: SparkCluster, s3: S3Server, config: Path, work: Path, store: Path,
            name: str, conf: dict[str, str] | None = None) -> Daemon:
    """Submit the example with its journal on the S3 server (through fsspec) and its
    checkpoint and totals in ``store``, a folder of the same bucket mounted by s3fs-fuse."""
    return cluster.submit(
        ROOT / "examples" / "spark_orders" / "job.py",
        ["--config", str(config), "--journal", "s3://mdb/journal", "--output",
         str(store / "totals"), "--checkpoint", str(store / "checkpoint")],
        py_files=shipped_code(ROOT, work / "mdb.zip"), env=s3.env, log=work / f"{name}.log",
        conf=conf)


def _prepared(broker: Any, work: Path, s3_folder: Path, app: str) -> tuple[Path, Path]:
    """The example's settings for ``app`` (its own subscription and member queues), with the
    subscriptions created before anything is sent, and the folder of the mounted bucket for
    its checkpoint and totals."""
    config = work / "mdb.toml"
    config.write_text(TOML.format(url=broker.url, app=app))
    outcome = mdb_spark.create_subscriptions(
        {"config": str(config), "destination": "topic:orders", "name": "totals"})
    assert set(outcome.values()) == {"created"}
    return config, s3_folder / app


def _counted_once(store: Path, sent: list[dict[str, Any]]) -> None:
    """Each order is counted once in the parquet totals: none lost, none doubled (the amounts
    too, so that a lost order and a doubled one of one region cannot cancel out)."""
    totals = _totals(store / "totals")
    counted, amounts = Counter[str](), Counter[str]()
    for row in totals:
        counted[row["region"]] += row["orders"]
        amounts[row["region"]] += row["amount"]
    assert counted == Counter(str(o["region"]) for o in sent[:ORDERS])
    assert amounts == sum((Counter({str(o["region"]): o["amount"]}) for o in sent[:ORDERS]),
                          Counter[str]())
    assert len({(r["region"], r["start"]) for r in totals}) == len(totals) == 6


def _stored(broker: Any, app: str) -> dict[str, int]:
    """How many messages each subscription queue of the source still holds, delivered and not
    yet acked ones included; only the queues holding any."""
    return stored(broker, [subscription_queue(broker, f"{app}-totals", f"{app}_p{i}")
                           for i in range(3)])


def _wait_until_done(store: Path, driver: Daemon, broker: Any, app: str) -> None:
    """Wait for the totals of every order, then for the source's queues to be empty (the
    receiver acks what it journaled, so the driver runs meanwhile); stop the driver."""
    try:
        wait_for(lambda: sum(r["orders"] for r in _totals(store / "totals")) >= ORDERS
                 or not driver.alive(), f"totals of {ORDERS} orders", timeout=300)
        assert driver.alive(), driver.tail()
        wait_for(lambda: not _stored(broker, app), f"nothing left in the queues of {app}",
                 timeout=60)
    finally:
        driver.stop()


def _wait_for_a_commit(store: Path, driver: Daemon) -> None:
    commits = store / "checkpoint" / "commits"
    wait_for(lambda: (commits.is_dir() and any(commits.glob("[0-9]*"))) or not driver.alive(),
             "a committed batch", timeout=300)
    assert driver.alive(), driver.tail()


def _whole_segments(s3: S3Server, journal: str) -> int:
    """Check that every journal segment in the bucket under ``journal`` holds exactly the
    records its name says (``seg-<start>-<end>.jsonl``): an append is one PUT, so a writer
    killed mid-stream never leaves half a segment. Return how many records they hold."""
    fs: Any = s3.filesystem()
    records = 0
    for path in fs.find(journal):
        name = path.rsplit("/", 1)[-1]
        if name.startswith("seg-"):
            start, end = (int(n) for n in name.removesuffix(".jsonl").split("-")[1:])
            lines = fs.cat(path).decode().splitlines()
            assert len(lines) == end - start, path
            assert all(json.loads(line)["i"] for line in lines), path
            records += len(lines)
    return records


def _driver_api(port: int, path: str) -> Any:
    """The driver's status REST API (on its UI port), or None while it does not answer."""
    body = http_get(f"http://{HOST}:{port}/api/v1/{path}")
    return None if body is None else json.loads(body)


def test_the_example_on_a_standalone_cluster_counts_each_order_once(
        stomp_broker: Any, s3: S3Server, s3_folder: Path, spark_cluster: SparkCluster,
        tmp_path: Path) -> None:
    app = f"cluster_{broker_kind(stomp_broker)}"
    config, store = _prepared(stomp_broker, tmp_path, s3_folder, app)
    sent = orders(ORDERS)
    anyio.run(send, config, sent)

    _wait_until_done(store, _submit(spark_cluster, s3, config, tmp_path, store, "driver"),
                     stomp_broker, app)
    _counted_once(store, sent)
    objects = s3.filesystem().find  # type: ignore[attr-defined]
    assert any(f"/a_topic_{app}_p" in path for path in objects(f"mdb/journal/{app}-totals"))
    # The checkpoint and the totals are objects in the bucket, not files on this machine.
    assert any("/checkpoint/commits/" in path for path in objects(f"mdb/{app}/checkpoint"))
    assert any(path.endswith(".parquet") for path in objects(f"mdb/{app}/totals"))
    # Executors ran on both workers, in their own processes.
    for index in range(2):
        assert list((spark_cluster.base_dir / f"worker{index}").glob("app-*/*/stderr"))


def test_kill_9_of_the_driver_and_resubmit_from_the_checkpoint_counts_each_order_once(
        activemq: Any, s3: S3Server, s3_folder: Path, spark_cluster: SparkCluster,
        tmp_path: Path) -> None:
    config, store = _prepared(activemq, tmp_path, s3_folder, "killed")
    sent = orders(ORDERS)
    anyio.run(send, config, sent[:40])

    driver = _submit(spark_cluster, s3, config, tmp_path, store, "driver")
    try:
        _wait_for_a_commit(store, driver)
        anyio.run(send, config, sent[40:50])
    finally:
        driver.kill()  # kill -9 of the driver's process group: its Python and its JVM
    assert sum(r["orders"] for r in _totals(store / "totals")) == 0  # windows still open
    assert _whole_segments(s3, "mdb/journal/killed-totals") > 0

    anyio.run(send, config, sent[50:])
    _wait_until_done(store, _submit(spark_cluster, s3, config, tmp_path, store, "resubmitted"),
                     activemq, "killed")
    _counted_once(store, sent)


def test_kill_9_of_a_worker_mid_batch_retries_its_tasks_and_counts_each_order_once(
        activemq: Any, s3: S3Server, s3_folder: Path, spark_cluster: SparkCluster,
        tmp_path: Path) -> None:
    config, store = _prepared(activemq, tmp_path, s3_folder, "worker")
    sent = orders(ORDERS)
    anyio.run(send, config, sent[:40])
    ui = free_port(HOST)
    driver = _submit(spark_cluster, s3, config, tmp_path, store, "driver",
                     conf={"spark.ui.enabled": "true", "spark.ui.port": str(ui)})
    victim = spark_cluster.workers[1]
    try:
        _wait_for_a_commit(store, driver)
        wait_for(lambda: _driver_api(ui, "applications") is not None, "the driver's REST API")
        [app] = [a["id"] for a in _driver_api(ui, "applications")]
        [executor] = [e.name for e in (spark_cluster.base_dir / "worker1" / app).iterdir()]

        def running_on_victim() -> int:
            executors = _driver_api(ui, f"applications/{app}/executors") or []
            return sum(e["activeTasks"] for e in executors if e["id"] == executor)

        def failed_tasks() -> int:
            stages = _driver_api(ui, f"applications/{app}/stages") or []
            return sum(stage["numFailedTasks"] for stage in stages)

        # Frozen, the worker's executor holds every task it is given: the kill then hits a
        # running task instead of landing between two batches.
        victim.pause()
        anyio.run(send, config, sent[40:])
        wait_for(lambda: running_on_victim() > 0 or not driver.alive(),
                 f"a task on executor {executor}, on worker 1")
        assert driver.alive(), driver.tail()
        victim.kill()  # kill -9 of the Worker and its executor JVM
        wait_for(lambda: failed_tasks() > 0, f"the tasks of executor {executor} lost with it")
        _wait_until_done(store, driver, activemq, "worker")  # retried on worker 0
    finally:
        driver.stop()
        victim.kill()
        spark_cluster.restart_dead_workers()  # the cluster as the next test expects it
    _counted_once(store, sent)


def test_kill_9_of_the_broker_while_acks_are_lost_the_source_reconnects_and_counts_each_once(
        s3: S3Server, s3_folder: Path, spark_cluster: SparkCluster,
        tmp_path: Path) -> None:
    journal = s3.filesystem()
    with private_brokers("activemq") as [broker]:  # its own: the session's is never killed
        config, store = _prepared(broker, tmp_path, s3_folder, "broker")
        sent = orders(ORDERS)
        anyio.run(send, config, sent[:40])
        driver = _submit(spark_cluster, s3, config, tmp_path, store, "driver")
        try:
            wait_for(lambda: bool(journal.find("mdb/journal/broker-totals"))  # type: ignore[attr-defined]
                     or not driver.alive(), "the receiver's first journal segment", timeout=300)
            assert driver.alive(), driver.tail()
            # With the object store hung, what the receiver takes now waits behind a journal
            # write, unacked, and the kill loses those acks. Once the store answers,
            # they are journaled; the broker, restarted (same port and data directory),
            # delivers them again, flagged redelivered, and the receiver must skip them.
            s3.pause()
            anyio.run(send, config, sent[40:50])
            broker.kill()
            broker.start()
            s3.resume()
            anyio.run(send, config, sent[50:])
            _wait_until_done(store, driver, broker, "broker")
        finally:
            s3.resume()
            driver.stop()
    _counted_once(store, sent)
