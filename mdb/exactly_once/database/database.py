"""``Database``: a database beside the brokers (``mdb.config.database_settings``), reached
through SQLAlchemy's async engine (``mdb.exactly_once.database.engine``), and the sessions of
exactly-once listeners.

Driver errors are translated here (``translated``; what each dialect's errors say is
``mdb.exactly_once.database.driver_errors``): a database that cannot be reached, or does not
answer in ``timeout`` seconds, is ``DatabaseUnavailable`` (the delivery is held until it
answers); anything else the database says about a statement (a constraint, a value too large)
is the handler's failure and stays as SQLAlchemy raised it.

Each database knows whether its last session reached it (``down``): the first
``DatabaseUnavailable`` of an outage is logged, and so is the first success after it; one line
each, however many deliveries met the outage. The container is not ready meanwhile, and
deliveries wait for its end (``reachable``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import Any

import anyio
from sqlalchemy import event, text
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InvalidatePoolError,
    InvalidRequestError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
)
from sqlalchemy.pool import ConnectionPoolEntry

from mdb.config.database_settings import DatabaseSettings
from mdb.errors import DatabaseUnavailable, StatementTooLarge
from mdb.exactly_once import sqlite
from mdb.exactly_once.database.driver_errors import (
    checkout_gave_up,
    first_line,
    parameter_bytes,
    refused_by_mysql,
    unavailable_state,
)
from mdb.exactly_once.database.engine import engine_for
from mdb.exactly_once.database.handler_sessions import OwnedSession
from mdb.observability.redaction import redact_url

log = logging.getLogger("mdb.database")

IDLE_PING = 0.1
"""Seconds a connection may wait in the pool and be used again without a ping: shorter than
any restart of a database server, longer than a pool slot's pause between two messages
under load."""


class Database:
    """One configured database: its engine and the sessions of exactly-once listeners.
    ``name`` is its key in ``databases``; ``slots``, the pool slots of the listeners whose
    runs it serves, each of which holds a connection while its handler runs."""

    def __init__(self, name: str, settings: DatabaseSettings, *, slots: int = 0) -> None:
        self.name = name
        self.settings = settings
        self.engine = engine_for(name, settings, slots)
        self._sqlite = self.engine.dialect.name == "sqlite"
        self._connections = sqlite.configure(self.engine) if self._sqlite else None
        # mdb's own transactions write: on SQLite each takes the write lock as it begins,
        # waiting for it as long as another holds it (``sqlite``).
        writing = self.engine.execution_options(**sqlite.WRITES) if self._sqlite else self.engine
        self._sessions = async_sessionmaker(writing, expire_on_commit=False,
                                            sync_session_class=OwnedSession)
        # For a statement in a transaction of its own (``autocommitted``): on PostgreSQL
        # committed as it runs, without the BEGIN and COMMIT round trips; SQLite's transaction
        # costs less than switching its connection to autocommit and back through aiosqlite's
        # thread, and so does MariaDB's (no BEGIN is sent; the switch is a SET each way, the
        # isolation level set again and a COMMIT).
        self._single: AsyncEngine = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.engine.dialect.name == "postgresql" else writing)
        self.down: DatabaseUnavailable | None = None
        """Why the last session could not reach the database; None once one did."""
        # Not a ping each time a connection leaves the pool (three round trips on asyncpg,
        # twice a message): only one that waited there longer than ``IDLE_PING`` is pinged,
        # so that one the server closed meanwhile (a restart, a failover) is replaced before
        # it is used. One the server closed while it was in use (a backend terminated) is
        # found out by its next statement, an outage; every connection made before the last
        # failure is then replaced as it leaves the pool, so the run made once the database
        # answers gets a new one. "Made" is when its making began: one being made while the
        # server ended every session (its session ended before the driver was done with it)
        # is as dead as the older ones.
        self._failed_at = 0.0
        event.listen(self.engine.sync_engine, "do_connect", _making)
        event.listen(self.engine.sync_engine, "checkin", _returned)
        event.listen(self.engine.sync_engine, "checkout", self._checked_out)
        # A connection dropped while its statement ran (its caller was cancelled: a
        # ``handler_timeout``, a stop, a deadline of mdb's) leaves the statement running on
        # PostgreSQL (on MariaDB up to a second past ``timeout``) with its transaction's
        # locks, the inbox row's among them, which the message's redelivery would wait for:
        # the server notices a client gone only when it next writes to it, and the driver's
        # own cancel request is dropped with the connection. Its backend (thread) is ended as
        # the session or statement it served ends (``_reaching``). SQLite's connections
        # interrupt their statement as they close.
        self._orphans: set[int] = set()
        if not self._sqlite:
            event.listen(self.engine.sync_engine, "invalidate", self._invalidated)
        self.since = time.time()
        """``time.time()`` of the last change of ``down``."""
        # Made by the first task that waits for an outage's end, or its start.
        self._answered: anyio.Event | None = None
        self._failed: anyio.Event | None = None

    @property
    def shown(self) -> str:
        """The database's URL without its credentials, for messages."""
        return redact_url(self.settings.url)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A session in a transaction: committed when the block ends, rolled back when it
        raises. A driver error saying the database cannot be reached, or a commit that takes
        longer than ``timeout``, becomes ``DatabaseUnavailable``."""
        async with self._reaching(), self._sessions() as session, session.begin():
            if self._sqlite:  # the write lock, waited for before any statement's deadline
                await session.connection()
            yield session
            with _deadline(self):  # in doubt then: the message's next claim finds out
                await session.commit()

    @asynccontextmanager
    async def autocommitted(self) -> AsyncIterator[AsyncConnection]:
        """A connection for one statement in a transaction of its own (the delete after a
        dispatch), its errors translated as a session's."""
        async with self._reaching(), self._single.begin() as connection:
            yield connection

    @asynccontextmanager
    async def _reaching(self) -> AsyncIterator[None]:
        # Every failure to reach the database starts (or goes on with) an outage, whichever
        # statement met it: the connections made before it are then replaced as they leave
        # the pool, so that the run made again next does not meet the same dead server.
        try:
            async with translated(self):
                yield
        except DatabaseUnavailable as exc:
            self.unavailable(exc)
            raise
        finally:
            if self._orphans:
                await self._end_orphans()
        self.answered()

    def _invalidated(self, dbapi_connection: Any, _record: ConnectionPoolEntry,
                     exception: BaseException | None) -> None:
        if isinstance(exception, asyncio.CancelledError) and dbapi_connection is not None:
            # asyncpg's connection knows its backend's pid, asyncmy's its thread's id,
            # without a round trip; another driver's backend is left to end on its own.
            driver = dbapi_connection.driver_connection
            pid = getattr(driver, "get_server_pid", None) or getattr(driver, "thread_id", None)
            if pid is not None:
                self._orphans.add(pid())

    async def _end_orphans(self) -> None:
        """End the backends of the connections dropped mid-statement (``_invalidated``),
        shielded from the cancellation that dropped them and bounded by ``timeout``."""
        ended, self._orphans = self._orphans, set()
        with anyio.CancelScope(shield=True,
                               deadline=anyio.current_time() + self.settings.timeout):
            try:
                async with self._single.connect() as connection:
                    terminate = _TERMINATE[connection.dialect.name]
                    for pid in ended:
                        try:
                            await connection.execute(terminate, {"pid": pid})
                        except DBAPIError as exc:  # MariaDB: a thread that ended meanwhile
                            if exc.connection_invalidated:
                                raise
                            log.debug("database %s: backend %s not ended: %s", self.name,
                                      pid, first_line(exc))
            except (SQLAlchemyError, OSError) as exc:  # the database is out of reach: so are they
                log.debug("database %s: backends %s not ended: %s", self.name, sorted(ended),
                          first_line(exc))

    def unavailable(self, why: DatabaseUnavailable) -> None:
        """The database was out of reach: the first time of an outage, say so."""
        self._failed_at = time.monotonic()
        if self.down is None:
            self.since = time.time()
            log.warning("%s; its exactly-once listeners hold their deliveries and the "
                        "container is not ready until it answers", why)
        self.down = why
        if self._failed is not None:
            self._failed.set()
            self._failed = None

    def answered(self) -> None:
        """The database answered: the end of an outage, if one was going on."""
        if self.down is not None:
            log.warning("database %s (%s) answers again, after %.1f s", self.name, self.shown,
                        time.time() - self.since)
            self.down = None
            self.since = time.time()
        if self._answered is not None:
            self._answered.set()
            self._answered = None

    async def reachable(self) -> None:
        """Return once a session reached the database (at once when it is not down)."""
        if self.down is None:
            return
        if self._answered is None:
            self._answered = anyio.Event()
        await self._answered.wait()

    async def unreachable(self) -> None:
        """Return once a session could not reach the database (at once when it is down)."""
        if self.down is not None:
            return
        if self._failed is None:
            self._failed = anyio.Event()
        await self._failed.wait()

    def _checked_out(self, dbapi_connection: Any, record: ConnectionPoolEntry,
                     _proxy: Any) -> None:
        # A DisconnectionError makes the pool connect again, in place of this connection.
        made, returned = record.info["made"], record.info.get("returned", 0.0)
        if made < self._failed_at:
            raise DisconnectionError("made before the database last failed")
        if time.monotonic() - max(made, returned) > IDLE_PING:
            try:
                self.engine.dialect.do_ping(dbapi_connection)
            except Exception as exc:
                # The server went away: none of the connections made before is of use.
                raise InvalidatePoolError(f"no answer to a ping: {exc}") from exc

    def deadline(self) -> AbstractContextManager[anyio.CancelScope]:
        """Around one of mdb's own statements: ``DatabaseUnavailable`` past ``timeout``."""
        return _deadline(self)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.engine.dispose()
            if self._connections is not None:
                await self._connections.ended(self.settings.timeout)


# Ends a backend (PostgreSQL) or a connection's thread (MariaDB/MySQL) from another session.
_TERMINATE = {"postgresql": text("SELECT pg_terminate_backend(:pid)"),
              "mysql": text("KILL :pid"), "mariadb": text("KILL :pid")}


@asynccontextmanager
async def translated(database: Database) -> AsyncIterator[None]:
    """Driver errors that mean the database is out of reach, as ``DatabaseUnavailable``."""
    try:
        yield
    except (OperationalError, DisconnectionError, PoolTimeout) as exc:
        too_large = await _past_the_packet(database, exc)
        if too_large is not None:
            raise too_large from None
        if isinstance(exc, OperationalError) and refused_by_mysql(exc):
            raise
        raise DatabaseUnavailable(
            f"database {database.name} ({database.shown}): {first_line(exc)}") from None
    except DBAPIError as exc:
        if exc.connection_invalidated or unavailable_state(exc):
            raise DatabaseUnavailable(
                f"database {database.name} ({database.shown}): {first_line(exc)}") from None
        raise
    except OSError as exc:  # TimeoutError among them: the driver's own timeout, which says nothing
        why = (f"no answer in {database.settings.timeout:g} s" if isinstance(exc, TimeoutError)
               else str(exc) or type(exc).__name__)
        raise DatabaseUnavailable(
            f"database {database.name} ({database.shown}): {why}") from None
    except InvalidRequestError as exc:
        if not checkout_gave_up(exc):
            raise
        raise DatabaseUnavailable(f"database {database.name} ({database.shown}): no connection "
                                  "made lately survived its failures") from None


# MariaDB's and MySQL's errors for a statement past the server's max_allowed_packet: its own
# (ER_NET_PACKET_TOO_LARGE), sent as it drops the connection, or the client's for a connection
# lost during a statement, when the drop came first.
_PACKET_TOO_LARGE = 1153
_MYSQL_LOST = frozenset({2006, 2013})
_LARGE = 1 << 20  # bytes of a statement below which a lost connection is not put down to it


async def _past_the_packet(database: Database, exc: SQLAlchemyError) -> StatementTooLarge | None:
    """The ``StatementTooLarge`` ``exc`` is when MariaDB or MySQL refused a statement past its
    ``max_allowed_packet``, or dropped the connection of one that may be (the server's value
    asked on a connection of its own: the startup check saw it large enough, but a server may
    be restarted with another configuration); None for any other failure."""
    # The statement's own error, where the rollback after it met the dropped connection.
    failed: BaseException | None = exc
    while failed is not None and not (isinstance(failed, DBAPIError) and failed.statement):
        failed = failed.__context__
    if not isinstance(failed, DBAPIError) or failed.orig is None or not failed.orig.args:
        return None
    code = failed.orig.args[0]
    # Each byte of a body may be escaped to two on the way.
    size = len(failed.statement or "") + 2 * parameter_bytes(failed.params)
    if code != _PACKET_TOO_LARGE and (code not in _MYSQL_LOST or size < _LARGE):
        return None
    try:
        with _deadline(database):
            async with database.engine.connect() as connection:
                packet: int | None = int((await connection.execute(_PACKET)).scalar_one())
    except (SQLAlchemyError, OSError, DatabaseUnavailable):
        packet = None  # out of reach
    if code != _PACKET_TOO_LARGE and (packet is None or size <= packet):
        return None  # the connection was lost for another reason: an outage
    allowed = "" if packet is None else f" of {packet >> 20} MiB"
    return StatementTooLarge(
        f"database {database.name} ({database.shown}): the server refused a statement of up "
        f"to {max(size >> 20, 1)} MiB, more than its max_allowed_packet{allowed}; set "
        "max_allowed_packet = 256M in the server's configuration (docs/exactly-once.md)")


_PACKET = text("SELECT @@GLOBAL.max_allowed_packet")


@contextmanager
def _deadline(database: Database) -> Iterator[anyio.CancelScope]:
    with anyio.move_on_after(database.settings.timeout) as scope:
        yield scope
    if scope.cancelled_caught:
        raise DatabaseUnavailable(f"database {database.name} ({database.shown}): no answer in "
                                  f"{database.settings.timeout:g} s")


def _making(_dialect: Any, record: ConnectionPoolEntry, _args: Any, _params: Any) -> None:
    record.info["made"] = time.monotonic()  # returns None: the dialect connects as it would


def _returned(_dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    record.info["returned"] = time.monotonic()
