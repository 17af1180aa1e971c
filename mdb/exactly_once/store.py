"""``Store``: one database of a container's exactly-once listeners, with its upkeep.

The upkeep runs beside the pool slots: it sweeps the outbox (rows whose lease ran out: their
process died, or their broker was down) and purges inbox rows past ``inbox_retention``, a
small batch at a time so that it never holds up a delivery's claim for long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import anyio

from mdb.destinations import Destination
from mdb.errors import BrokerError, ConfigurationError, DatabaseUnavailable
from mdb.exactly_once import inbox, tables
from mdb.exactly_once.database import Database
from mdb.exactly_once.guard import Guard
from mdb.exactly_once.outbox import Dispatcher
from mdb.listener import ListenerSpec
from mdb.producer import Producer
from mdb.settings import Settings

log = logging.getLogger("mdb.outbox")

PURGE_BATCH = 500


class Store:
    """``database`` as the process ``owner`` uses it: its dispatcher sends through
    ``producer``."""

    def __init__(self, database: Database, producer: Producer, owner: str) -> None:
        self.database = database
        self.owner = owner
        self.dispatcher = Dispatcher(database, producer, owner)

    def guard(self, *, listener: str, subscription: str, broker: str,
              error_destination: Destination) -> Guard:
        """The database side of ``listener``'s deliveries from ``subscription`` on
        ``broker`` (``Guard``)."""
        return Guard(self, listener=listener, subscription=subscription, broker=broker,
                     error_destination=error_destination)

    async def check(self) -> None:
        """``ConfigurationError`` when mdb's tables are missing (``mdb db upgrade``), or the
        database cannot be reached at startup."""
        try:
            with self.database.deadline():
                await tables.check(self.database.engine, self.database.name)
        except DatabaseUnavailable as exc:
            raise ConfigurationError(f"{exc}; is the database running, and is "
                                     f"databases.{self.database.name}.url right?") from None

    async def upkeep(self) -> None:
        """Sweep the outbox and purge the inbox for ever, every third of the outbox lease.
        An unavailable database or broker is tried again next time (logged once per
        outage)."""
        settings = self.database.settings
        failing: str | None = None
        while True:
            try:
                while await self.dispatcher.sweep():
                    pass
                async with self.database.session() as session:
                    with self.database.deadline():
                        await inbox.purge(session, time.time() - settings.inbox_retention,
                                          PURGE_BATCH)
            except (DatabaseUnavailable, BrokerError) as exc:
                if failing is None:
                    log.warning("outbox of database %s: cannot dispatch or purge now (%s); "
                                "trying again every %.0f s", self.database.name, exc,
                                settings.outbox_lease / 3)
                failing = str(exc)
            else:
                if failing is not None:
                    log.warning("outbox of database %s: dispatching again", self.database.name)
                failing = None
            await anyio.sleep(settings.outbox_lease / 3)

    async def close(self) -> None:
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
