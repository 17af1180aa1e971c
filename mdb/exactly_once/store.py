"""``Store``: one database of a container's exactly-once listeners, with its upkeep.

The upkeep runs beside the pool slots: it sweeps the outbox (rows whose lease ran out: their
process died, or their broker was down), purges inbox rows past ``inbox_retention``, a
small batch at a time so that it never holds up a delivery's claim for long, and counts the
outbox for ``/status`` (``health``: counted once a round, never per request). Its statements
also notice an outage, and its end, when no delivery comes: the deliveries held meanwhile
wait for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

import anyio

from mdb.config.settings import Settings
from mdb.errors import BrokerError, ConfigurationError, DatabaseUnavailable
from mdb.exactly_once import inbox, tables
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.database.startup import at_startup
from mdb.exactly_once.guard import Guard
from mdb.exactly_once.outbox.dispatcher import Dispatcher
from mdb.exactly_once.outbox.rows import backlog
from mdb.exactly_once.outbox.writer import BOUNDED
from mdb.listeners.listener import ListenerSpec
from mdb.messages.destinations import Destination
from mdb.messages.identity import Seal
from mdb.observability.health import DatabaseHealth
from mdb.routing.producer import Producer

log = logging.getLogger("mdb.outbox")

PURGE_BATCH = 500
OUTAGE_PROBE = 1.0
"""Seconds between the upkeep's tries while its database is down, at most."""


class Store:
    """``database`` as the process ``owner`` uses it (as the outbox keeps it:
    ``tables.fitted``): its dispatcher sends through ``producer``."""

    def __init__(self, database: Database, producer: Producer, owner: str) -> None:
        self.database = database
        self.owner = owner = tables.fitted(owner, tables.OWNER)
        self.dispatcher = Dispatcher(database, producer, owner)
        self._backlog: tuple[int, float | None] = (0, None)

    def guard(self, *, listener: str, subscription: str, broker: str,
              error_destination: Destination) -> Guard:
        """The database side of ``listener``'s deliveries from ``subscription`` on
        ``broker`` (``Guard``)."""
        return Guard(self.database, self.dispatcher, self.owner, listener=listener,
                     subscription=subscription, broker=broker,
                     error_destination=error_destination)

    async def check(self) -> None:
        """``ConfigurationError`` when mdb's tables are missing (``mdb db upgrade``), or the
        database cannot be reached at startup."""
        async with at_startup(self.database):
            await tables.check(self.database.engine, self.database.name)

    def health(self, now: float) -> DatabaseHealth:
        """The database for ``/status``: reached or not, and the outbox as last counted."""
        database = self.database
        rows, oldest = self._backlog
        return DatabaseHealth(database.name, "up" if database.down is None else "down",
                              database.since, rows, None if oldest is None else now - oldest)

    async def upkeep(self) -> None:
        """Sweep the outbox, purge the inbox and count the outbox for ever, every third of the
        outbox lease, and every second during an outage of the database. An unavailable
        database or broker is tried again next time (the database logs its outages; a
        broker's is logged here, once)."""
        settings = self.database.settings
        failing: str | None = None
        while True:
            try:
                await self._count()  # first: a broker that is down must not keep it stale
                while await self.dispatcher.sweep():
                    pass
                async with self.database.session() as session:
                    with self.database.deadline():
                        await inbox.purge(session, time.time() - settings.inbox_retention,
                                          PURGE_BATCH)
            except DatabaseUnavailable:
                pass
            except BrokerError as exc:
                if failing is None:
                    log.warning("outbox of database %s: cannot dispatch now (%s); trying again "
                                "every %.0f s", self.database.name, exc,
                                settings.outbox_lease / 3)
                failing = str(exc)
            else:
                if failing is not None:
                    log.warning("outbox of database %s: dispatching again", self.database.name)
                failing = None
            # Deliveries held while the database is down wait for this loop to find it
            # answering again: from an outage's start it tries every second.
            if self.database.down is None:
                with anyio.move_on_after(settings.outbox_lease / 3):
                    await self.database.unreachable()
            else:
                await anyio.sleep(min(settings.outbox_lease / 3, OUTAGE_PROBE))

    async def _count(self) -> None:
        async with self.database.session() as session:
            with self.database.deadline():
                self._backlog = await backlog(session)

    async def close(self) -> None:
        """Delete the rows sent since the last run (else another process would send them
        again once their lease ran out), then close the database."""
        try:
            await self.dispatcher.forget_sent()
        except DatabaseUnavailable:
            log.debug("database %s: rows sent left in the outbox: its sweeps send them again",
                      self.database.name)
        await self.database.close()


async def database_seal(settings: Settings,
                        stores: Mapping[str, Store] | None = None) -> Seal | None:
    """The application's seal when ``settings`` name no ``identity_secret_file`` but
    ``databases``: the secret ``mdb db upgrade`` made in the first of them by name (read
    through its store among ``stores``, if there), so that every process of the application
    that names the same databases proves and checks with the same one; ``ConfigurationError``
    when that database cannot be read or lacks it. None otherwise (``Seal.of`` stands)."""
    if settings.identity_secret is not None or not settings.databases:
        return None
    name = min(settings.databases)
    store = (stores or {}).get(name)
    database = store.database if store is not None else Database(
        name, settings.databases[name])
    try:
        async with at_startup(database):
            secret = await tables.identity_secret(database.engine)
    finally:
        if store is None:
            await database.close()
    if secret is None:
        raise ConfigurationError(
            f"database {name}: its identity secret is missing; make it with `mdb db upgrade "
            "--config FILE` (or set identity_secret_file: docs/security.md)")
    return Seal(secret)


def stores_for(settings: Settings, listeners: Iterable[tuple[ListenerSpec, int]],
               producer: Producer, owner: str) -> dict[str, Store]:
    """A store per database an exactly-once listener among ``listeners`` (each with its
    number of pool slots) names, with a connection for each of their slots; a
    ``ConfigurationError`` for a name ``databases`` lacks."""
    slots: dict[str, int] = {}
    for spec, count in listeners:
        name = spec.options.exactly_once
        if name is None:
            if spec.session_parameter is not None:
                raise ConfigurationError(
                    f"listener {spec.name!r}: its handler takes an AsyncSession "
                    f"({spec.session_parameter!r}), which only an exactly_once listener gets: "
                    "set exactly_once to a database's name (docs/exactly-once.md)")
            continue
        if not spec.is_async:
            raise ConfigurationError(
                f"listener {spec.name!r}: exactly_once needs an async def handler (its "
                "session is an AsyncSession, used on the event loop)")
        _check_kept(settings, spec)
        if name not in settings.databases:
            known = ", ".join(sorted(settings.databases)) or "none"
            raise ConfigurationError(
                f"listener {spec.name!r}: exactly_once names database {name!r}, which "
                f"`databases` lacks (configured: {known}); add [databases.{name}] with its url")
        slots[name] = slots.get(name, 0) + count
    return {name: Store(Database(name, settings.databases[name], slots=count), producer, owner)
            for name, count in slots.items()}


def _check_kept(settings: Settings, spec: ListenerSpec) -> None:
    """``ConfigurationError`` for a name an exactly-once listener's outbox rows read back that
    is longer than their column keeps (a name in a key is ``tables.fitted`` instead): the
    delivery's broker (a reply goes through it), the error destination (a refused row's)."""
    kept = {"reply_broker": [(f"setting brokers.{name}", name) for name in settings.brokers],
            "error_destination": [(f"listener {spec.name!r}: its error destination",
                                   str(spec.error_destination))]}
    for column, named in kept.items():
        limit = BOUNDED[column]
        for what, value in named:
            if len(value) > limit:
                raise ConfigurationError(
                    f"{what}: a name of {len(value)} characters, more than the {limit} an "
                    f"outbox row of database {spec.options.exactly_once} keeps "
                    f"(mdb_outbox.{column}); give it a shorter one")
