"""Exactly-once listeners with ``max_messages_per_transaction`` (docs/exactly-once.md,
"Batches"): a slot's batch runs in one database transaction, with one claim statement and one
outbox statement; a failure of one message keeps nothing of the batch and runs it again one
message at a time; copies and reused identities in a batch are told apart as alone.

A slot's batch is what its subscription already holds: the slot is kept busy with a gate
message while a batch's messages are sent (as in ``test_batches``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Container, Context, Redelivery, listener
from mdb.errors import DatabaseUnavailable
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.guard import Guard
from mdb.exactly_once.store import Store
from mdb.listeners.context import SendFunction
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.identity import Seal
from mdb.messages.message import Message, OutgoingMessage
from mdb.routing.producer import Producer
from tests.harness.apps.in_process import (
    Calls,
    dispatched,
    running,
    settings_for,
    unique,
    until,
)
from tests.harness.servers.databases import (
    count,
    database_url,
    orders,
    prepared,
    ran,
    with_database,
)
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.messages import (
    assert_drained,
    read,
    send_bodies,
    send_copies,
    send_foreign,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database of the test's own, SQLite or PostgreSQL, with mdb's tables and the test's."""
    db = await prepared(await database_url(request, tmp_path))
    yield db
    await db.close()


class Gate:
    """Makes what a test sends one batch: a ``gate`` message holds the slot (its handler
    records it in ``calls`` and waits) while the rest is sent, then lets it go once all of it
    reached the slot, so that the slot's next batch holds it."""

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._release = anyio.Event()

    async def held(self, body: str) -> bool:
        """For the handler: whether ``body`` is the gate's message, which returns once the
        batch behind it reached the slot."""
        if body != "gate":
            return False
        self._calls.add("gate", body)
        await self._release.wait()
        return True

    @asynccontextmanager
    async def one_batch(self, container: Container, url: str, queue: str,
                        size: int) -> AsyncIterator[None]:
        """The ``size`` messages sent to ``queue`` inside, as one batch."""
        await send_bodies(url, queue, ["gate"])
        await self._calls.wait(lambda c: bool(c.of("gate")))
        yield
        await dispatched(container, 1 + size)
        self._release.set()


async def effects(database: Database) -> list[str]:
    """Each order's message, once per row written (a row's id is ``<body>/<a count>``)."""
    async with database.session() as session:
        ids = (await session.execute(select(orders.c.id))).scalars().all()
    return sorted(i.split("/")[0] for i in ids)


async def test_a_batch_runs_in_one_transaction_and_each_message_once(
    broker_url: str, database: Database,
) -> None:
    queue, out = f"queue:{unique('eo')}", f"queue:{unique('eo_out')}"
    calls = Calls()
    gate = Gate(calls)
    bodies = [f"o-{n}" for n in range(6)]

    @listener(queue, exactly_once="main", max_messages_per_transaction=10)
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        if await gate.held(body):
            return
        calls.add("transaction", session.info.setdefault("transaction", unique("t")))
        calls.add("ran", body)
        await session.execute(orders.insert().values(id=f"{body}/1", quantity=1))
        await ctx.send(out, f"invoice for {body}")

    async with running(with_database(broker_url, database), handler) as container:
        async with gate.one_batch(container, broker_url, queue, len(bodies)):
            await send_bodies(broker_url, queue, bodies)
        sent = await read(broker_url, out, len(bodies))
        await until(lambda: container.deployed[0].stats.processed == len(bodies) + 1)
    assert calls.of("ran") == bodies
    assert len(set(calls.of("transaction"))) == 1  # one session: one transaction
    assert [d.body for d in sent] == [f"invoice for {b}".encode() for b in bodies]
    assert await effects(database) == bodies
    assert await count(database, tables.inbox) == len(bodies) + 1
    assert await count(database, tables.outbox) == 0
    await assert_drained(broker_url, out)


async def test_a_failure_in_a_batch_keeps_nothing_of_it_and_each_message_runs_once_more_alone(
    broker_url: str, database: Database,
) -> None:
    queue, out = f"queue:{unique('eo')}", f"queue:{unique('eo_out')}"
    calls = Calls()
    gate = Gate(calls)
    bodies = [f"o-{n}" for n in range(5)]

    @listener(queue, exactly_once="main", max_messages_per_transaction=10,
              redelivery=Redelivery(limit=2, delay=0))
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        if await gate.held(body):
            return
        calls.add("ran", (body, ctx.redelivered, ctx.delivery_count))
        await session.execute(orders.insert().values(id=f"{body}/{len(calls.seen)}",
                                                     quantity=1))
        await ctx.send(out, f"invoice for {body}")
        if body == "o-2" and ctx.delivery_count == 1:
            raise ValueError("the third message of the batch fails once")

    async with running(with_database(broker_url, database), handler) as container:
        async with gate.one_batch(container, broker_url, queue, len(bodies)):
            await send_bodies(broker_url, queue, bodies)
        sent = await read(broker_url, out, len(bodies))
        await until(lambda: container.deployed[0].stats.processed == len(bodies) + 1)
    ran = calls.of("ran")
    # The batch up to the failure; then alone: those before it flagged, one count higher,
    # the failing one redelivered as its count says, those after it as they came.
    assert ran[:3] == [("o-0", False, 1), ("o-1", False, 1), ("o-2", False, 1)]
    assert sorted(ran[3:], key=repr) == [("o-0", True, 2), ("o-1", True, 2), ("o-2", True, 2),
                               ("o-3", False, 1), ("o-4", False, 1)]
    assert sorted(d.body for d in sent) == sorted(f"invoice for {b}".encode() for b in bodies)
    assert await effects(database) == bodies  # the batch's writes rolled back, once each
    assert container.deployed[0].stats.redelivered == 1
    await assert_drained(broker_url, out)


async def test_copies_and_reused_identities_in_a_batch_are_told_apart_as_alone(
    broker_url: str, database: Database,
) -> None:
    """The application's own messages (proven with its database's secret: their ``mdb_id``
    is their identity), a copy and an id reused among them."""
    queue, errors = f"queue:{unique('eo')}", f"queue:{unique('eo_errors')}"
    calls = Calls()
    gate = Gate(calls)
    secret = await tables.identity_secret(database.engine)
    assert secret is not None
    seal = Seal(secret)

    @listener(queue, exactly_once="main", max_messages_per_transaction=10,
              error_destination=errors)
    async def handler(body: str, session: AsyncSession) -> None:
        if await gate.held(body):
            return
        await ran(session, calls, body, "/")

    async with running(with_database(broker_url, database), handler) as container:
        await send_bodies(broker_url, queue, ["o-0", "o-1"], seal=seal)
        await calls.wait(lambda c: c.of("ran") == ["o-0", "o-1"])
        async with gate.one_batch(container, broker_url, queue, 5):
            # processed before
            await send_copies(broker_url, queue, b"o-1", "id-o-1", copies=1, seal=seal)
            await send_bodies(broker_url, queue, ["o-2"], seal=seal)
            # reused
            await send_copies(broker_url, queue, b"not o-0", "id-o-0", copies=1, seal=seal)
            # a copy in it
            await send_copies(broker_url, queue, b"o-2", "id-o-2", copies=1, seal=seal)
            await send_bodies(broker_url, queue, ["o-3"], seal=seal)
        moved = await read(broker_url, errors, 1)
        await calls.wait(lambda c: "o-3" in c.of("ran"))
        stats = container.deployed[0].stats
        await until(lambda: stats.already_processed == 2)
    assert calls.of("ran") == ["o-0", "o-1", "o-2", "o-3"]
    assert await effects(database) == ["o-0", "o-1", "o-2", "o-3"]
    assert [m.body for m in moved] == [b"not o-0"]
    assert stats.to_error_destination == 1
    await assert_drained(broker_url, queue)


async def test_a_batch_costs_one_claim_one_outbox_statement_and_one_commit(
    database: Database,
) -> None:
    """What reaches the database for a batch of three: one claim, the handler's writes, the
    delete of the rows dispatched before and one statement for every send of the batch (on
    PostgreSQL one statement for both), one commit, nothing after the dispatch
    (docs/performance.md, "Exactly-once listeners")."""
    statements: list[str] = []
    commits: list[object] = []

    def executing(_connection: object, _cursor: object, statement: str,
                  *_rest: object) -> None:
        if not statement.startswith("BEGIN"):  # SQLite's own, in its transaction
            statements.append(" ".join(statement.split(" ")[:3]))

    async with Producer(settings_for(f"memory://{unique('m')}")) as producer:
        guard = Store(database, producer, "this-process").guard(
            listener="l", subscription="s", broker="default",
            error_destination=Destination.parse("queue:eo.DLQ"))

        def message(body: str) -> Message:
            return Message(f"id-{body}", Destination.parse("queue:eo"), body.encode(), {},
                           redelivered=False, delivery_count=1)

        async def batch(*bodies: str) -> list[Any]:
            async def handler(index: int, session: AsyncSession, send: SendFunction) -> None:
                await session.execute(orders.insert().values(id=bodies[index], quantity=1))
                await send(Destination.parse("queue:eo.out"), OutgoingMessage(
                    bodies[index].encode(), {ID: bodies[index]}), None)
            return await guard.run_all([message(b) for b in bodies], handler,
                                       at=time.time())

        assert await batch("o-0") == [True]  # the first dispatch sweeps what was left before
        event.listen(database.engine.sync_engine, "before_cursor_execute", executing)
        event.listen(database.engine.sync_engine, "commit", commits.append)
        assert await batch("o-1", "o-2", "o-3") == [True, True, True]
        event.remove(database.engine.sync_engine, "before_cursor_execute", executing)
        committed = len(commits)
        async with database.session() as session:  # sent; o-0's row deleted by the batch's run
            left = list((await session.execute(select(tables.outbox.c.message_id).order_by(
                tables.outbox.c.seq))).scalars())
    assert left == ["o-1", "o-2", "o-3"]
    # SQLite's RETURNING keeps no order SQLAlchemy relies on: its outbox rows are written one
    # statement each, in order (in the process: no round trip).
    writes = (["WITH forgotten AS"] if database.engine.dialect.name == "postgresql" else
              ["DELETE FROM mdb_outbox", *["INSERT INTO mdb_outbox"] * 3])
    assert statements == ["INSERT INTO mdb_inbox", "INSERT INTO orders", "INSERT INTO orders",
                          "INSERT INTO orders", *writes]  # the delete: the last run's row
    assert committed == 1


@pytest.mark.rabbitmq
async def test_a_twin_run_again_after_a_failure_in_its_batch_is_not_taken_for_a_copy(
    rabbitmq: BrokerProcess, database: Database,
) -> None:
    """The fall-back runs the messages before a failing one again flagged redelivered, which
    is no evidence of a copy: a twin of a message processed before (RabbitMQ, no id) still goes
    to the error destination, as it does alone (docs/exactly-once.md, "Identity")."""
    url, queue = rabbitmq.url, f"queue:{unique('eo')}"
    errors = f"queue:{unique('eo_errors')}"
    calls = Calls()
    gate = Gate(calls)

    @listener(queue, exactly_once="main", max_messages_per_transaction=10,
              error_destination=errors, redelivery=Redelivery(limit=0))
    async def handler(body: str, session: AsyncSession) -> None:
        if await gate.held(body):
            return
        calls.add("ran", body)
        if body == "poison":
            raise ValueError("never processed")
        await session.execute(orders.insert().values(id=f"{body}/{len(calls.seen)}",
                                                     quantity=1))

    async with running(with_database(url, database), handler) as container:
        await send_foreign(url, queue, [b"add 1"])
        await calls.wait(lambda c: c.of("ran") == ["add 1"])
        async with gate.one_batch(container, url, queue, 2):
            await send_foreign(url, queue, [b"add 1", b"poison"])
        moved = await read(url, errors, 2)
        stats = container.deployed[0].stats
    assert sorted((m.body, m.headers["mdb_error_type"]) for m in moved) == [
        (b"add 1", "mdb.IdentityReused"), (b"poison", "ValueError")]
    assert stats.already_processed == 0
    assert await effects(database) == ["add 1"]


@pytest.mark.rabbitmq
async def test_a_batch_whose_commit_was_in_doubt_knows_its_own_rows_when_run_again(
    rabbitmq: BrokerProcess, database: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch committed, and the database's answer lost: run again one message at a time, its
    messages (RabbitMQ, no ids: known by their content) find the rows of their own first run,
    not another message's: already processed, neither run twice nor taken for twins."""
    url, queue = rabbitmq.url, f"queue:{unique('eo')}"
    calls = Calls()
    gate = Gate(calls)
    run_all = Guard.run_all

    async def answer_lost(self: Guard, messages: Any, handler: Any, *, at: float) -> Any:
        ran = await run_all(self, messages, handler, at=at)
        if len(messages) > 1 and not calls.of("lost"):
            calls.add("lost", len(messages))
            raise DatabaseUnavailable("the answer to the commit was lost")
        return ran

    monkeypatch.setattr(Guard, "run_all", answer_lost)

    @listener(queue, exactly_once="main", max_messages_per_transaction=10)
    async def handler(body: str, session: AsyncSession) -> None:
        if await gate.held(body):
            return
        await ran(session, calls, body, "/")

    bodies = [f"o-{n}" for n in range(3)]
    async with running(with_database(url, database), handler) as container:
        async with gate.one_batch(container, url, queue, len(bodies)):
            await send_foreign(url, queue, [b.encode() for b in bodies])
        stats = container.deployed[0].stats
        await until(lambda: stats.already_processed == len(bodies))
    assert calls.of("lost") == [len(bodies)]
    assert calls.of("ran") == bodies
    assert stats.to_error_destination == 0
    assert await effects(database) == bodies
