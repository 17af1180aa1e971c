"""SQLite's connections as mdb makes them (``configure``): aiosqlite's, with a close that
always ends, a statement in one trip to the connection's thread, and transactions of mdb's
own that wait for the write lock instead of failing.

**One writer at a time.** SQLite lets one transaction write at a time; the others wait for
its lock. An exactly-once delivery's transaction holds it from its claim to its commit, the
whole run of its handler, so a legitimately slow handler makes every other write of the
database wait, mdb's included (the claims of other deliveries, the outbox's deletes). That
wait is no outage (docs/exactly-once.md, "SQLite: one writer at a time"): mdb's transactions
(those of an engine with ``WRITES``) take the lock as they begin (``BEGIN IMMEDIATE``) and wait
for it as long as it takes, trying again each time SQLite's busy timeout (``BUSY_TIMEOUT``)
runs out; within them no statement waits, nor can fail for the lock. Other transactions
(``tables.check`` at startup, an application's own on mdb's engine) begin as SQLite's do by
default: reading needs no lock.

**A close that always ends.** aiosqlite runs a connection's statements on a thread of its
own, one after the other. Its ``close()`` queues the close behind the statement running, and
when that wait is cancelled it asks the thread to stop once more and waits for the answer: a
request the thread never answers when it had already stopped. SQLAlchemy closes a connection
whose statement was cancelled (a stop, a ``handler_timeout``) in just that way, racing its own
request to stop the thread; the task waiting then never ended, and neither did ``mdb run``,
whose event loop waits at exit for every task. Here a close asks the thread to stop once, and
waits for it at most once: the thread closes the connection when the statements queued
before are done, then ends, whether the close was waited for or not. A statement running then
is interrupted (``sqlite3``'s ``interrupt``) and its transaction rolled back: its caller was
cancelled (a ``handler_timeout``), and it would otherwise go on to its end, however far,
holding the write lock (a wait for a lock is not interrupted: it ends with the busy timeout).
A close of the engine (``Database.close``, the container's last step) waits a while for the
threads still in a statement, so that none answers an event loop that is gone. The threads
are daemons, as SQLAlchemy's own aiosqlite connections' are: one left in a statement never
holds up the process's exit.

**A statement in one trip.** aiosqlite sends each call of a cursor to the connection's thread
and wakes the event loop with its answer: making the cursor, the statement, its rows and the
close were four trips through SQLAlchemy, 64 wakes of the loop for an exactly-once run. Here
the statement and its rows are one (``_Statements``), and the close is queued behind it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import aiosqlite
import anyio
import anyio.to_thread
from aiosqlite.context import contextmanager as aiosqlite_result
from sqlalchemy import event
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("mdb.database")

BUSY_TIMEOUT = 1.0
"""Seconds SQLite's busy handler waits for a lock at a time: then mdb tries again. A wait
cancelled (a stop) holds its connection's thread that long at most."""

_WRITING = "mdb_sqlite_writes"
WRITES = {_WRITING: True}
"""The execution options of an engine whose transactions write: each takes the write lock as
it begins, waiting for it as long as another transaction holds it."""

# aiosqlite's own default: rows a cursor fetches from the thread at a time.
_ITER_CHUNK_SIZE = 64


def configure(engine: AsyncEngine) -> Connections:
    """Make ``engine``'s connections (a ``sqlite+aiosqlite`` one's) and begin their
    transactions as this module says; its connections, whose closed threads a close of the
    engine waits for (``Connections.ended``)."""
    connections = Connections()
    sync_engine = engine.sync_engine
    event.listen(sync_engine, "do_connect", connections.connecting)
    event.listen(sync_engine, "connect", _connected)
    event.listen(sync_engine, "begin", _begin)
    return connections


class Connections:
    """The connections of one engine: made by ``connect`` (SQLAlchemy's ``do_connect``
    event), and the threads of those closed, which ``ended`` waits for."""

    def __init__(self) -> None:
        self._closing: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

    def connecting(self, _dialect: Any, _record: Any, _args: Any,
                   params: dict[str, Any]) -> None:
        # The connection is made by ``connect``, with the arguments SQLAlchemy made from the
        # URL and the engine's ``connect_args``.
        params["async_creator_fn"] = self.connect

    def connect(self, database: str, **options: Any) -> SqliteConnection:
        """A connection to ``database`` with ``sqlite3.connect``'s ``options``, as
        ``aiosqlite.connect`` makes one; SQLAlchemy awaits it, which opens it."""
        return SqliteConnection(partial(sqlite3.connect, database, **options), self._closing)

    async def ended(self, timeout: float) -> None:
        """Return once the threads of the connections closed so far have ended, or after
        ``timeout`` seconds. A thread still in a statement (waiting for the lock) answers once
        it is done: were the event loop closed by then, the answer would fail on the thread,
        with a traceback."""
        with anyio.move_on_after(timeout) as scope:
            for thread in [t for t in self._closing if t.is_alive()]:
                await anyio.to_thread.run_sync(
                    thread.join, scope.deadline - anyio.current_time(), abandon_on_cancel=True)


class SqliteConnection(aiosqlite.Connection):
    """An aiosqlite connection whose ``close`` ends whatever cancels it, and the statement it
    runs; its thread joins ``closing`` once it was asked to stop."""

    def __init__(self, connector: Callable[[], sqlite3.Connection],
                 closing: weakref.WeakSet[threading.Thread]) -> None:
        super().__init__(connector, _ITER_CHUNK_SIZE)
        self._thread.daemon = True
        self._closing = closing
        self._stop_asked = False

    def stop(self) -> asyncio.Future[Any] | None:
        connection = self._connection
        if not self._stop_asked and connection is not None:
            # A statement still running is one whose caller was cancelled (a close waits for
            # no other): ended now, not when it is done. Its transaction is rolled back before
            # the close: a cursor still referenced would keep the closed connection, and its
            # write lock, alive until the cursor is collected.
            connection.interrupt()
            self._tx.put_nowait((None, connection.rollback))
        self._stop_asked = True
        self._closing.add(self._thread)
        return super().stop()

    async def close(self) -> None:
        if self._stop_asked:  # the thread closes the connection and ends on its own
            return
        stopped = self.stop()  # queued behind the statements before it, as a close is
        if stopped is not None:
            await stopped

    @aiosqlite_result  # what SQLAlchemy enters: ``async with connection.cursor()``
    async def cursor(self) -> aiosqlite.Cursor:
        return _Statements(self)


class _Statements(aiosqlite.Cursor):
    """A cursor whose statement costs one trip to the connection's thread and back, its rows
    fetched in the same trip: aiosqlite's costs four (the cursor made, the statement, its
    rows, the close), each a wake of the event loop from the thread, which made an
    exactly-once run on SQLite cost twice its CPU. The rows wait here for SQLAlchemy's
    fetches (all at once, or a server-side cursor's a few at a time); the close is queued
    behind the statements, not waited for. The sqlite3 cursor is made on the thread by the
    first statement (a connection to ``:memory:`` may not be used from another)."""

    def __init__(self, connection: SqliteConnection) -> None:
        super().__init__(connection, None)  # type: ignore[arg-type]
        self._rows: deque[Any] = deque()

    def _on_thread(self, run: Callable[[sqlite3.Cursor], object]) -> list[Any]:
        if self._cursor is None:
            self._cursor = self._conn._conn.cursor()
        run(self._cursor)
        return self._cursor.fetchall() if self._cursor.description else []

    async def _trip(self, run: Callable[[sqlite3.Cursor], object]) -> _Statements:
        rows: list[Any] = await self._execute(self._on_thread, run)  # type: ignore[no-untyped-call]
        self._rows = deque(rows)
        return self

    async def execute(self, sql: str, parameters: Any = None) -> _Statements:
        return await self._trip(lambda c: c.execute(sql, [] if parameters is None else parameters))

    async def executemany(self, sql: str, parameters: Any) -> _Statements:
        return await self._trip(lambda c: c.executemany(sql, parameters))

    async def executescript(self, sql_script: str) -> _Statements:
        return await self._trip(lambda c: c.executescript(sql_script))

    async def fetchone(self) -> Any:
        return self._rows.popleft() if self._rows else None

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        count = min(self.iter_chunk_size if size is None else size, len(self._rows))
        return [self._rows.popleft() for _ in range(count)]

    async def fetchall(self) -> list[Any]:
        rows, self._rows = list(self._rows), deque()
        return rows

    async def close(self) -> None:
        if self._cursor is not None and self._conn._running:
            self._conn._tx.put_nowait((None, self._cursor.close))


def _connected(connection: Any, _record: Any) -> None:
    # WAL lets readers go on while one writer commits; FULL sync makes a commit durable
    # before it returns (the inbox row is the promise that a message was processed). The
    # driver begins no transaction on its own: ``_begin`` does, as SQLAlchemy's SQLite docs
    # show for a BEGIN of one's choice.
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()
    connection.isolation_level = None


def _begin(connection: SyncConnection) -> None:
    if not connection.get_execution_options().get(_WRITING):
        connection.exec_driver_sql("BEGIN")
        return
    started = time.monotonic()
    while True:
        try:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            return
        except OperationalError as exc:
            if getattr(exc.orig, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
                raise
        # The busy timeout ran out: the transaction holding the lock goes on. Nothing is held
        # here, so trying again is waiting on.
        log.debug("waiting for SQLite's write lock for %.1f s", time.monotonic() - started)
