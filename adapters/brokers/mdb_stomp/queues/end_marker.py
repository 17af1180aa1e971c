"""``EndMarker``: how a browse or a take over STOMP knows it reached the end of a queue.

A consumer over STOMP cannot ask how many messages a queue holds, nor be told it has none left:
it can only wait for the next. So a browse without a broker's browser (``mdb_stomp.read_back``)
and a take (``mdb_stomp.queues.take``) first send a marker of their own to the back of the queue,
and end when it comes. They know it by a value drawn for them alone, never sent anywhere else
before, so a message a producer sent with the same header, or a marker some other browse or
take left behind (its process killed), is a message like any other: seen, taken, never
dropped. Each removes its own marker before it ends, however it ends but with its connection.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from mdb.errors import BrokerError
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.frames import send_frame
from mdb_stomp.protocol.receipts import ReceiptErrors
from mdb_stomp.protocol.wire import Wire

HEADER = "mdb_end_marker"
"""The header whose value tells a marker: its own browse's or take's only."""
ID_PREFIX = "mdb-end-marker-"
"""How a marker's ``mdb_id`` begins: what it is, not which it is."""


class EndMarker:
    """One browse's or take's marker, by a value of its own."""

    def __init__(self) -> None:
        self._value = secrets.token_hex(16)

    def __repr__(self) -> str:
        return "<EndMarker>"  # its value is known to its browse or take only

    def ends(self, headers: Mapping[str, str]) -> bool:
        """Whether the MESSAGE frame with ``headers`` is this marker."""
        return secrets.compare_digest(headers.get(HEADER, ""), self._value)

    async def send(self, wire: Wire, dialect: Dialect, queue: Destination) -> None:
        """SEND it, persistent, to the back of ``queue`` and wait for the receipt (behind
        every message sent before, on any broker); ``BrokerError`` when it was not stored."""
        # Its id says what it is, to an operator who finds one its process left behind.
        marker = OutgoingMessage(b"", {ID: f"{ID_PREFIX}{secrets.token_hex(8)}",
                                       HEADER: self._value})
        headers = send_frame(queue, marker, dialect)
        assert headers is not None  # not a copy: nothing expires it
        await wire.request("SEND", headers, errors=ReceiptErrors(
            f"the end marker of a browse or take of {queue}", refused=BrokerError,
            unconfirmed=BrokerError))
