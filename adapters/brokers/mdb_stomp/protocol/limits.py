"""The headers a STOMP broker surely takes in one message (``HEADER_LIMITS``, the adapter's
``Broker.header_limits``), sized as STOMP 1.2 writes a header line.

Measured with raw STOMP 1.2 SENDs: ActiveMQ 5.17 refuses a frame of 1,000 header lines or more,
or one header line of 10,240 bytes or more, by dropping the connection
(``mdb_stomp.dialects.activemq``); RabbitMQ 3.10 took 2,000 headers, one of 200 KB and 1.6 MB in all
(``mdb_stomp.dialects.rabbitmq``). The limits are one set for both, well inside ActiveMQ's: the room
left is for the lines the adapter and the tracing add to a SEND (destination, transaction,
receipt, persistence, traceparent, ...).
"""

from __future__ import annotations

from mdb.seam.broker import HeaderLimits

_ESCAPED = "\\\r\n:"  # STOMP 1.2 writes each of these as two bytes


def line_bytes(name: str, value: str) -> int:
    """The size of ``name:value`` as a STOMP 1.2 header line, escapes included."""
    return (len(name.encode()) + 1 + len(value.encode())
            + sum(value.count(c) + name.count(c) for c in _ESCAPED))


HEADER_LIMITS = HeaderLimits(count=512, line=8_192, total=262_144, size=line_bytes)
