"""The sink: ``df.writeStream.format("mdb")`` and ``foreach_batch_sink`` for ``foreachBatch``.

Each Spark task publishes its partition's rows inside broker transactions (one per broker,
committed every ``rows_per_transaction`` rows and at the end). Every message carries a
deterministic ``mdb_id`` = ``<query>-<batch>-<partition>-<row>``: when Spark replays a batch
after a failure, the same rows go out again under the same ids, so a consumer recognises the
repeat (a listener can deduplicate on ``ctx.id``). Delivery is therefore at-least-once with
recognisable repeats, i.e. effectively once for a consumer that deduplicates.

Rows: ``body`` (binary or string, required), ``headers`` (map<string,string>, optional) and
``key`` (string, optional: picks the member of a distributed destination, as ``Producer``'s key
does; without it the id picks, so a replay goes to the same member). A member whose broker
cannot be reached is failed over as ``Producer`` does (``Brokers.failover``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage, labelled
from mdb.messages.topology import Member
from mdb.routing.brokers import Brokers
from mdb.routing.links import BrokerLink
from mdb.seam.broker import Transaction
from mdb_spark.options import Connect, SinkOptions

BATCH_HEADER = "mdb_spark_batch"  # the Spark batch id, on every message the sink sends
_BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark's micro-batch execution


@dataclass(frozen=True)
class Published(WriterCommitMessage):  # type: ignore[misc]
    partition: int
    rows: int


def message_id(query: str, batch: int, partition: int, row: int) -> str:
    return f"{query}-{batch}-{partition}-{row}"


class MdbStreamWriter(DataSourceStreamWriter):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self._sink = SinkOptions.parse(options)

    def write(self, iterator: Iterator[Any]) -> Published:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("mdb sink: write() must run in a Spark task")
        batch_id = context.getLocalProperty(_BATCH_ID_PROPERTY)
        if batch_id is None:
            raise RuntimeError("mdb sink: Spark did not say which micro-batch this is "
                               f"(local property {_BATCH_ID_PROPERTY}); use foreach_batch_sink")
        partition = context.partitionId()
        rows = publish(self._sink, iterator, int(batch_id), partition)
        return Published(partition, rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Each task committed its own transactions; nothing is left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Committed transactions cannot be taken back: the replay repeats their ids."""


def foreach_batch_sink(destination: str, *, config: str | None = None,
                       settings: Mapping[str, Any] | None = None, app: str | None = None,
                       query: str = "spark", rows_per_transaction: int = 500,
                       ) -> Callable[[Any, int], None]:
    """A function for ``writeStream.foreachBatch``: publishes each batch's rows like the
    ``mdb`` sink (same columns, same deterministic ids)."""
    import json

    options = {"destination": destination, "query": query,
               "rows_per_transaction": str(rows_per_transaction)}
    if config:
        options["config"] = config
    if settings is not None:
        options["settings"] = json.dumps(settings)
    if app:
        options["app"] = app
    sink = SinkOptions.parse(options)

    def publish_batch(frame: Any, batch_id: int) -> None:
        def publish_partition(rows: Iterator[Any]) -> None:
            context = TaskContext.get()
            partition = context.partitionId() if context is not None else 0
            publish(sink, rows, batch_id, partition)

        frame.foreachPartition(publish_partition)

    return publish_batch


def publish(sink: SinkOptions, rows: Iterable[Any], batch: int, partition: int) -> int:
    """Publish ``rows`` (Spark ``Row`` objects or mappings); return how many."""
    outgoing = [(_message(sink, row, batch, partition, index), _key(row))
                for index, row in enumerate(rows)]
    if not outgoing:
        return 0
    anyio.run(_publish, sink.connect, sink, outgoing)
    return len(outgoing)


def _field(row: Any, name: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(name)
    fields = getattr(row, "__fields__", ())
    return row[name] if name in fields else None


def _key(row: Any) -> str | None:
    key = _field(row, "key")
    return None if key is None else str(key)


def _message(sink: SinkOptions, row: Any, batch: int, partition: int,
             index: int) -> OutgoingMessage:
    body = _field(row, "body")
    if body is None:
        raise ValueError("mdb sink: every row needs a non-null 'body' column (binary or string)")
    data, content_type = codec.encode(bytes(body) if isinstance(body, bytearray) else body)
    headers = {**labelled(dict(_field(row, "headers") or {}), content_type),
               ID: message_id(sink.query, batch, partition, index), BATCH_HEADER: str(batch)}
    return OutgoingMessage(data, headers)


async def _publish(connect: Connect, sink: SinkOptions,
                   outgoing: list[tuple[OutgoingMessage, str | None]]) -> None:
    settings = connect.settings()
    brokers = Brokers(settings)
    destination = Destination.parse(sink.destination)
    transactions = _Transactions(brokers, f"{settings.app}.{settings.server}.spark-sink")
    try:
        pending = 0
        for unsealed, key in outgoing:
            sealed = brokers.seal.sealed(unsealed)  # proven, as every message mdb sends

            async def send(member: Member, message: OutgoingMessage = sealed) -> None:
                transaction = await transactions.on(member.broker)
                await transaction.send(member.destination, message)

            await brokers.failover(destination, send, key=key or sealed.headers[ID])
            pending += 1
            if pending >= sink.rows_per_transaction:
                await transactions.commit()
                pending = 0
        await transactions.commit()
    finally:
        await transactions.close()


class _Transactions:
    """One open transaction per broker, each on its own link."""

    def __init__(self, brokers: Brokers, client_id: str) -> None:
        self._brokers = brokers
        self._client_id = client_id
        self._links: dict[str, BrokerLink] = {}
        self._open: dict[str, Transaction] = {}

    async def on(self, broker: str) -> Transaction:
        """The open transaction on ``broker``, begun (and connected) if there is none; raises
        ConnectionFailed or ConnectionLost."""
        if broker not in self._open:
            link = self._links.get(broker)
            if link is None:
                link = self._links[broker] = self._brokers.link(broker, self._client_id)
            self._open[broker] = await (await link.connect()).begin()
        return self._open[broker]

    async def commit(self) -> None:
        """Commit every open transaction. A failure raises: Spark retries the task, and the
        repeat carries the same ids."""
        while self._open:
            _, transaction = self._open.popitem()
            await transaction.commit()

    async def close(self) -> None:
        """Abort what is still open and close the connections."""
        for transaction in self._open.values():
            await transaction.abort()
        for link in self._links.values():
            await link.close()
