"""A database beside the brokers (``mdb.database_settings``), reached through SQLAlchemy's
async engine.

Driver errors are translated here: a database that cannot be reached, or does not answer in
``timeout`` seconds, is ``DatabaseUnavailable`` (the delivery is held until it answers);
anything else the database says about a statement (a constraint, a value too large) is the
handler's failure and stays as SQLAlchemy raised it.

Each database knows whether its last session reached it (``down``): the first
``DatabaseUnavailable`` of an outage is logged, and so is the first success after it; one line
each, however many deliveries met the outage. The container is not ready meanwhile, and
deliveries wait for its end (``reachable``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InvalidatePoolError,
    InvalidRequestError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session
from sqlalchemy.pool import ConnectionPoolEntry, PoolResetState

from mdb.database_settings import URL_EXAMPLES, DatabaseSettings
from mdb.errors import ConfigurationError, DatabaseUnavailable, SessionMisuse
from mdb.exactly_once import sqlite
from mdb.redaction import redact_url

log = logging.getLogger("mdb.database")

IDLE_PING = 0.1
"""Seconds a connection may wait in the pool and be used again without a ping: shorter than
any restart of a database server, longer than a pool slot's pause between two messages
under load."""


class Database:
    """One configured database: its engine and the sessions of exactly-once listeners.
    ``name`` is its key in ``databases``."""

    def __init__(self, name: str, settings: DatabaseSettings) -> None:
        self.name = name
        self.settings = settings
        self.engine = _engine(name, settings)
        self._sqlite = self.engine.dialect.name == "sqlite"
        self._connections = sqlite.configure(self.engine) if self._sqlite else None
        # mdb's own transactions write: on SQLite each takes the write lock as it begins,
        # waiting for it as long as another holds it (``sqlite``).
        writing = self.engine.execution_options(**sqlite.WRITES) if self._sqlite else self.engine
        self._sessions = async_sessionmaker(writing, expire_on_commit=False,
                                            sync_session_class=_Session)
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
                                      pid, _first_line(exc))
            except (SQLAlchemyError, OSError) as exc:  # the database is out of reach: so are they
                log.debug("database %s: backends %s not ended: %s", self.name, sorted(ended),
                          _first_line(exc))

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

_HANDLER: ContextVar[str | None] = ContextVar("mdb_handler", default=None)


@contextmanager
def handing(listener: str) -> Iterator[None]:
    """While ``listener``'s handler runs with a session of mdb's, in this task and those it
    starts: its ``commit``, ``rollback`` and ``close`` are refused (``SessionMisuse``)."""
    token = _HANDLER.set(listener)
    try:
        yield
    finally:
        _HANDLER.reset(token)


class _Session(Session):
    """The sessions mdb opens. Its transaction is mdb's to end: the inbox row and the outbox
    rows commit with the handler's writes or not at all. A handler that ended it itself would
    have its writes committed without them (run again on a redelivery), or the inbox row
    rolled back under writes made after it. SQLAlchemy's ``AsyncSession`` ends a transaction
    through these methods (run on its greenlet, in the task's context)."""

    def commit(self) -> None:
        _refused("commit")
        super().commit()

    def rollback(self) -> None:
        _refused("rollback")
        super().rollback()

    def close(self) -> None:
        _refused("close")
        super().close()


def _refused(what: str) -> None:
    listener = _HANDLER.get()
    if listener is not None:
        raise SessionMisuse(
            f"listener {listener}: the handler called {what}() on its session, whose "
            "transaction is mdb's: returning commits it (with the message's inbox row and "
            "its sends), raising rolls it back (docs/exactly-once.md)")


@asynccontextmanager
async def translated(database: Database) -> AsyncIterator[None]:
    """Driver errors that mean the database is out of reach, as ``DatabaseUnavailable``."""
    try:
        yield
    except (OperationalError, DisconnectionError, PoolTimeout) as exc:
        if isinstance(exc, OperationalError) and _refused_by_mysql(exc):
            raise
        raise DatabaseUnavailable(
            f"database {database.name} ({database.shown}): {_first_line(exc)}") from None
    except DBAPIError as exc:
        if exc.connection_invalidated or _unavailable_state(exc):
            raise DatabaseUnavailable(
                f"database {database.name} ({database.shown}): {_first_line(exc)}") from None
        raise
    except OSError as exc:  # TimeoutError among them: the driver's own timeout, which says nothing
        why = (f"no answer in {database.settings.timeout:g} s" if isinstance(exc, TimeoutError)
               else str(exc) or type(exc).__name__)
        raise DatabaseUnavailable(
            f"database {database.name} ({database.shown}): {why}") from None
    except InvalidRequestError as exc:
        if not _checkout_gave_up(exc):
            raise
        raise DatabaseUnavailable(f"database {database.name} ({database.shown}): no connection "
                                  "made lately survived its failures") from None


def _checkout_gave_up(exc: InvalidRequestError) -> bool:
    """Whether ``exc`` is the pool giving up a checkout: every connection it made in its
    retries was retired as made before the database's last failure (``_checked_out``), which
    other sessions kept meeting as a server restarted. SQLAlchemy says so with a plain
    ``InvalidRequestError``, told from a misuse of a session by where it was raised."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    code = None if frame is None else frame.tb_frame.f_code
    return code is not None and code.co_name == "_checkout" and "pool" in code.co_filename


@asynccontextmanager
async def at_startup(database: Database) -> AsyncIterator[None]:
    """Around the first statements a container or ``mdb db upgrade`` makes: a database that
    cannot be reached, refuses mdb's login or does not answer in ``timeout`` is a
    ``ConfigurationError`` naming the settings to check (docs/exactly-once.md: nothing runs
    until they or the server are set right)."""
    name = database.name
    embedded = make_url(database.settings.url).get_backend_name() == "sqlite"
    check = (f"may mdb create and write the file (databases.{name}.url)?" if embedded else
             f"is it running, and are databases.{name}.url, databases.{name}.username and "
             f"databases.{name}.password (or password_file) right?")
    if embedded:
        _sqlite_folder(database)
    try:
        with database.deadline():
            async with translated(database):
                yield
    except DatabaseUnavailable as exc:
        raise ConfigurationError(f"{exc}; {check}") from None
    except DBAPIError as exc:  # a refused login, a database that does not exist...
        raise ConfigurationError(
            f"database {name} ({database.shown}): {_first_line(exc)}; {check}") from None


def _sqlite_folder(database: Database) -> None:
    # Said before connecting, too: aiosqlite's thread of a connection that failed may outlive
    # the event loop and print a traceback of its own as the process ends.
    path = make_url(database.settings.url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    folder = Path(path).absolute().parent
    if not folder.is_dir():
        why = "does not exist: create it, or correct"
    elif not os.access(folder, os.W_OK | os.X_OK):
        why = "may not be written by this process: grant it, or correct"
    else:
        return
    raise ConfigurationError(f"database {database.name} ({database.shown}): folder {folder} "
                             f"{why} databases.{database.name}.url")


@contextmanager
def _deadline(database: Database) -> Iterator[anyio.CancelScope]:
    with anyio.move_on_after(database.settings.timeout) as scope:
        yield scope
    if scope.cancelled_caught:
        raise DatabaseUnavailable(f"database {database.name} ({database.shown}): no answer in "
                                  f"{database.settings.timeout:g} s")


# SQLSTATE classes that say the server cannot take the statement now, not that it is wrong: a
# connection exception (08), the server shutting down, crashed or still starting (57P01 to
# 57P03: asyncpg raises them as plain errors), insufficient resources (53: too many
# connections, a full disk).
_UNAVAILABLE_STATES = ("08", "57P0", "53")


def _unavailable_state(exc: DBAPIError) -> bool:
    state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return isinstance(state, str) and state.startswith(_UNAVAILABLE_STATES)


# MariaDB's and MySQL's own errors that say the server cannot take the statement now: too many
# connections, shutting down, the connection killed, the statement interrupted by a shutdown.
_MYSQL_UNAVAILABLE = frozenset({1040, 1053, 1927, 1317})


def _refused_by_mysql(exc: OperationalError) -> bool:
    """Whether ``exc`` is MariaDB's or MySQL's refusal of a statement (a deadlock, a lock
    wait or a statement past its time, an error its driver has no class for), the handler's
    failure as on PostgreSQL: their drivers raise ``OperationalError`` for any server error
    number they do not know. The client's own numbers (2000 to 2999: no connection, the
    connection lost) say the server is out of reach; the server's are the others, from 1000."""
    code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
    return (isinstance(code, int) and code >= 1000 and not 2000 <= code < 3000
            and code not in _MYSQL_UNAVAILABLE and not exc.connection_invalidated)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__


# The extra of mdb that installs a driver (pyproject.toml); SQLite's comes with mdb.
_DRIVER_EXTRAS = {"asyncpg": "mdb[postgres]", "asyncmy": "mdb[mysql]"}


def database_url(settings: DatabaseSettings) -> URL:
    """The URL mdb connects to the database of ``settings`` with: ``url`` with the
    ``username`` and the password (``password``, or the content of ``password_file``) of the
    settings in place of any the URL holds. For an engine of the application's own, on the
    same database with the same login (docs/exactly-once.md); shown with ``str()``, it hides
    the password."""
    url = make_url(settings.url)
    if settings.username is not None:
        url = url.set(username=settings.username)
    if settings.password is not None:
        url = url.set(password=settings.password.get_secret_value())
    return url


def _engine(name: str, settings: DatabaseSettings) -> AsyncEngine:
    url = database_url(settings)
    # A statement's parameters are a message's body and headers (a producer's) and what a
    # handler writes: SQLAlchemy puts them in the text of its errors, which reach the log,
    # spans and the error header mdb_error_message (docs/security.md, "Secrets").
    options: dict[str, Any] = {"hide_parameters": True}
    if url.get_backend_name() == "sqlite":
        # SQLite's busy handler: how long a wait for a lock lasts before mdb tries again.
        options["connect_args"] = {"timeout": sqlite.BUSY_TIMEOUT}
    else:
        # Last in, first out: under load the same few connections are used again at once
        # (not pinged); the others wait, and are pinged when they are needed.
        options.update(pool_size=settings.pool_size, pool_timeout=settings.timeout,
                       pool_use_lifo=True)
        if url.get_driver_name() == "asyncpg":
            options["connect_args"] = {"timeout": settings.timeout,
                                       "command_timeout": settings.timeout}
        elif url.get_backend_name() in ("mysql", "mariadb"):
            # READ COMMITTED, PostgreSQL's: a locking read (the outbox sweep's) locks the rows
            # it reads, not the gaps between them where handlers insert.
            options["isolation_level"] = "READ COMMITTED"
            # A statement ends on the server a second after ``timeout``: a handler's own with
            # an error that is its failure (asyncpg's command_timeout on PostgreSQL), one mdb
            # stopped waiting for at ``timeout`` (its connection dropped: the server notices
            # only when it answers) with its locks, the inbox row's among them. A lock wait
            # on MariaDB and MySQL, any statement on MariaDB (``/*M!``: MySQL skips it).
            bound = math.ceil(settings.timeout) + 1
            options["connect_args"] = {
                "connect_timeout": settings.timeout,
                "init_command": f"SET SESSION innodb_lock_wait_timeout = {bound} "
                                f"/*M! , SESSION max_statement_time = {bound} */"}
            options["pool_reset_on_return"] = None  # ``_reset_if_open`` instead
    setting = f"setting databases.{name}.url: {redact_url(settings.url)!r}"
    try:
        engine = create_async_engine(url, **options)
    except ImportError as exc:
        driver = exc.name or url.get_driver_name()
        extra = _DRIVER_EXTRAS.get(driver)
        raise ConfigurationError(
            f"{setting} needs the driver {driver}, which is not installed: "
            f"{f'pip install {extra!r}' if extra else 'install it'}") from None
    except NoSuchModuleError:
        raise ConfigurationError(
            f"{setting}: SQLAlchemy has no driver {url.get_driver_name()!r} for "
            f"{url.get_backend_name()}; write e.g. {URL_EXAMPLES}") from None
    except InvalidRequestError:  # the asyncio extension refuses a driver that is not async
        raise ConfigurationError(
            f"{setting} names the driver {url.get_driver_name()}, which is not async: write "
            f"e.g. {URL_EXAMPLES}") from None
    except ArgumentError as exc:  # the dialect refuses the URL (its text hides the password)
        raise ConfigurationError(f"{setting}: {_first_line(exc)}") from None
    if url.get_backend_name() == "sqlite":
        # aiosqlite logs each call at DEBUG with its arguments, a statement's parameters among
        # them (docs/security.md, "Secrets"); its other lines say nothing mdb does not.
        logging.getLogger("aiosqlite").setLevel(logging.INFO)
    elif options.get("pool_reset_on_return", "rollback") is None:
        event.listen(engine.sync_engine, "reset", _reset_if_open)
    return engine


_IN_TRANSACTION = 1  # SERVER_STATUS_IN_TRANS, in the status of MariaDB's and MySQL's answers


def _reset_if_open(dbapi_connection: Any, _record: ConnectionPoolEntry,
                   state: PoolResetState) -> None:
    """Roll back a MariaDB/MySQL connection the pool takes back only if its server said a
    transaction is open. The pool's own reset rolls back every connection whose transaction
    was committed before it came back: a round trip each on these drivers (asyncpg knows
    there is nothing to roll back), two a delivery."""
    if not state.asyncio_safe or state.transaction_was_reset:
        return
    if getattr(dbapi_connection.driver_connection, "server_status", _IN_TRANSACTION) \
            & _IN_TRANSACTION:
        dbapi_connection.rollback()


def _making(_dialect: Any, record: ConnectionPoolEntry, _args: Any, _params: Any) -> None:
    record.info["made"] = time.monotonic()  # returns None: the dialect connects as it would


def _returned(_dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    record.info["returned"] = time.monotonic()
