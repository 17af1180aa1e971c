"""A database beside the brokers (``mdb.database_settings``), reached through SQLAlchemy's
async engine.

Driver errors are translated here: a database that cannot be reached, or does not answer in
``timeout`` seconds, is ``DatabaseUnavailable`` (the delivery stays unsettled and comes back);
anything else the database says about a statement (a constraint, a value too large) is the
handler's failure and stays as SQLAlchemy raised it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import Any

import anyio
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from mdb.database_settings import DatabaseSettings
from mdb.errors import ConfigurationError, DatabaseUnavailable
from mdb.redaction import redact_url


class Database:
    """One configured database: its engine and the sessions of exactly-once listeners.
    ``name`` is its key in ``databases``."""

    def __init__(self, name: str, settings: DatabaseSettings) -> None:
        self.name = name
        self.settings = settings
        self.engine = _engine(settings)
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)

    @property
    def shown(self) -> str:
        """The database's URL without its credentials, for messages."""
        return redact_url(self.settings.url)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A session in a transaction: committed when the block ends, rolled back when it
        raises. A driver error saying the database cannot be reached becomes
        ``DatabaseUnavailable``."""
        async with translated(self), self._sessions() as session, session.begin():
            yield session

    def deadline(self) -> AbstractContextManager[anyio.CancelScope]:
        """Around one of mdb's own statements: ``DatabaseUnavailable`` past ``timeout``."""
        return _deadline(self)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.engine.dispose()


@asynccontextmanager
async def translated(database: Database) -> AsyncIterator[None]:
    """Driver errors that mean the database is out of reach, as ``DatabaseUnavailable``."""
    try:
        yield
    except (OperationalError, DisconnectionError, PoolTimeout) as exc:
        raise DatabaseUnavailable(
            f"database {database.name} ({database.shown}): {_first_line(exc)}") from None
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise DatabaseUnavailable(
                f"database {database.name} ({database.shown}): {_first_line(exc)}") from None
        raise
    except OSError as exc:
        raise DatabaseUnavailable(
            f"database {database.name} ({database.shown}): {exc}") from None


@contextmanager
def _deadline(database: Database) -> Iterator[anyio.CancelScope]:
    with anyio.move_on_after(database.settings.timeout) as scope:
        yield scope
    if scope.cancelled_caught:
        raise DatabaseUnavailable(f"database {database.name} ({database.shown}): no answer in "
                                  f"{database.settings.timeout:g} s")


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _engine(settings: DatabaseSettings) -> AsyncEngine:
    url = make_url(settings.url)
    if settings.username is not None:
        url = url.set(username=settings.username)
    if settings.password is not None:
        url = url.set(password=settings.password.get_secret_value())
    options: dict[str, Any] = {"pool_pre_ping": True}
    if url.get_backend_name() == "sqlite":
        # Writers wait for each other instead of failing at once ("database is locked").
        options["connect_args"] = {"timeout": settings.timeout}
    else:
        options.update(pool_size=settings.pool_size, pool_timeout=settings.timeout)
        if url.get_driver_name() == "asyncpg":
            options["connect_args"] = {"timeout": settings.timeout,
                                       "command_timeout": settings.timeout}
    try:
        engine = create_async_engine(url, **options)
    except (ArgumentError, ImportError) as exc:
        raise ConfigurationError(
            f"database url {redact_url(settings.url)!r}: {exc}; install the driver "
            "(`pip install 'mdb[db]'` brings aiosqlite and asyncpg)") from None
    if url.get_backend_name() == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    # WAL lets readers go on while one writer commits; FULL sync makes a commit durable
    # before it returns (the inbox row is the promise that a message was processed).
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()
