"""``Unsettled``: one subscription's deliveries not yet settled, and which acks may be written.

Cumulative acks. ActiveMQ subscriptions use ``ack:client`` (see ``mdb_stomp.dialects.activemq``),
where an ACK settles every earlier delivery of the subscription too. ActiveMQ dispatches the next
message as soon as it sees a transacted ACK, before the COMMIT, and an ABORT leaves the acked
message unsettled on the live subscription: a later ACK of the next message would then silently
settle the aborted one, which is never redelivered (measured on 5.17.2). Each subscription therefore
tracks its unsettled deliveries in dispatch order and refuses, with ``BrokerError`` and before
anything is written, an ack that would settle an earlier delivery not settled in the same
transaction. The caller settles (or requeues) the earlier one first, or closes the subscription
so the broker redelivers it. Subscriptions with individual acks (``client-individual``, used on
RabbitMQ) skip that ordering check; the other checks (already settled, held by another open
transaction) stay.
"""

from __future__ import annotations

from mdb.errors import BrokerError


class Unsettled:
    """Ack ids in dispatch order, each mapped to the open transaction that acked it, or None.
    Settled ones leave. Pure bookkeeping: it writes nothing. A transaction is any object,
    compared by identity."""

    def __init__(self, *, cumulative: bool) -> None:
        # ``ack:client`` (cumulative) needs the ordering check of ``_check``; individual acks not.
        self._cumulative = cumulative
        self._holders: dict[str, object | None] = {}

    @property
    def cumulative(self) -> bool:
        """Whether an ACK settles the earlier deliveries too (``ack:client``)."""
        return self._cumulative

    def __len__(self) -> int:
        return len(self._holders)

    def dispatched(self, ack_id: str) -> None:
        """A delivery arrived: unsettled, held by no transaction."""
        self._holders[ack_id] = None

    def claim(self, ack_id: str, transaction: object) -> None:
        """Record that ``transaction`` acks ``ack_id``; ``BrokerError`` if it may not (see
        ``_check``)."""
        self._check(ack_id, transaction)
        self._holders[ack_id] = transaction

    def settle_alone(self, ack_id: str) -> None:
        """Record a non-transacted ACK of ``ack_id``: only an unheld one, and with cumulative
        acks only the oldest unsettled one; else ``BrokerError``."""
        self._check(ack_id, None)
        del self._holders[ack_id]

    def end_claims(self, transaction: object, settled: bool) -> None:
        """``transaction`` ended: its acks are settled (a confirmed commit) or unheld again."""
        for ack_id, holder in list(self._holders.items()):
            if holder is transaction:
                if settled:
                    del self._holders[ack_id]
                else:
                    self._holders[ack_id] = None

    def _check(self, ack_id: str, transaction: object | None) -> None:
        if ack_id not in self._holders:
            raise BrokerError(f"delivery {ack_id} was already settled")
        for earlier, holder in self._holders.items() if self._cumulative else ():
            if earlier == ack_id:
                break
            if transaction is None or holder is not transaction:
                raise BrokerError(
                    f"acking delivery {ack_id} would also settle the earlier delivery {earlier} "
                    "of the same subscription (client acks are cumulative); settle that one "
                    "first, or close the subscription so the broker redelivers it"
                )
        holder = self._holders[ack_id]
        if holder is not None and holder is not transaction:
            raise BrokerError(f"delivery {ack_id} is already acked in an open transaction")
