"""The whole example on this machine: the mdb container with the totals listener, the Spark
job in local mode, and 60 demo orders, on an ActiveMQ you name.

    python -m examples.spark_orders.pipeline --broker stomp+activemq://USER:PW@HOST:61613

(``--keep DIR`` keeps its files: the journal, the checkpoint, the parquet table;
``examples/spark_orders/run`` in a checkout starts a private ActiveMQ for it.) Spark's Python
workers run in their own processes, so the embedded ``memory://`` broker (which lives inside
one process) cannot be used: the example needs a real broker.
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
from typing import Any

import anyio

import mdb_spark
from mdb import Producer, load_settings

ROOT = Path(__file__).resolve().parents[2]
REGIONS = ("eu", "us", "apac")
TOML = """app = "spark_orders"

[brokers.a]
url = "{url}"

[destinations."topic:orders"]
members = [{{ broker = "a", name = "orders_p0" }}, {{ broker = "a", name = "orders_p1" }},
           {{ broker = "a", name = "orders_p2" }}]
"""

# Errors only. PySpark's gateway's logger is set too: Spark takes the level of the class that
# starts an interpreter's logging as the console's, WARN unless configured, and says so.
LOG4J2 = """rootLogger.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
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
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", required=True,
                        help="an ActiveMQ STOMP URL, stomp+activemq://USER:PW@HOST:61613")
    parser.add_argument("--keep", help="a directory for the journal, checkpoint and parquet, "
                                       "kept (default: a temporary one, deleted at the end)")
    parser.add_argument("--orders", type=int, default=60)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        run(args.broker, Path(args.keep), args.orders)
    else:
        with tempfile.TemporaryDirectory(prefix="spark-orders-") as work:
            run(args.broker, Path(work), args.orders)


def run(url: str, work: Path, count: int) -> None:
    """The pipeline on the broker at ``url``, its files in ``work``: the totals as they
    arrive, then the parquet table."""
    config = work / "mdb.toml"
    config.write_text(TOML.format(url=url))
    container = None
    spark = query = None
    try:
        outcome = mdb_spark.create_subscriptions(
            {"config": str(config), "destination": "topic:orders", "name": "totals"})
        failed = {member: why for member, why in outcome.items() if why != "created"}
        if failed:
            sys.exit(f"cannot subscribe: {failed}")
        print(f"subscription 'totals' on the {len(outcome)} members of topic:orders", flush=True)
        container = subprocess.Popen(
            [sys.executable, "-m", "mdb.commands.cli", "run", "examples.spark_orders.listeners",
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

        print("starting Spark (local[2])...", flush=True)
        # Quiet: errors only from the JVM's start on (setLogLevel comes too late for the
        # start-up warnings), and no stage progress bars among the totals.
        (work / "log4j2.properties").write_text(LOG4J2)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: no hostname warning
        spark = (SparkSession.builder.master("local[2]").appName("spark_orders")
                 .config("spark.driver.extraJavaOptions",
                         f"-Dlog4j2.configurationFile=file:{work / 'log4j2.properties'}")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        output = work / "totals.parquet"
        query = start(spark, config=str(config), journal=str(work / "journal"),
                      output=str(output), checkpoint=str(work / "checkpoint"))
        anyio.run(send, config, orders(count))
        print(f"sent {count + 1} orders to topic:orders (3 members)", flush=True)
        deadline = time.monotonic() + 180
        while len(printed) < wanted and time.monotonic() < deadline:
            time.sleep(0.2)
        rows = spark.read.parquet(str(output)).orderBy("start", "region").collect()
        print(f"\nthe parquet table:\n{table(rows)}", flush=True)
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


def table(rows: list[Any]) -> str:
    """The totals as a small text table: one line per window and region."""
    lines = [f"{'window':<12} {'region':<7} {'orders':>6} {'amount':>9}"]
    lines += [f"{str(r['start'])[11:16]}-{str(r['end'])[11:16]:<6} {r['region']:<7} "
              f"{r['orders']:>6} {r['amount']:>9.2f}" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
