"""A standalone producer: send messages from outside any handler (scripts, web requests)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from mdb import codec
from mdb.destinations import Destination
from mdb.links import BrokerLink
from mdb.message import ID
from mdb.settings import Settings


class Producer:
    """``async with Producer(settings) as p: await p.send("queue:orders", {...})``.

    Each send waits for the broker's receipt. It raises ``SendOutcomeUnknown`` when none came
    (the message may still arrive: do not blindly resend) and ``ConnectionLost`` or
    ``ConnectionFailed`` when it surely was not sent.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._links: dict[str, BrokerLink] = {}

    async def send(
        self, destination: str | Destination, body: object,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Send ``body``; return its ``mdb_id``."""
        dest = Destination.parse(destination)
        name = self._settings.broker_of(dest)
        link = self._links.get(name)
        if link is None:
            link = self._links[name] = BrokerLink(
                name, self._settings.brokers[name],
                f"{self._settings.app}.{self._settings.server}.producer")
        connection = await link.connect()
        message = codec.outgoing(body, headers)
        await connection.send(dest, message)
        return message.headers[ID]

    async def close(self) -> None:
        for link in self._links.values():
            await link.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
