"""The driver-side receiver: moves messages from every member into its journal.

It runs in Spark's long-lived driver-side Python process (where ``latestOffset``, ``partitions``
and ``commit`` run), on a private event loop thread, one task per member:

    receive (up to ``prefetch`` already pushed) → drop redeliveries of journaled messages →
    append the rest to the member's journal (fsync) → publish the journal's new end for
    ``latestOffset`` → ack them all in one broker transaction, while the next batch that has
    arrived is journaled (one fsync and one COMMIT per batch, never waiting for more).

Acking right after the journal write, not in Spark's ``commit`` (which lags a batch), keeps the
broker's prefetch window moving. A message whose ack was lost (crash, dropped connection,
rolled-back commit) comes back from the broker flagged redelivered and is recognised by its id
and body digest; a message that only shares an id with a journaled one is journaled too. A
member whose broker is down is reconnected as the container reconnects
(``BrokerLink.connection``: the broker's ``reconnect_delay`` doubling up to
``reconnect_max_delay``, with jitter) while the other members go on. Every message is taken
from the member's shared subscription, so several Spark queries (or mdb listeners) of one app
split the messages between them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.to_thread
from anyio.from_thread import BlockingPortal, start_blocking_portal
from anyio.streams.memory import MemoryObjectReceiveStream

from mdb.config.settings import Settings
from mdb.errors import ConnectionLost, MdbError
from mdb.messages.identity import Seal, identity
from mdb.messages.topology import Member
from mdb.routing.brokers import Brokers
from mdb.routing.links import backed_off
from mdb.seam.broker import Connection, Delivery, Subscription, SubscriptionRequest
from mdb_spark.journal import Journal, Record

log = logging.getLogger("mdb_spark")

_BACKPRESSURE_POLL = 0.05


def record_of(delivery: Delivery, seal: Seal, *, assigned: bool) -> Record:
    """``delivery`` as a journal keeps it, known by its identity (``mdb.messages.identity``: its
    proof checked with ``seal``; ``assigned`` is ``Capabilities.assigned_ids``)."""
    stamp = delivery.headers.get("timestamp", "")
    timestamp_ms = int(stamp) if stamp.isdigit() else int(time.time() * 1000)
    return Record(identity(delivery, seal, assigned=assigned).key, delivery.body,
                  dict(delivery.headers), delivery.broker_redelivered, timestamp_ms)


class Receiver:
    """Receives every member of one destination into its journal until ``stop``."""

    def __init__(self, settings: Settings, members: dict[str, Member],
                 journals: dict[str, Journal], *, subscription: str | None, prefetch: int,
                 max_journal_messages: int) -> None:
        self._settings = settings
        self._brokers = Brokers(settings)
        self._members = members
        self._journals = journals
        self._subscription = subscription
        self._prefetch = prefetch
        self._max_journal = max_journal_messages
        self._lock = threading.Lock()
        self._ends = {key: journal.end for key, journal in journals.items()}
        self._taken = {key: journal.start for key, journal in journals.items()}
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._future: Future[Any] | None = None

    def start(self) -> None:
        self._portal_cm = start_blocking_portal()
        portal = self._portal_cm.__enter__()
        self._future = portal.start_task_soon(self._run)

    def ends(self) -> dict[str, int]:
        """Each member's journal end: everything before it is durable."""
        with self._lock:
            return dict(self._ends)

    def taken(self, ends: dict[str, int]) -> None:
        """Spark planned a batch reading each member's journal up to ``ends``: those records
        no longer count against ``max_journal_messages``."""
        with self._lock:
            for key, end in ends.items():
                if key in self._taken:
                    self._taken[key] = max(self._taken[key], end)

    def stop(self) -> None:
        if self._future is not None:
            self._future.cancel()
        if self._portal_cm is not None:
            try:
                self._portal_cm.__exit__(None, None, None)
            except Exception:  # the cancelled task's own error; nothing is left to clean
                log.debug("mdb_spark receiver stopped", exc_info=True)
        self._portal_cm = self._future = None

    async def _run(self) -> None:
        async with anyio.create_task_group() as tasks:
            for key in self._members:
                tasks.start_soon(self._member, key)

    async def _member(self, key: str) -> None:
        member = self._members[key]
        broker = self._settings.brokers[member.broker]
        try:
            link = self._brokers.link(
                member.broker, f"{self._settings.app}.{self._settings.server}.spark")
        except MdbError as exc:  # no adapter for the URL: retrying cannot help
            log.error("mdb_spark member %s: %s", key, exc)
            return
        request = SubscriptionRequest(destination=member.destination, name=self._subscription,
                                      durable=True, selector=None, prefetch=self._prefetch)
        delay = broker.reconnect_delay  # after a failure on an open connection
        try:
            while True:
                try:
                    connection = await link.connection()
                    subscription = await connection.subscribe(request)
                    delay = broker.reconnect_delay
                    await self._pump(key, connection, subscription)
                except* ConnectionLost as lost:
                    log.warning("mdb_spark member %s: connection lost (%s); reconnecting",
                                key, lost.exceptions[0])
                except* MdbError as failed:
                    error = failed.exceptions[0]
                    # A refused subscription or a rolled-back commit: start again on a new
                    # connection, which hands what was not acked back to the broker.
                    log.warning("mdb_spark member %s: %s: %s; retrying in %gs",
                                key, type(error).__name__, error, delay)
                    await link.close()
                    await anyio.sleep(delay)
                    delay = backed_off(delay, broker)
        finally:
            await link.close()

    async def _pump(self, key: str, connection: Connection, subscription: Subscription) -> None:
        """Journal what has arrived, one batch at a time, while the batch before is acked:
        the journal's fsync overlaps the broker's COMMIT round trip. A batch is acked only
        after it is journaled; one that was journaled but not acked when the connection
        failed comes back flagged redelivered and is skipped then."""
        journaled, to_ack = anyio.create_memory_object_stream[list[Delivery]](1)
        assigned = (await connection.capabilities()).assigned_ids
        async with anyio.create_task_group() as stages:
            stages.start_soon(self._acknowledge, connection, to_ack)
            async with journaled:
                while True:
                    await self._room(key)
                    batch = [await subscription.receive()]
                    while len(batch) < self._prefetch:
                        more = subscription.receive_nowait()
                        if more is None:
                            break
                        batch.append(more)
                    await self._journal(key, batch, assigned)
                    await journaled.send(batch)

    @staticmethod
    async def _acknowledge(connection: Connection,
                           batches: MemoryObjectReceiveStream[list[Delivery]]) -> None:
        """Ack each journaled batch in one broker transaction, in order."""
        async with batches:
            async for batch in batches:
                transaction = await connection.begin()
                for delivery in batch:
                    await transaction.ack(delivery)
                await transaction.commit()

    async def _journal(self, key: str, batch: list[Delivery], assigned: bool) -> None:
        journal = self._journals[key]
        fresh: list[Record] = []
        for delivery in batch:
            record = record_of(delivery, self._brokers.seal, assigned=assigned)
            if delivery.broker_redelivered and journal.holds(record):
                # Provably this message again (its ack was lost): same id, same body, and the
                # broker says it delivered it before. Anything less is journaled, even a
                # repeated id: a drop would be silent, a doubled row can be seen.
                log.info("mdb_spark member %s: %s redelivered, already journaled; acked",
                         key, record.message_id)
                continue
            fresh.append(record)
        if not fresh:
            return
        append: Callable[[list[Record]], int] = journal.append
        end = await anyio.to_thread.run_sync(append, fresh)
        with self._lock:
            self._ends[key] = end

    async def _room(self, key: str) -> None:
        """Hold receiving while the journal holds ``max_journal_messages`` that no batch has
        taken (Spark is behind): the broker keeps the rest. Not counting from the commit:
        Spark commits a batch only when it starts the next, and a batch that took all the
        receiver may hold would leave nothing new to start one."""
        journal = self._journals[key]
        while journal.end - self._taken_until(key) >= self._max_journal:
            await anyio.sleep(_BACKPRESSURE_POLL)

    def _taken_until(self, key: str) -> int:
        with self._lock:
            return max(self._taken[key], self._journals[key].start)


def create_subscriptions(settings: Settings, members: dict[str, Member],
                         subscription: str | None, prefetch: int = 1) -> dict[str, str]:
    """Create the source's shared subscription on every member now, so that messages sent
    from now on are kept for it even before the query first runs (a topic keeps nothing for
    a subscription that does not exist yet). Returns each member's outcome; a member whose
    broker is down is reported, not raised."""

    brokers = Brokers(settings)

    async def one(key: str, outcome: dict[str, str]) -> None:
        member = members[key]
        try:
            link = brokers.link(member.broker, f"{settings.app}.{settings.server}.spark-setup")
            connection = await link.connect()
            try:
                subscription_ = await connection.subscribe(SubscriptionRequest(
                    destination=member.destination, name=subscription, durable=True,
                    selector=None, prefetch=prefetch))
                await subscription_.close()
            finally:
                await link.close()
            outcome[key] = "created"
        except MdbError as exc:
            outcome[key] = f"failed: {type(exc).__name__}: {exc}"

    async def every() -> dict[str, str]:
        outcome: dict[str, str] = {}
        async with anyio.create_task_group() as tasks:
            for key in members:
                tasks.start_soon(one, key, outcome)
        return outcome

    return anyio.run(every)
