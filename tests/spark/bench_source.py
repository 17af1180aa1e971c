"""Throughput of the ``mdb`` source: N messages already waiting on a 3-member topic (one
private ActiveMQ, reference config) → a ``noop`` sink. Prints rows/s from the query's start
until every row was processed (receive + journal fsync + transacted ack + Spark batches).

    .venv/bin/python -m tests.spark.bench_source [N] [PREFETCH]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import anyio

import mdb_spark
from mdb.producer import Producer
from mdb.settings import load_settings
from tests.harness.activemq import ActiveMQ


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    prefetch = sys.argv[2] if len(sys.argv) > 2 else "100"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = tempfile.mkdtemp(prefix="mdb-spark-bench-")
    with ActiveMQ() as broker:
        settings = {"app": "bench", "brokers": {"a": {"url": broker.url}},
                    "destinations": {"topic:orders": {"members": [
                        {"broker": "a", "name": f"orders_p{i}"} for i in range(3)]}}}
        options = {"settings": json.dumps(settings), "destination": "topic:orders",
                   "journal": f"{work}/journal", "prefetch": prefetch}
        mdb_spark.create_subscriptions(options)

        async def publish() -> None:
            async with Producer(load_settings(None, **settings)) as producer:
                body = json.dumps({"region": "eu", "amount": 12.5, "note": "x" * 100})
                for _ in range(count):
                    await producer.send("topic:orders", body)

        anyio.run(publish)
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        mdb_spark.register(spark)
        began = time.monotonic()
        query = (spark.readStream.format("mdb").options(**options).load()
                 .writeStream.format("noop").option("checkpointLocation", f"{work}/cp")
                 .trigger(processingTime="500 milliseconds").start())
        done = 0
        while done < count:
            query.awaitTermination(0.2)
            done = sum(p["numInputRows"] for p in query.recentProgress)
        elapsed = time.monotonic() - began
        query.stop()
        spark.stop()
    print(f"| messages | prefetch | seconds | rows/s |\n|---|---|---|---|\n"
          f"| {count} | {prefetch} | {elapsed:.1f} | {count / elapsed:,.0f} |")


if __name__ == "__main__":
    main()
