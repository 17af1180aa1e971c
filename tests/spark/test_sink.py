"""The ``mdb`` sink on a real ActiveMQ and RabbitMQ: transacted sends with ids that a replayed batch
repeats exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

import mdb_spark
from mdb.messages.destinations import Destination
from mdb.seam.broker import ConnectionOptions, SubscriptionRequest
from mdb.seam.registry import broker_for

pytestmark = [pytest.mark.spark, pytest.mark.activemq]


def _receive(url: str, destination: str, count: int) -> list[tuple[str, str, str]]:
    """(mdb_id, batch header, body) of ``count`` messages from a queue, acked."""

    async def run() -> list[tuple[str, str, str]]:
        connection = await broker_for(ConnectionOptions(url=url, client_id="sink-test")).connect()
        try:
            subscription = await connection.subscribe(SubscriptionRequest(
                Destination.parse(destination), None, durable=False, selector=None, prefetch=1))
            got: list[tuple[str, str, str]] = []
            with anyio.fail_after(60):
                while len(got) < count:
                    delivery = await subscription.receive()
                    got.append((delivery.headers["mdb_id"],
                                delivery.headers[mdb_spark.BATCH_HEADER], delivery.body.decode()))
                    await connection.ack(delivery)
            return got
        finally:
            await connection.close()

    return anyio.run(run)


def _run_once(spark: Any, source: Path, checkpoint: Path, options: dict[str, str]) -> None:
    frame = spark.readStream.schema("id string, region string").json(str(source))
    query = (frame.selectExpr("to_json(struct(*)) as body", "map('region', region) as headers",
                              "region as key")
             .writeStream.format("mdb").options(**options)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()


def test_a_replayed_batch_repeats_the_same_ids(spark: Any, stomp_broker: Any,
                                               tmp_path: Path) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    rows = [{"id": f"o{i}", "region": ["eu", "us", "apac"][i % 3]} for i in range(40)]
    (source / "orders.json").write_text("\n".join(json.dumps(r) for r in rows))
    settings = {"app": "sinktest", "brokers": {"a": {"url": stomp_broker.url}}}
    options = {"settings": json.dumps(settings),
               "destination": "queue:sink_out", "query": "totals", "rows_per_transaction": "7"}

    _run_once(spark, source, checkpoint, options)
    first = _receive(str(stomp_broker.url), "queue:sink_out", len(rows))
    assert {batch for _, batch, _ in first} == {"0"}
    assert len({ident for ident, _, _ in first}) == len(rows)
    assert all(ident.startswith("totals-0-") for ident, _, _ in first)

    # Forget that batch 0 was committed: the restarted query replays it.
    (checkpoint / "commits" / "0").unlink()
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    _run_once(spark, source, checkpoint, options)
    replayed = _receive(str(stomp_broker.url), "queue:sink_out", len(rows))
    assert sorted(replayed) == sorted(first)


def test_foreach_batch_sink_uses_the_same_ids(spark: Any, stomp_broker: Any) -> None:
    settings = {"app": "sinktest", "brokers": {"a": {"url": stomp_broker.url}}}
    publish = mdb_spark.foreach_batch_sink("queue:foreach_out", settings=settings, query="fb")
    frame = spark.createDataFrame([(f"row {i}",) for i in range(10)], "body string")
    publish(frame, 5)
    publish(frame, 5)  # a replay of batch 5
    got = _receive(str(stomp_broker.url), "queue:foreach_out", 20)
    ids = [ident for ident, _, _ in got]
    assert len(set(ids)) == 10 and all(ids.count(i) == 2 for i in ids)
    assert all(ident.startswith("fb-5-") and batch == "5" for ident, batch, _ in got)
