"""The whole example on this machine: a private ActiveMQ (or ``--broker URL``), the mdb
container with the totals listener, the Spark job in local mode, and 60 demo orders.

    examples/spark_orders/run [--broker stomp+activemq://127.0.0.1:61613] [--keep DIR]

Spark's Python workers run in their own processes, so the embedded ``memory://`` broker
(which lives inside one process) cannot be used: the example needs a real broker.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio

import mdb_spark
from mdb.producer import Producer
from mdb.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
REGIONS = ("eu", "us", "apac")
TOML = """app = "spark_orders"

[brokers.a]
url = "{url}"

[destinations."topic:orders"]
members = [{{ broker = "a", name = "orders_p0" }}, {{ broker = "a", name = "orders_p1" }},
           {{ broker = "a", name = "orders_p2" }}]
"""


def orders(count: int) -> list[dict[str, object]]:
    """``count`` orders spread over two minutes of event time, then one far later: it moves
    the watermark past both windows, so Spark emits their totals."""
    base = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    made: list[dict[str, object]] = [
        {"id": f"o-{i}", "region": REGIONS[i % 3], "amount": 10.0 + i,
         "event_time": (base + timedelta(seconds=2 * i)).isoformat()} for i in range(count)]
    made.append({"id": "o-closing", "region": "eu", "amount": 0.0,
                 "event_time": (base + timedelta(minutes=10)).isoformat()})
    return made


async def send(config: Path, batch: list[dict[str, object]]) -> None:
    async with Producer(load_settings(config)) as producer:
        for order in batch:
            await producer.send("topic:orders", order, key=str(order["id"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--broker", help="an ActiveMQ STOMP URL (default: start a private one)")
    parser.add_argument("--keep", help="a directory for the journal, checkpoint and parquet")
    parser.add_argument("--orders", type=int, default=60)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(args.keep or tempfile.mkdtemp(prefix="spark-orders-"))
    work.mkdir(parents=True, exist_ok=True)
    broker = None
    if args.broker is None:
        from tests.harness.activemq import ActiveMQ

        print("starting a private ActiveMQ...", flush=True)
        broker = ActiveMQ(work / "activemq")
        broker.start()
    url = args.broker or str(broker.url if broker else "")
    config = work / "mdb.toml"
    config.write_text(TOML.format(url=url))
    container = None
    spark = query = None
    try:
        outcome = mdb_spark.create_subscriptions(
            {"config": str(config), "destination": "topic:orders", "name": "totals"})
        print(f"subscriptions: {outcome}", flush=True)
        container = subprocess.Popen(
            [sys.executable, "-m", "mdb.cli", "run", "examples.spark_orders.listeners",
             "--config", str(config)], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        wanted = len(REGIONS) * 2
        printed: list[str] = []

        def echo() -> None:
            assert container is not None and container.stdout is not None
            for line in container.stdout:
                if line.startswith("totals:"):
                    printed.append(line)
                    print(line, end="", flush=True)

        threading.Thread(target=echo, daemon=True).start()

        from pyspark.sql import SparkSession

        from examples.spark_orders.job import start

        spark = (SparkSession.builder.master("local[2]").appName("spark_orders")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        output = work / "totals.parquet"
        query = start(spark, config=str(config), journal=str(work / "journal"),
                      output=str(output), checkpoint=str(work / "checkpoint"))
        anyio.run(send, config, orders(args.orders))
        print(f"sent {args.orders + 1} orders to topic:orders (3 members)", flush=True)
        deadline = time.monotonic() + 180
        while len(printed) < wanted and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"\nparquet at {output}:", flush=True)
        spark.read.parquet(str(output)).orderBy("start", "region").show(truncate=False)
        if len(printed) < wanted:
            sys.exit(f"only {len(printed)} of {wanted} totals arrived")
    finally:
        if query is not None:
            query.stop()
        if spark is not None:
            spark.stop()
        if container is not None:
            container.terminate()
            container.wait()
        if broker is not None:
            broker.close()


if __name__ == "__main__":
    main()
