"""A database that makes mdb wait (docs/exactly-once.md, "A bad day of the database"): a
transaction of a slow handler holding SQLite's write lock is no outage, a handler cancelled
past its ``handler_timeout`` has its statement ended in the database too, and a stop ends the
process whatever its statements were doing."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Context, Redelivery, listener
from mdb.config.database_settings import DatabaseSettings
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database
from mdb_memory.state import BrokerState, broker_state
from tests.harness.apps.in_process import WAIT, Calls, running, settings_for, unique
from tests.harness.processes.cli import mdb
from tests.harness.processes.mdb_run import MdbRun
from tests.harness.servers.databases import database_url, prepared
from tests.harness.traffic.messages import send_bodies

# A module run by ``mdb run``: an exactly-once listener on SQLite, its messages put on the
# process's own embedded broker as it is imported.
WAITING_APP = """\
import os, threading

import anyio
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Producer, Settings, listener

QUEUE = os.environ["WAITING_QUEUE"]


@listener(QUEUE, exactly_once="main", pool=2)
async def on_order(body: str, session: AsyncSession) -> None:
    pass


async def _seed() -> None:
    async with Producer(Settings()) as producer:
        for n in range(2):
            await producer.send(QUEUE, f"o-{n}")

seeding = threading.Thread(target=anyio.run, args=(_seed,))  # not on the container's loop
seeding.start()
seeding.join()
"""


def test_a_stop_ends_the_process_while_statements_wait_for_sqlites_lock(tmp_path: Path) -> None:
    """A stop cancels the deliveries whose claims wait for the write lock another process
    holds: their connections are closed while SQLite still waits, which must not leave a task
    the event loop waits for at exit (aiosqlite's close waited for a thread that had ended)."""
    database = tmp_path / "app.db"
    env = {"MDB_DATABASES__MAIN__URL": f"sqlite+aiosqlite:///{database}",
           "MDB_DATABASES__MAIN__TIMEOUT": "10", "MDB_STATUS_INTERVAL": "0.1",
           "WAITING_QUEUE": f"queue:{unique('waiting')}"}
    assert mdb("db", "upgrade", cwd=tmp_path, env=env).returncode == 0
    holder = sqlite3.connect(database, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process's write transaction, left open
        run = MdbRun(tmp_path, env, app=WAITING_APP)
        run.wait_for("in flight 2")  # both claims wait for the lock
        assert run.stop() == 0, "".join(run.seen)
    finally:
        holder.close()
    assert "Task was destroyed" not in "".join(run.seen)


def settled(queue: str, count: int) -> Callable[[BrokerState], bool]:
    """Whether ``count`` messages of ``queue`` were acknowledged, and none is left."""
    def condition(state: BrokerState) -> bool:
        stats = state.stats(queue)
        return stats is not None and (stats.dequeued, stats.depth, stats.in_flight) == (
            count, 0, 0)
    return condition


@pytest.mark.anyio
async def test_a_slow_handler_holding_sqlites_write_lock_is_no_outage(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SQLite lets one transaction write at a time: while a slow handler's transaction holds
    the lock, the other listeners' deliveries wait for it, however long past ``timeout``. They
    are neither held for an outage nor run twice, and the container stays ready."""
    database = Database("main", DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path}/app.db",
                                                 timeout=0.3))
    await tables.upgrade(database.engine)
    name = unique("m")
    url, state = f"memory://{name}", broker_state(name)
    slow_queue, fast_queue = f"queue:{unique('slow')}", f"queue:{unique('fast')}"
    calls = Calls()

    @listener(slow_queue, exactly_once="main")
    async def on_slow(body: str, session: AsyncSession) -> None:
        calls.add("slow", body)
        await anyio.sleep(5 * 0.3)  # the handler's own work, five times the database's timeout

    @listener(fast_queue, exactly_once="main", pool=2)
    async def on_fast(body: str, ctx: Context, session: AsyncSession) -> None:
        calls.add("fast", (body, ctx.redelivered))

    unready: list[object] = []

    async def watch_readiness() -> None:
        while True:
            if not container.health().ready:
                unready.append(container.health().unready())
            await anyio.sleep(0.05)  # a container's health is known only when asked

    caplog.set_level(logging.INFO)
    async with running(settings_for(url, databases={"main": database.settings}),
                       on_slow, on_fast) as container, anyio.create_task_group() as watching:
        watching.start_soon(watch_readiness)
        await send_bodies(url, slow_queue, ["s-1"])
        await calls.wait(lambda c: bool(c.of("slow")))  # its transaction holds the lock
        await send_bodies(url, fast_queue, [f"f-{n}" for n in range(4)])
        with anyio.fail_after(WAIT):
            await state.wait_until(settled(fast_queue, 4))
            await state.wait_until(settled(slow_queue, 1))
        watching.cancel_scope.cancel()
    await database.close()
    assert sorted(calls.of("fast"), key=repr) == [(f"f-{n}", False) for n in range(4)]  # once
    assert [(d.stats.redelivered, d.stats.rolled_back) for d in container.deployed] == [
        (0, 0), (0, 0)]
    assert unready == []
    noted = [r.getMessage() for r in caplog.records
             if r.name in ("mdb.database", "asyncio") or r.levelno >= logging.WARNING]
    assert noted == []  # no outage, no task left pending


# A statement that runs until something ends it.
ENDLESS = {
    "sqlite": "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
              "SELECT count(*) FROM n",
    "postgresql": "SELECT pg_sleep(3600)",
    "mysql": "SELECT SLEEP(3600)",
}
# Per database: how many sessions still run ``ENDLESS``.
STILL_RUNNING = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE query = :endless",
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE info = :endless",
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database of the test's own, SQLite, PostgreSQL or MariaDB, with mdb's tables; mdb's
    statements time out after 2 s."""
    made = await prepared(await database_url(request, tmp_path), timeout=2.0)
    yield made
    await made.close()


@pytest.mark.anyio
async def test_a_handler_cancelled_past_its_timeout_has_its_statement_ended(
        database: Database) -> None:
    """The statement a handler was awaiting when ``handler_timeout`` cancelled it goes on in
    the database unless mdb ends it (PostgreSQL notices a client gone only when it next
    writes to it; SQLite's thread runs it to its end), with the run's locks: the inbox row's,
    SQLite's write lock. The message's redelivery would wait for them."""
    database_kind = database.engine.dialect.name
    name = unique("m")
    url, state, queue = f"memory://{name}", broker_state(name), f"queue:{unique('endless')}"
    calls = Calls()

    @listener(queue, exactly_once="main", handler_timeout=0.5,
              redelivery=Redelivery(limit=1, delay=0))
    async def on_order(body: str, ctx: Context, session: AsyncSession) -> None:
        calls.add("ran", ctx.delivery_count)
        if ctx.delivery_count == 1:
            await session.execute(text(ENDLESS[database_kind]))

    async with running(settings_for(url, databases={"main": database.settings}),
                       on_order) as container:
        await send_bodies(url, queue, ["o-1"])
        with anyio.fail_after(WAIT):
            await state.wait_until(settled(queue, 2))  # the first delivery, then its copy
        [deployed] = container.deployed
        assert (deployed.stats.processed, deployed.stats.redelivered) == (1, 1)
    if database_kind in STILL_RUNNING:
        async with database.engine.connect() as connection:
            running_still = (await connection.execute(text(STILL_RUNNING[database_kind]),
                                                      {"endless": ENDLESS[database_kind]}))
        assert running_still.scalar_one() == 0
    assert calls.of("ran") == [1, 2]
