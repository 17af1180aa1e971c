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
from collections.abc import Iterable

import anyio

from mdb.destinations import Destination
from mdb.errors import BrokerError, ConfigurationError, DatabaseUnavailable
from mdb.exactly_once import inbox, tables
from mdb.exactly_once.database import Database, at_startup
from mdb.exactly_once.guard import Guard
from mdb.exactly_once.outbox import Dispatcher, backlog
from mdb.health import DatabaseHealth
from mdb.listener import ListenerSpec
from mdb.producer import Producer
from mdb.settings import Settings

log = logging.getLogger("mdb.outbox")

PURGE_BATCH = 500
OUTAGE_PROBE = 1.0
"""Seconds between the upkeep's tries while its database is down, at most."""


class Store:
    """``database`` as the process ``owner`` uses it: its dispatcher sends through
    ``producer``."""

    def __init__(self, database: Database, producer: Producer, owner: str) -> None:
        self.database = database
        self.owner = owner
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


def stores_for(settings: Settings, specs: Iterable[ListenerSpec], producer: Producer,
               owner: str) -> dict[str, Store]:
    """A store per database an exactly-once listener among ``specs`` names; a
    ``ConfigurationError`` for a name ``databases`` lacks."""
    stores: dict[str, Store] = {}
    for spec in specs:
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
        if name in stores:
            continue
        if name not in settings.databases:
            known = ", ".join(sorted(settings.databases)) or "none"
            raise ConfigurationError(
                f"listener {spec.name!r}: exactly_once names database {name!r}, which "
                f"`databases` lacks (configured: {known}); add [databases.{name}] with its url")
        stores[name] = Store(Database(name, settings.databases[name]), producer, owner)
    return stores
