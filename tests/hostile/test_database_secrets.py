"""Secrets around an exactly-once listener's database (docs/security.md, "Secrets"): a
password in the query of a database URL, as asyncpg takes it, never shown by ``mdb db
upgrade``, the startup error or the outage lines; a producer's headers longer than the outbox
keeps never take a statement's parameters (a reply's body among them) to a log line, a
traceback, a span or an error header."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Column, Integer, MetaData, String, Table, text
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Context, Redelivery, listener
from mdb.config.database_settings import DatabaseSettings
from mdb.errors import DatabaseUnavailable
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage
from mdb.observability.redaction import mask_secrets, redact_url
from mdb.seam.broker import ConnectionOptions
from mdb.seam.registry import broker_for
from mdb_memory.state import broker_state
from tests.harness.apps.in_process import WAIT, running, settings_for, unique
from tests.harness.processes.cli import mdb, one_line
from tests.harness.servers.mariadb import MariaDB
from tests.harness.servers.postgresql import PostgreSQL
from tests.harness.servers.process import free_port

QUERY_PASSWORD = "S3cr3t-in-the-query"


@pytest.mark.parametrize("query", [
    "?password={}", "?user=u&password={}", "?PASSWORD={}&ssl=require", "?sslpassword={}",
    "?passwd={}", "?x=1;pwd={}", "?access_token={}", "?client_secret={}",
])
def test_a_secret_in_a_urls_query_is_masked_whatever_its_name(query: str) -> None:
    url = "postgresql+asyncpg://u:pw@db:5432/orders" + query.format(QUERY_PASSWORD + "#;x")
    for shown in (redact_url(url), mask_secrets(f"connecting to {url} failed")):
        assert QUERY_PASSWORD not in shown and "=***" in shown and "u:***@" in shown
    assert "ssl=require" in redact_url(url) or "ssl=" not in url


def test_mdb_db_upgrade_never_shows_a_password_in_the_urls_query(tmp_path: Path) -> None:
    url = (f"postgresql+asyncpg://127.0.0.1:{free_port()}/orders"
           f"?user=u&password={QUERY_PASSWORD}")
    result = mdb("db", "upgrade", cwd=tmp_path, env={"MDB_DATABASES__MAIN__URL": url})
    assert result.returncode == 2
    assert "password=***" in one_line(result.stderr)
    assert QUERY_PASSWORD not in (result.stdout + result.stderr).decode()


@pytest.mark.postgresql
def test_mdb_db_upgrade_that_reached_the_database_never_shows_the_password_either(
        tmp_path: Path, postgres: PostgreSQL) -> None:
    # The test server trusts its clients: the password is sent, and not needed.
    url = f"{postgres.create_database('secrets')}?password={QUERY_PASSWORD}"
    result = mdb("db", "upgrade", cwd=tmp_path, env={"MDB_DATABASES__MAIN__URL": url})
    assert result.returncode == 0, result.stderr
    assert "password=***" in result.stdout.decode()
    assert QUERY_PASSWORD not in (result.stdout + result.stderr).decode()


def test_mdb_run_never_shows_a_password_in_the_urls_query(tmp_path: Path) -> None:
    (tmp_path / "secret_listeners.py").write_text(
        "from sqlalchemy.ext.asyncio import AsyncSession\n"
        "from mdb import listener\n\n"
        "@listener('queue:orders', exactly_once='main')\n"
        "async def on_order(body: bytes, session: AsyncSession) -> None:\n"
        "    pass\n")
    url = f"postgresql+asyncpg://127.0.0.1:{free_port()}/orders?password={QUERY_PASSWORD}"
    result = mdb("run", "secret_listeners", cwd=tmp_path,
                 env={"MDB_DATABASES__MAIN__URL": url})
    assert result.returncode != 0
    assert QUERY_PASSWORD not in (result.stdout + result.stderr).decode()


@pytest.mark.anyio
async def test_an_outage_never_shows_a_password_in_the_urls_query(
        caplog: pytest.LogCaptureFixture) -> None:
    url = f"postgresql+asyncpg://127.0.0.1:{free_port()}/orders?password={QUERY_PASSWORD}"
    database = Database("main", DatabaseSettings(url=url, timeout=5))
    caplog.set_level(logging.INFO)
    try:
        with pytest.raises(DatabaseUnavailable) as raised:
            async with database.session() as session:
                await session.execute(text("SELECT 1"))
        database.answered()  # the outage's end, as a session that reached it says it
    finally:
        await database.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "mdb.database"]
    assert len(lines) == 2 and all("password=***" in line for line in lines), lines
    assert QUERY_PASSWORD not in f"{raised.value} {caplog.text}"


# -- a producer's headers longer than the outbox's columns --------------------------------

CARD = "4111111111111111"

# What a producer may write, each longer than the column an outbox row (or the inbox key)
# keeps it in on PostgreSQL.
LONG_HEADERS = {
    "correlation-id": {"correlation_id": "c" * 500},
    "reply-to": {"reply_to": "r" * 1100},
    "mdb_id": {"mdb_id": "m" * 300},
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """SQLite, which keeps text of any length, and PostgreSQL and MariaDB, which refuse what
    is longer than a column: the outbox refuses it on all three, before any is asked."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"
    else:
        server: PostgreSQL | MariaDB = request.getfixturevalue(
            "postgres" if request.param == "postgresql" else request.param)
        url = await anyio.to_thread.run_sync(server.create_database, unique("secrets"))
    database = Database("main", DatabaseSettings(url=url))
    await tables.upgrade(database.engine)
    yield database
    await database.close()


@pytest.mark.anyio
@pytest.mark.parametrize("header", LONG_HEADERS)
async def test_a_header_longer_than_the_outbox_keeps_never_shows_the_reply_or_its_parameters(
        header: str, database: Database, caplog: pytest.LogCaptureFixture,
        spans: InMemorySpanExporter) -> None:
    name = unique("m")
    url, state, queue = f"memory://{name}", broker_state(name), f"queue:{unique('long')}"
    fields = LONG_HEADERS[header]
    replies, errors = f"queue:{fields.get('reply_to', unique('r'))}", f"{queue}.DLQ"

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        await ctx.reply(f"card={CARD}")

    caplog.set_level(logging.DEBUG)
    settings = settings_for(url, databases={"main": database.settings})
    async with running(settings, handler):
        connection = await broker_for(ConnectionOptions(url=url, client_id=unique("p"))).connect()
        try:
            await connection.send(Destination.parse(queue), OutgoingMessage(
                b"order", {ID: fields.get("mdb_id", unique("id"))},
                reply_to=Destination.parse(replies),
                correlation_id=fields.get("correlation_id")))
        finally:
            await connection.close()
        with anyio.fail_after(WAIT):
            await state.wait_until(lambda s: s.queue_depth(replies) + s.queue_depth(errors) > 0)
    moved = state.browse(errors)
    if header == "mdb_id":  # the inbox's matter: processed (keyed by a digest) or moved
        assert [r.body for r in state.browse(replies)] == [f"card={CARD}".encode()] or moved
    else:  # refused before the database: the delivery fails, saying which header
        assert [m.body for m in moved] == [b"order"]
        assert header in moved[0].headers["mdb_error_message"]
    shown = caplog.text + "".join(str(m.headers) for m in moved) + "".join(
        f"{s.status.description} {[e.attributes for e in s.events]}"
        for s in spans.get_finished_spans() if queue in str(s.attributes))
    assert CARD not in shown and "[parameters:" not in shown
    assert await outbox_rows(database) == 0


async def outbox_rows(database: Database) -> int:
    async with database.session() as session:
        return len((await session.execute(tables.outbox.select())).all())


payments = Table("payments", MetaData(), Column("id", String(100), primary_key=True),
                 Column("card", String(100)), Column("amount", Integer, nullable=False))


@pytest.mark.anyio
async def test_a_handlers_statement_the_database_refuses_never_shows_its_parameters(
        database: Database, caplog: pytest.LogCaptureFixture) -> None:
    name = unique("m")
    url, state, queue = f"memory://{name}", broker_state(name), f"queue:{unique('pay')}"
    async with database.engine.begin() as tables_made:
        await tables_made.run_sync(payments.metadata.create_all)

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=0))
    async def handler(body: str, session: AsyncSession) -> None:
        await session.execute(payments.insert().values(id=body, card=CARD, amount=None))

    caplog.set_level(logging.DEBUG)
    async with running(settings_for(url, databases={"main": database.settings}), handler):
        connection = await broker_for(ConnectionOptions(url=url, client_id=unique("p"))).connect()
        try:
            await connection.send(Destination.parse(queue), OutgoingMessage(b"p-1"))
        finally:
            await connection.close()
        with anyio.fail_after(WAIT):
            await state.wait_until(lambda s: s.queue_depth(f"{queue}.DLQ") > 0)
    [moved] = state.browse(f"{queue}.DLQ")
    assert moved.headers["mdb_error_type"] == "sqlalchemy.exc.IntegrityError"
    assert "parameters hidden" in moved.headers["mdb_error_message"]
    assert CARD not in caplog.text + str(moved.headers)
