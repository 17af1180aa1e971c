"""Throughput of the ``mdb`` source against a hand-written stomp.py consumer, side by side in
one run on one private ActiveMQ (reference config): N messages already waiting on a 3-member
topic, which keeps a copy for each of two subscriptions.

* ``stomp.py``: one connection, the three members' subscription queues with ``ack:client`` and
  ``activemq.prefetchSize`` = PREFETCH, every message acked from the listener thread: the
  broker's pace for a client-ack consumer here.
* ``mdb source``: the ``mdb`` format → a ``noop`` sink, ``local[2]``, 500 ms trigger, from the
  query's start until every row was processed (receive + journal fsync + transacted ack +
  Spark batches).

    .venv/bin/python -m tests.spark.bench_source [N] [PREFETCH]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import stomp

import mdb_spark
from mdb.config.settings import load_settings
from mdb.routing.producer import Producer
from tests.harness.servers.activemq import ActiveMQ

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MEMBERS = 3


def bench_settings(broker: ActiveMQ, *topics: str) -> dict[str, Any]:
    """Settings of app ``bench`` on the one broker, each of ``topics`` a topic with MEMBERS
    members (virtual topics ``<topic>_p<i>``)."""
    return {"app": "bench", "brokers": {"a": {"url": broker.url}},
            "destinations": {f"topic:{topic}": {"members": [
                {"broker": "a", "name": f"{topic}_p{i}"} for i in range(MEMBERS)]}
                for topic in topics}}


def subscription_queues(topic: str, name: str) -> list[str]:
    """The queues of app ``bench``'s subscription ``name`` to ``topic``, one a member."""
    return [f"Consumer.bench-{name}.VirtualTopic.{topic}_p{i}" for i in range(MEMBERS)]


def client_ack_consumer(broker: ActiveMQ, queues: list[str], prefetch: str,
                        acked: Callable[[Any], None]) -> stomp.Connection:
    """A plain stomp.py connection on ``queues`` with ``ack:client`` and
    ``activemq.prefetchSize`` = ``prefetch`` that acks every message from its listener thread,
    then hands the frame to ``acked``."""
    connection = stomp.Connection([(broker.host, broker.port)], heartbeats=(0, 0))

    class Acker(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            connection.ack(frame.headers["ack"] if "ack" in frame.headers
                           else frame.headers["message-id"], frame.headers["subscription"])
            acked(frame)

    connection.set_listener("acker", Acker())
    connection.connect("mdb", broker.password, wait=True)
    for index, queue in enumerate(queues):
        connection.subscribe(f"/queue/{queue}", id=str(index), ack="client",
                             headers={"activemq.prefetchSize": prefetch})
    return connection


def local_spark() -> SparkSession:
    """The benchmarks' Spark: ``local[2]``, no UI or progress bars, ``mdb`` registered."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    mdb_spark.register(spark)
    return spark


def stomp_consumer(broker: ActiveMQ, queues: list[str], count: int, prefetch: str) -> float:
    """Seconds for a plain stomp.py client-ack consumer to take ``count`` messages (from its
    CONNECT)."""
    done = threading.Event()
    taken = 0

    def count_one(_frame: Any) -> None:
        nonlocal taken
        taken += 1
        if taken >= count:
            done.set()

    began = time.monotonic()
    connection = client_ack_consumer(broker, queues, prefetch, count_one)
    if not done.wait(600):
        raise RuntimeError(f"stomp.py consumer took {taken} of {count} in 600 s")
    elapsed = time.monotonic() - began
    connection.disconnect()
    return elapsed


def mdb_source(options: dict[str, str], count: int, work: str) -> float:
    """Seconds for the ``mdb`` source to bring ``count`` rows through a ``noop`` sink."""
    spark = local_spark()
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
    return elapsed


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    prefetch = sys.argv[2] if len(sys.argv) > 2 else "100"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = tempfile.mkdtemp(prefix="mdb-spark-bench-")
    with ActiveMQ() as broker:
        settings = bench_settings(broker, "orders")
        options = {"settings": json.dumps(settings), "destination": "topic:orders",
                   "journal": f"{work}/journal", "prefetch": prefetch, "name": "spark"}
        mdb_spark.create_subscriptions(options)
        mdb_spark.create_subscriptions({**options, "name": "stomppy"})

        async def publish() -> None:
            async with Producer(load_settings(None, **settings)) as producer:
                body = json.dumps({"region": "eu", "amount": 12.5, "note": "x" * 100})
                for _ in range(count):
                    await producer.send("topic:orders", body)

        anyio.run(publish)
        plain = stomp_consumer(broker, subscription_queues("orders", "stomppy"), count, prefetch)
        source = mdb_source(options, count, work)
    print(f"| consumer | messages | prefetch | seconds | rows/s |\n|---|---|---|---|---|\n"
          f"| stomp.py client-ack | {count} | {prefetch} | {plain:.1f} | {count / plain:,.0f} |\n"
          f"| mdb source → noop | {count} | {prefetch} | {source:.1f} | {count / source:,.0f} |\n"
          f"ratio mdb/stomp.py: {plain / source:.2f}")


if __name__ == "__main__":
    main()
