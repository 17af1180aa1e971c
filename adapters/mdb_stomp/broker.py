"""``StompBroker``: the factory registered under ``stomp+activemq`` and ``stomp+rabbitmq``."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from mdb.broker import ConnectionOptions
from mdb.errors import ConfigurationError
from mdb.redaction import redact_url
from mdb_stomp.connection import StompConnection
from mdb_stomp.dialect import DIALECTS
from mdb_stomp.wire import Wire

DEFAULT_PORT = 61613


class StompBroker:
    """``Broker`` for ``stomp+<dialect>://host[:port]`` URLs (``stomp+activemq``,
    ``stomp+rabbitmq``).

    Construction validates the URL (``ConfigurationError``); ``connect`` opens one STOMP 1.2
    connection with heartbeats of ``heartbeat_ms`` both ways. No ``client-id`` is sent: ActiveMQ
    refuses a second connection with the same one, and the container opens several.
    """

    def __init__(self, options: ConnectionOptions) -> None:
        parts = urlsplit(options.url)
        dialect = DIALECTS.get(parts.scheme)
        if dialect is None:
            raise ConfigurationError(
                f"broker url {redact_url(options.url)!r}: mdb_stomp serves "
                f"{', '.join(sorted(DIALECTS))}"
            )
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ConfigurationError(
                f"broker url {redact_url(options.url)!r}: invalid port") from None
        if not parts.hostname:
            raise ConfigurationError(
                f"broker url {redact_url(options.url)!r} must be written '{parts.scheme}://HOST:PORT'"
            )
        self._options = options
        self._dialect = dialect()
        self.system = dialect.broker.lower()  # messaging.system: activemq, rabbitmq
        self._host: str = parts.hostname
        self._port: int = port
        self._username = options.username if options.username is not None else parts.username
        self._password = options.password if options.password is not None else parts.password

    async def connect(self) -> StompConnection:
        """Open a connection; raises ``ConnectionFailed`` (refused, bad credentials, or no
        CONNECTED frame within ``connect_timeout``)."""
        wire = Wire(
            self._options, self._host, self._port, self._dialect.vhost, asyncio.get_running_loop()
        )
        await wire.open(self._username, self._password)
        return StompConnection(wire, self._dialect)
