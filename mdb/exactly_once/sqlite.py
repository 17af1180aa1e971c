"""SQLite's connections as mdb makes them: aiosqlite's, with a close that always ends.

aiosqlite runs a connection's statements on a thread of its own, one after the other. Its
``close()`` queues the close behind the statement running, and when that wait is cancelled it
asks the thread to stop once more and waits for the answer: a request the thread never
answers when it had already stopped. SQLAlchemy closes a connection whose statement was
cancelled (a stop, a ``handler_timeout``) in just that way, racing its own request to stop
the thread; the task waiting then never ended, and neither did ``mdb run``, whose event loop
waits at exit for every task (docs/exactly-once.md, "A bad day of the database").

Here a close asks the thread to stop once, and waits for it at most once: the thread closes
the connection when the statements queued before are done, then ends, whether the close was
waited for or not. The thread is a daemon, as SQLAlchemy's own aiosqlite connections are:
one left in a statement never holds up the process's exit.
"""

from __future__ import annotations

import asyncio
import sqlite3
from functools import partial
from typing import Any

import aiosqlite

# aiosqlite's own default: rows a cursor fetches from the thread at a time.
_ITER_CHUNK_SIZE = 64


class Connection(aiosqlite.Connection):
    """An aiosqlite connection whose ``close`` ends whatever cancels it."""

    _stop_asked = False

    def stop(self) -> asyncio.Future[Any] | None:
        self._stop_asked = True
        return super().stop()

    async def close(self) -> None:
        if self._stop_asked:  # the thread closes the connection and ends on its own
            return
        stopped = self.stop()  # queued behind the statements before it, as a close is
        if stopped is not None:
            await stopped


def connect(database: str, **options: Any) -> Connection:
    """A connection to ``database`` with ``sqlite3.connect``'s ``options``, as
    ``aiosqlite.connect`` makes one; SQLAlchemy awaits it, which opens it."""
    connection = Connection(partial(sqlite3.connect, database, **options), _ITER_CHUNK_SIZE)
    connection._thread.daemon = True
    return connection


def connecting(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
    """SQLAlchemy's ``do_connect`` event of a ``sqlite+aiosqlite`` engine: its connections
    are made by ``connect``, with the arguments SQLAlchemy made from the URL."""
    params["async_creator_fn"] = connect
