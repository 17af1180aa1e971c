"""``MemoryBroker``: the factory registered under the ``memory`` URL scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

import anyio.lowlevel

from mdb.errors import ConfigurationError, ConnectionFailed
from mdb.observability.redaction import redact_url
from mdb.seam.broker import Capabilities, ConnectionOptions, HeaderLimits
from mdb_memory.connection import MemoryConnection
from mdb_memory.state import DEFAULT_NAME, BrokerState, broker_state


def _plain_size(name: str, value: str) -> int:
    return len(name.encode()) + 1 + len(value.encode())


class MemoryBroker:
    """``memory://NAME`` (``memory://`` is ``NAME=default``): every connection to the same
    NAME in this process shares one ``BrokerState``.

    Its ``header_limits`` are as many and as large headers as a STOMP broker surely takes
    (``name:value`` in UTF-8, nothing escaped): the embedded broker stands in for a real one in
    tests, where headers a real broker would refuse should be refused too. Its
    ``capabilities``: atomic transactions, a dead-letter queue that keeps every message
    (``DEAD_LETTER_QUEUE``) and delayed messages held back (``mdb_memory.exchange``), on
    ``mdb.clock``'s time; closing a subscription never closes its connection. It takes no
    ``adapter_options``."""

    header_limits = HeaderLimits(count=512, line=8_192, total=262_144, size=_plain_size)
    capabilities = Capabilities(dead_letters=lambda _: True, cannot_hold_delays=None,
                                assigned_ids=True)

    def __init__(self, options: ConnectionOptions) -> None:
        parts = urlsplit(options.url)
        if parts.scheme != "memory":
            raise ConfigurationError(
                f"broker url {redact_url(options.url)!r}: the memory broker takes 'memory://NAME'"
            )
        if options.tls is not None:
            raise ConfigurationError(
                f"setting brokers.{options.broker}.tls: the memory broker is in this process; "
                "it has no TLS"
            )
        for name in options.adapter_options:
            raise ConfigurationError(
                f"setting brokers.{options.broker}.{name}: the memory broker has one kind of "
                "queue and no setting of its own; this one is another broker's"
            )
        self.options = options
        self.name = parts.netloc or parts.path.strip("/") or DEFAULT_NAME

    def __repr__(self) -> str:
        return f"MemoryBroker({self.name!r})"

    @property
    def state(self) -> BrokerState:
        return broker_state(self.name)

    async def connect(self) -> MemoryConnection:
        await anyio.lowlevel.checkpoint()
        state = broker_state(self.name)
        if state.refusing_connections:
            state.exchange.refused += 1
            state.exchange.notify()
            raise ConnectionFailed(f"memory broker {self.name!r} refuses connections")
        connection = MemoryConnection(state, self.capabilities)
        state.exchange.attach(connection.session)
        return connection
