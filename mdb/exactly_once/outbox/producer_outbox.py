"""``Outbox``: a producer's sends written in the caller's own database transaction, and
forwarded once it committed: a web request's row and its event commit together, and while
every member of a destination is down the messages wait in the outbox (store-and-forward).

It lives here and not on ``Producer``: the producer is below the databases (the command, the
Spark sink and scripts use it without SQLAlchemy), and the outbox needs a database's settings
(lease, timeout) and a dispatcher whose state (rows waiting, one sweep at a time) outlives
one send.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.errors import BrokerError, ConfigurationError
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.outbox.writer import Writer
from mdb.exactly_once.store import Store
from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import addressed
from mdb.routing.producer import Producer

log = logging.getLogger("mdb.outbox")


class Outbox:
    """The outbox of ``producer`` in database ``database`` of its settings' ``databases``
    (the only one when not named)::

        async with Producer(settings) as producer, Outbox(producer) as outbox:
            async with sessions() as session, session.begin():
                session.add(OrderRow(...))
                await outbox.send(session, "queue:orders", order, key=order.customer)
            await outbox.dispatch()                      # after the commit

    ``send`` only writes; ``dispatch`` sends what committed, ``forward`` (a task of the
    application's, e.g. a web app's lifespan) sends what waits, every third of the
    database's ``outbox_lease``; a container of the application whose listeners use the
    database sweeps it too (docs/exactly-once.md, "Producers: the outbox and
    store-and-forward")."""

    def __init__(self, producer: Producer, database: str | None = None) -> None:
        settings = producer.brokers.settings
        databases = settings.databases
        if database is None and len(databases) == 1:
            [database] = databases
        if database is None or database not in databases:
            known = ", ".join(sorted(databases)) or "none"
            raise ConfigurationError(
                f"an outbox needs a database of the settings' `databases` (configured: "
                f"{known}){'' if database is None else f'; {database!r} is not one'}")
        self.database = Database(database, databases[database])
        owner = f"{settings.app}.{settings.server}.outbox.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._store = Store(self.database, producer, owner)
        self._brokers = producer.brokers
        self._failing = False

    async def send(
        self, session: AsyncSession, destination: str | Destination, body: object,
        headers: Mapping[str, str] | None = None, *, key: str | None = None,
        reply_to: str | Destination | None = None, correlation_id: str | None = None,
    ) -> str:
        """Write ``body`` (as ``Producer.send`` would send it) to the outbox in
        ``session``'s transaction; return its ``mdb_id``. Nothing is sent until that
        transaction committed and ``dispatch`` (or a sweep) ran; a rolled back transaction
        sends nothing. ``key`` picks the member and keeps order among the rows of its
        destination."""
        self._check(session)
        message = addressed(codec.outgoing(body, headers, limits=self._brokers.header_limits),
                            reply_to, correlation_id)
        writer = Writer(session, self._store.owner, self.database.settings.outbox_lease,
                        error_destination=None)
        await writer.send(Destination.parse(destination), message, key)
        return message.headers[ID]

    async def dispatch(self) -> int:
        """Send the messages of this outbox whose transactions committed, and those waiting
        past their lease, in the order they were written; how many were sent. A broker that
        cannot take them is not an error here: they wait in the outbox (logged once per
        outage) for the next ``dispatch``, ``forward`` or a container's sweep. While the
        last attempt failed, a dispatch that finds another under way returns at once: only
        one caller at a time waits for the broker (``send_wait_for_reconnect``), not every
        web request. Raises ``DatabaseUnavailable`` when the database is out of reach."""
        dispatcher = self._store.dispatcher
        if self._failing and dispatcher.busy:
            return 0
        try:
            sent = await dispatcher.forward()
        except BrokerError as exc:
            if not self._failing:
                log.warning("outbox of database %s: messages wait until they can be sent "
                            "(%s)", self.database.name, exc)
            self._failing = True
            return 0
        if self._failing:
            log.warning("outbox of database %s: sending again", self.database.name)
        self._failing = False
        return sent

    async def forward(self) -> None:
        """Forward what waits in the outbox for ever, every third of ``outbox_lease`` (and
        purge old inbox rows), as a container does: run it as a task beside the
        application."""
        await self._store.upkeep()

    def _check(self, session: AsyncSession) -> None:
        """``ConfigurationError`` when ``session`` writes elsewhere than the database this
        outbox dispatches from: its rows would never be sent."""
        if _place(session.get_bind().engine.url) != _place(self.database.engine.url):
            raise ConfigurationError(
                f"the session writes to another database than databases.{self.database.name} "
                f"({self.database.shown}), which this outbox dispatches from")

    async def close(self) -> None:
        await self.database.close()

    async def __aenter__(self) -> Outbox:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()


def _place(url: URL) -> tuple[str, str | None, int | None, str | None]:
    database = url.database
    if url.get_backend_name() == "sqlite" and database and database != ":memory:":
        database = str(Path(database).resolve())
    return url.get_backend_name(), url.host, url.port, database
