"""Large rows in the outbox (docs/exactly-once.md, "The outbox and large messages"): a sweep
holds one message's body at a time, however many and however large the rows waiting; a body
larger than mdb sends is refused before its row is written, and a row holding one (written
before) goes to its error destination once, without it; the rows behind keep flowing."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdb import Context, EncodeError, Redelivery, listener
from mdb.exactly_once import Outbox, tables
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.outbox import dispatcher as dispatcher_module
from mdb.exactly_once.outbox import writer as writer_module
from mdb.exactly_once.outbox.dispatcher import Dispatcher
from mdb.exactly_once.outbox.writer import Writer
from mdb.messages.destinations import Destination
from mdb.messages.headers import ERROR_MESSAGE, ERROR_TYPE, ID, ORIGINAL_DESTINATION
from mdb.messages.message import OutgoingMessage
from mdb.routing.producer import Producer
from mdb_memory.state import broker_state
from tests.harness.apps.in_process import running, settings_for, unique
from tests.harness.servers.databases import count, database_url, prepared
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.messages import read, send_bodies

pytestmark = pytest.mark.anyio

MiB = 1 << 20


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database of the test's own, SQLite, PostgreSQL or MariaDB, with mdb's tables (their
    body columns: MariaDB's BLOB would stop at 64 KiB)."""
    made = await prepared(await database_url(request, tmp_path))
    yield made
    await made.close()


async def left_by_a_dead_process(database: Database, destination: str, count: int,
                                 size: int) -> list[str]:
    """``count`` rows of ``size`` bytes each, their lease run out (their process died); their
    ids."""
    async with database.session() as session:
        writer = Writer(session, "dead-process", lease=0.0, error_destination=None)
        for n in range(count):
            await writer.send(Destination.parse(destination), OutgoingMessage(
                bytes([n]) * size, {ID: f"id-{n}"}), None)
    return [f"id-{n}" for n in range(count)]


async def test_a_sweep_holds_one_body_at_a_time(database: Database) -> None:
    """40 rows of 1 MiB: a sweep used to read all of them (up to 100) in one statement, whose
    memory grew with the rows (1 GB of them took 705 MB) and which, past the database's
    ``timeout``, never ended in time: the rows were never sent."""
    # A topic nobody subscribes to: the broker keeps nothing of what it is sent, so what the
    # sweep holds is all that is measured.
    ids = await left_by_a_dead_process(database, "topic:nobody", 40, MiB)
    async with Producer(settings_for(f"memory://{unique('m')}")) as producer:
        dispatcher = Dispatcher(database, producer, "live-process")
        tracemalloc.start()
        try:
            sent = await dispatcher.sweep()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert sent == len(ids)
    assert peak < 8 * MiB, f"{peak / MiB:.1f} MiB held by a sweep of 40 rows of 1 MiB"


@pytest.mark.activemq
async def test_a_body_larger_than_brokers_take_fails_its_run_and_the_rows_behind_flow(
        activemq: BrokerProcess, tmp_path: Path) -> None:
    """ActiveMQ refuses a frame past its ``maxFrameSize`` (100 MiB) by dropping the
    connection: the send's outcome is unknown, so a row of 101 MiB was sent again at every
    sweep, for ever (its memory growing each time), and the rows behind it, kept in order,
    never went. mdb now refuses such a body before its row is written: the run fails, like
    any failure of the handler, and the message ends on its error destination."""
    database = await prepared(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")
    url = str(activemq.url)
    queue, out = f"queue:{unique('orders')}", f"queue:{unique('invoices')}"

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=1, delay=0))
    async def on_order(body: str, ctx: Context) -> None:
        await ctx.send(out, b"x" * (101 * MiB) if body == "big" else body.encode())

    try:
        await send_bodies(url, queue, ["big", "o-1", "o-2"])
        async with running(settings_for(url, databases={"main": database.settings}),
                           on_order):
            sent = await read(url, out, 2)
            [moved] = await read(url, f"{queue}.DLQ", 1)
        assert [d.body for d in sent] == [b"o-1", b"o-2"]
        assert (moved.body, moved.headers[ERROR_TYPE]) == (b"big", "mdb.errors.EncodeError")
        assert await count(database, tables.outbox) == 0
    finally:
        await database.close()


async def test_a_row_larger_than_mdb_sends_goes_to_its_error_destination_once_without_it(
        database: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose body is larger than mdb sends, written before mdb refused such bodies (here:
    the bound lowered under it once it was written), would be dropped by a broker's connection
    at every sweep. It goes to its error destination once, without its body, saying why; the
    rows behind it go on."""
    name = unique("m")
    url, state, out = f"memory://{name}", broker_state(name), f"queue:{unique('out')}"
    async with database.session() as session:  # rows a dead process left
        writer = Writer(session, "dead-process", lease=0.0, error_destination=None)
        for mdb_id, body in (("id-big", b"x" * 2048), ("id-1", b"o-1"), ("id-2", b"o-2")):
            await writer.send(Destination.parse(out), OutgoingMessage(body, {ID: mdb_id}), None)
    monkeypatch.setattr(dispatcher_module, "MAX_BODY_BYTES", 1024)
    async with Producer(settings_for(url)) as producer:
        dispatcher = Dispatcher(database, producer, "live-process")
        assert await dispatcher.sweep() == 3
        assert await dispatcher.sweep() == 0
    assert [d.body for d in state.browse(out)] == [b"o-1", b"o-2"]
    [moved] = state.browse(f"{out}.DLQ")
    assert (moved.body, moved.headers[ID], moved.headers[ERROR_TYPE],
            moved.headers[ORIGINAL_DESTINATION]) == (b"", "id-big", "mdb.errors.EncodeError", out)
    assert "a body of 2048 bytes" in moved.headers[ERROR_MESSAGE]
    assert await count(database, tables.outbox) == 0


async def test_a_producer_is_refused_a_body_larger_than_mdb_sends_before_its_row_is_written(
        database: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "MAX_BODY_BYTES", 1024)
    settings = settings_for(f"memory://{unique('m')}", databases={"main": database.settings})
    async with (Producer(settings) as producer, Outbox(producer) as outbox,
                database.session() as session):
        with pytest.raises(EncodeError, match="a body of 1025 bytes"):
            await outbox.send(session, "queue:orders", b"x" * 1025)
        await outbox.send(session, "queue:orders", b"x" * 1024)
    assert await count(database, tables.outbox) == 1
