"""``Writer``: the sends of one transaction written as outbox rows in it, checked first (a body
larger than mdb sends, a value longer than its column keeps) so that a send is refused at once,
not at the commit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import BigInteger, String, bindparam, delete, func
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.errors import EncodeError
from mdb.exactly_once.outbox.rows import Row, forget
from mdb.exactly_once.tables import outbox
from mdb.listeners.context import SendFunction
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import MAX_BODY_BYTES, OutgoingMessage, ReplyAddress, ReplyTo

# Built once: a statement built per call costs its cache key again at every execution.
_WRITE = outbox.insert().returning(outbox.c.seq, sort_by_parameter_order=True)
# On PostgreSQL the delete of the rows sent before rides in the write's statement (a
# data-modifying WITH): a round trip less per run. An array, not an expanding IN, so that
# the statement takes a list of rows (each names the same array).
_WRITE_FORGETTING = _WRITE.add_cte(delete(outbox).where(
    outbox.c.seq == func.any(bindparam("forgotten", type_=ARRAY(BigInteger)))).cte("forgotten"))


class Writer:
    """The sends of one transaction (a handler's run, a batch's, or a producer's session),
    written as rows leased to ``owner``, which dispatches them once the transaction committed.
    ``broker`` is the delivery's (``Row.broker``). A handler's sends are held and written
    together, in one statement, before mdb commits (``sends_for``, ``write``); a producer's
    ``send`` writes its row at once, in a transaction mdb does not end."""

    def __init__(self, session: AsyncSession, owner: str, lease: float, *,
                 error_destination: Destination | None, broker: str | None = None) -> None:
        self._session = session
        self._owner = owner
        self._lease = lease
        self._error_destination = error_destination
        self._broker = broker
        # A held row: its values, and what its ``Row`` keeps of the send.
        self._held: list[tuple[dict[str, Any], ReplyTo, str | None, OutgoingMessage,
                               Destination]] = []
        self.rows: list[Row] = []

    async def send(self, target: ReplyTo, message: OutgoingMessage, key: str | None) -> None:
        """Write a row for ``message`` now (a ``mdb.listeners.context.SendFunction``)."""
        self._hold(target, message, key, None)
        await self.write()

    def sends_for(self, source: str) -> SendFunction:
        """The sends of the delivery whose inbox key is ``source``: held until ``write``."""
        async def send(target: ReplyTo, message: OutgoingMessage, key: str | None) -> None:
            self._hold(target, message, key, source)
        return send

    async def write(self, forgetting: Sequence[int] = ()) -> None:
        """Write the rows held, in one statement, in the order they were sent, and delete the
        rows ``forgetting`` (sent: ``Dispatcher.sent``): on PostgreSQL in the same
        statement."""
        held, self._held = self._held, []
        folded = bool(held and forgetting) and self._session.get_bind().dialect.name == (
            "postgresql")
        if not folded:
            await forget(self._session, forgetting)
        if not held:
            return
        if folded:
            statement, rows = _WRITE_FORGETTING, [
                {**values, "forgotten": list(forgetting)} for values, *_ in held]
        else:
            statement, rows = _WRITE, [values for values, *_ in held]
        seqs = (await self._session.execute(statement, rows)).scalars()
        for seq, (values, target, key, message, errors) in zip(seqs, held, strict=True):
            self.rows.append(Row(seq, target, self._broker, key, message, len(message.body),
                                 errors, values["lease_until"]))

    def _hold(self, target: ReplyTo, message: OutgoingMessage, key: str | None,
              source: str | None) -> None:
        """Check ``message`` (refused with ``EncodeError`` at the send, not at the commit) and
        hold its row's values."""
        now = time.time()
        errors = self._error_destination or (
            target if isinstance(target, Destination) else REPLIES).error_queue
        reply = isinstance(target, ReplyAddress)
        values = {
            "message_id": message.headers.get(ID, ""), "source": source,
            "destination": None if reply else str(target),
            "reply_broker": self._broker,
            "reply_address": str(target) if reply else None, "member_key": key,
            "body": message.body, "headers": json.dumps(dict(message.headers)),
            "reply_to": None if message.reply_to is None else str(message.reply_to),
            "correlation_id": message.correlation_id, "error_destination": str(errors),
            "created_at": now, "owner": self._owner, "lease_until": now + self._lease,
            "attempts": 0,
        }
        _refuse_too_long(values)
        size = len(message.body)
        if size > MAX_BODY_BYTES:
            raise EncodeError(f"a body of {size} bytes, more than the {MAX_BODY_BYTES >> 20} MiB "
                              "an outbox row keeps: a broker refuses a larger message by "
                              "dropping the connection (docs/exactly-once.md)")
        self._held.append((values, target, key, message, errors))


# The columns of a row that hold text of bounded length, and what a user calls each. A
# producer sets a reply's address and correlation id (its request's reply-to and
# correlation-id), and a handler may take a key from a message: all of them are checked
# before the database, whose own refusal would name no header (PostgreSQL) or never come
# (SQLite keeps text of any length).
BOUNDED = {column.name: column.type.length for column in outbox.c
            if isinstance(column.type, String) and column.type.length is not None}
_CALLED = {"correlation_id": "correlation-id", "reply_address": "reply-to",
           "reply_to": "reply-to", "member_key": "key", "message_id": ID,
           "error_destination": "error destination"}


def _refuse_too_long(values: Mapping[str, object]) -> None:
    """``EncodeError`` naming the first value longer than its column keeps (never the value:
    it is a producer's)."""
    for column, limit in BOUNDED.items():
        value = values.get(column)
        if isinstance(value, str) and len(value) > limit:
            raise EncodeError(f"{_CALLED.get(column, column)}: {len(value)} characters, more "
                              f"than the {limit} an outbox row keeps (docs/exactly-once.md)")


REPLIES = Destination.parse("queue:mdb.replies")
"""What stands for a reply address when its refused row's error destination is chosen (a
producer's ``Outbox`` names none): ``queue:mdb.replies.DLQ``."""
