"""The pipeline example on a real standalone cluster: a master and two workers (their own
JVMs, executors and Python workers), submitted with ``spark-submit --master spark://…`` and
``--py-files`` of this checkout's mdb, the source's journal on an S3 server (moto) through
s3fs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

import mdb_spark
from examples.spark_orders.pipeline import orders, send
from tests.harness.spark_cluster import Daemon, S3Server, SparkCluster, shipped_code
from tests.spark.conftest import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.activemq]

ROOT = Path(__file__).resolve().parents[2]
ORDERS = 60  # over two one-minute windows, then a later order that closes both
TOML = """app = "{app}"

[brokers.a]
url = "{url}"

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


def _submit(cluster: SparkCluster, s3: S3Server, config: Path, work: Path, name: str) -> Daemon:
    return cluster.submit(
        ROOT / "examples" / "spark_orders" / "job.py",
        ["--config", str(config), "--journal", "s3://mdb/journal", "--output",
         str(work / "totals"), "--checkpoint", str(work / "checkpoint")],
        py_files=shipped_code(ROOT, work / "mdb.zip"), env=s3.env, log=work / f"{name}.log")


def _prepared(activemq: Any, work: Path, app: str) -> Path:
    """The example's settings for ``app`` (its own subscription and member queues), with the
    subscriptions created before anything is sent."""
    config = work / "mdb.toml"
    config.write_text(TOML.format(url=activemq.url, app=app))
    outcome = mdb_spark.create_subscriptions(
        {"config": str(config), "destination": "topic:orders", "name": "totals"})
    assert set(outcome.values()) == {"created"}
    return config


def _counted_once(work: Path, sent: list[dict[str, Any]]) -> None:
    """Each order is counted once in the parquet totals: none lost, none doubled."""
    totals = _totals(work / "totals")
    counted = Counter[str]()
    for row in totals:
        counted[row["region"]] += row["orders"]
    assert counted == Counter(str(o["region"]) for o in sent[:ORDERS])
    assert len({(r["region"], r["start"]) for r in totals}) == len(totals) == 6


def _wait_for_totals(work: Path, driver: Daemon) -> None:
    try:
        wait_for(lambda: sum(r["orders"] for r in _totals(work / "totals")) >= ORDERS
                 or not driver.alive(), f"totals of {ORDERS} orders", timeout=300)
        assert driver.alive(), driver.tail()
    finally:
        driver.stop()


def test_the_example_on_a_standalone_cluster_counts_each_order_once(
        activemq: Any, s3: S3Server, spark_cluster: SparkCluster, tmp_path: Path) -> None:
    config = _prepared(activemq, tmp_path, "cluster")
    sent = orders(ORDERS)
    anyio.run(send, config, sent)

    _wait_for_totals(tmp_path, _submit(spark_cluster, s3, config, tmp_path, "driver"))
    _counted_once(tmp_path, sent)
    journal = s3.filesystem().find("mdb/journal/cluster-totals")  # type: ignore[attr-defined]
    assert any("/a_topic_cluster_p" in path for path in journal), journal
    # Executors ran on both workers, in their own processes.
    for index in range(2):
        assert list((spark_cluster.base_dir / f"worker{index}").glob("app-*/*/stderr"))


def test_kill_9_of_the_driver_and_resubmit_from_the_checkpoint_counts_each_order_once(
        activemq: Any, s3: S3Server, spark_cluster: SparkCluster, tmp_path: Path) -> None:
    config = _prepared(activemq, tmp_path, "killed")
    sent = orders(ORDERS)
    anyio.run(send, config, sent[:40])
    commits, fs = tmp_path / "checkpoint" / "commits", s3.filesystem()

    driver = _submit(spark_cluster, s3, config, tmp_path, "driver")
    try:
        wait_for(lambda: (commits.is_dir() and any(commits.glob("[0-9]*")))
                 or not driver.alive(), "a committed batch", timeout=300)
        assert driver.alive(), driver.tail()
        anyio.run(send, config, sent[40:50])
    finally:
        driver.kill()  # kill -9 of the driver's process group: its Python and its JVM
    assert sum(r["orders"] for r in _totals(tmp_path / "totals")) == 0  # windows still open
    assert fs.find("mdb/journal/killed-totals")  # type: ignore[attr-defined]

    anyio.run(send, config, sent[50:])
    _wait_for_totals(tmp_path, _submit(spark_cluster, s3, config, tmp_path, "resubmitted"))
    _counted_once(tmp_path, sent)
