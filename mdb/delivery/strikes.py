"""``Strikes``: how many times settling each message failed outside the handler, counted by one
listener in this process.

A copy the broker refuses (authorization forbids the error destination, ...) never reaches
it, so the message's ``mdb_delivery_count`` cannot count such failures; it is advisory anyway,
a producer may write any count there (docs/security.md). The listener counts them here, per
message identity, and ``mdb.delivery.decision`` gives up on a message with too many
(``MAX_STRIKES``). A strike is one of:

* a settlement of the message the broker refused: it raised while the connection stayed open
  (ActiveMQ refuses a SEND with an ERROR frame and keeps the connection);
* a failed move to the error destination, whatever the error: RabbitMQ refuses such a copy by
  closing the connection. Where a broker confirmed a move it then did not apply, the message
  comes back in doubt as the very delivery it confirmed moved (``redelivered``); else the move
  fails. A message that moves to the error destination was failing anyway, so a broker
  outage during its move costs it at most one strike;
* each time a stuck message is kept (so that the next pause is longer).

A connection lost otherwise strikes nothing: the other messages in flight on it, which come back
in doubt too, are innocent.

The listener also remembers a settlement whose copies the broker all confirmed as stored, but
not its ack (``AcksUnconfirmed``, ``Transaction.commit``), by the message's identity and the
delivery's count (``copied``).
The copies supersede the delivery (a retry copy as the next count, an error copy, a handler's
sends); the delivery, should it come back in doubt, is that very delivery (``redelivered``), and
``mdb.delivery.decision`` has it acked, neither handled nor struck again. A kept copy is not
remembered: it has its original's count, and the original's ack may have been applied after
all, so a kept copy coming back in doubt could not be told from it and would be lost.

The listener also keeps the attempt of each message it has seen a copy of (``attempts``): the
highest ``mdb_delivery_count`` of it handed to the handler, and whether a settlement of that
delivery that supersedes it returned (``AttemptSeen``). On RabbitMQ two copies of one
attempt can be stored: a settlement whose copy's SEND was stored while its receipt was cut off
(a refused copy in another slot closed the connection) leaves its delivery in doubt, and that
delivery comes back and is copied again. The later copy, or an earlier attempt arriving after a
later one, is then told from the first: an attempt settled, or overtaken, is acked unseen (its
settlement's copies, or the later attempt, supersede it); an attempt handed to the handler
and not settled yet is in doubt (re-sent with the next count, not handled twice). Only copies
(a count above 1), and the messages of the table, are looked up: the first delivery of a
message that never failed costs nothing.

The tables are bounded (``CAPACITY`` messages each): the least recently touched message is
forgotten first, which costs it a few more attempts (or one more processing), never the
message. Only messages that failed, or whose ack was lost, enter them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

from mdb.delivery.decision import AttemptSeen, Keep, MoveToError, Outcome
from mdb.errors import AcksUnconfirmed, BrokerError
from mdb.messages.headers import REPLAYS
from mdb.messages.message import Message
from mdb.seam.broker import Delivery

CAPACITY = 10_000

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class History:
    """What a listener remembers of a delivery's message as it arrives
    (``Strikes.history_of``): what ``decision.classify`` needs besides the delivery."""

    strikes: int = 0
    """Its message's strikes, one more if the broker had confirmed moving this very delivery to
    the error destination."""
    copied: bool = False
    """The broker confirmed every copy an earlier settlement of this very delivery sent, not
    its ack."""
    seen: AttemptSeen = AttemptSeen.NEW
    """What the listener saw of its message's delivery attempt."""


NO_HISTORY = History()
"""What a listener remembers of a message it never struck nor saw a copy of."""


def supersedes(outcome: Outcome) -> bool:
    """Whether the copies ``outcome`` sends supersede its delivery, so that its delivery, should
    the broker confirm them and not its ack, is remembered and acked unseen when it comes back
    (``AckLost``): a handler's sends, a retry copy (the next count), an error copy. Not a kept
    copy: it has its delivery's count, and were the delivery's ack applied after all, the kept
    copy coming back in doubt could not be told from it (it is kept again instead)."""
    return not isinstance(outcome, Keep)


def attempt_key(message: Message) -> str:
    """What the attempts of ``message`` are remembered by: its identity, and how many times it
    was replayed from an error destination (``mdb_replays``, ``mdb.commands.dlq.failed``): a replay
    starts its count afresh, and its attempts are not the attempts it failed in."""
    replays = message.headers.get(REPLAYS)
    return message.id if replays is None else f"{message.id}\0replay {replays}"


class Strikes:
    """Strikes per message identity (``mdb.messages.identity``) for one listener; loop thread only.
    Its length is the number of messages with a strike.

    The processor asks it before a delivery is classified (``history_of``) and tells it what became
    of the delivery after (``handing``, ``keeping``, ``settled``, ``not_settled``): the rules of
    when a message is struck, kept, copied or in doubt are all here. The other methods are
    those rules' parts."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._strikes: OrderedDict[str, int] = OrderedDict()
        self._moved: OrderedDict[str, int] = OrderedDict()  # identity -> delivery count
        self._copied: OrderedDict[str, int] = OrderedDict()  # identity -> delivery count
        self._kept: OrderedDict[str, int] = OrderedDict()  # identity -> times kept
        # identity -> (the highest count handed to the handler, whether its settlement returned)
        self._attempts: OrderedDict[str, tuple[int, bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._strikes)

    # -- before and after ------------------------------------------------------------------

    def history_of(self, delivery: Delivery, message: Message) -> History:
        """What this listener remembers of ``delivery``'s message (``message``, as the handler
        sees it): its strikes, and, for a delivery back in doubt, one more if the broker had
        confirmed moving it to the error destination and whether it had confirmed its copies
        (``redelivered``); what it saw of its attempt. Only a copy (a count above 1), or a message
        of the tables, is looked up."""
        count = message.delivery_count
        if delivery.broker_redelivered:
            history = self.redelivered(message.id, count)
        elif self._strikes:
            history = History(self.count(message.id))
        else:
            history = NO_HISTORY  # the first delivery of a message never struck: the usual case
        if count > 1 or self._attempts:
            return History(history.strikes, history.copied,
                            self.attempt_seen(attempt_key(message), count))
        return history

    def handing(self, message: Message) -> None:
        """``message`` goes to the handler: a copy's attempt is remembered as handed."""
        if message.delivery_count > 1:
            self.handed(attempt_key(message), message.delivery_count)

    def keeping(self, message: Message) -> int:
        """``message`` is to be kept (``mdb.delivery.decision.Keep``): struck, so that the next
        pause is longer, and counted as it is decided, before any wait (two copies of one
        message in two slots are then two attempts); how many times it is kept now."""
        self.strike(message.id)
        return self.kept(message.id)

    def settled(self, message: Message, outcome: Outcome) -> None:
        """``outcome`` of ``message`` was carried out: a confirmed move to the error destination
        is remembered (should the broker not apply it, the delivery comes back in doubt), and a
        copy's attempt whose settlement supersedes it is done."""
        count = message.delivery_count
        if isinstance(outcome, MoveToError):
            self.moved(message.id, count)
        if count > 1 and supersedes(outcome):
            self.superseded(attempt_key(message), count)

    def not_settled(self, message: Message, outcome: Outcome | None, error: BrokerError,
                    connection_open: bool) -> None:
        """Carrying ``outcome`` of ``message`` out failed with ``error``, its connection open or
        not by then. Only its acks in doubt (``AcksUnconfirmed``): not the message's doing; its
        copies superseded it, so the very delivery is acked unseen should it come back. A
        refusal strikes the message: one on a connection the broker kept open, or a failed move
        to the error destination (RabbitMQ refuses such a copy by closing the connection). A
        connection lost otherwise strikes nothing: the other messages in flight are innocent."""
        if isinstance(error, AcksUnconfirmed):
            if outcome is not None and supersedes(outcome):
                self.copied(message.id, message.delivery_count)
        elif connection_open or isinstance(outcome, MoveToError):
            self.strike(message.id)

    # -- the rules' parts --------------------------------------------------------------------

    def count(self, key: str) -> int:
        """The strikes of ``key`` (0 for a message never struck, or forgotten)."""
        return self._strikes.get(key, 0)

    def strike(self, key: str) -> int:
        """One more strike for ``key``; how many it has now."""
        return _touch(self._strikes, key, self._strikes.get(key, 0) + 1, self._capacity)

    def moved(self, key: str, delivery_count: int) -> None:
        """The broker confirmed moving delivery ``delivery_count`` of ``key`` to the error
        destination."""
        _touch(self._moved, key, delivery_count, self._capacity)

    def copied(self, key: str, delivery_count: int) -> None:
        """The broker confirmed every copy settling delivery ``delivery_count`` of ``key`` sent
        (a retry copy, an error copy, a handler's sends), not its ack."""
        _touch(self._copied, key, delivery_count, self._capacity)

    def kept(self, key: str) -> int:
        """``key`` is kept once more (``mdb.delivery.decision.Keep``); how many times now. Not
        derived from its strikes, which two copies of one message in two slots (its ack lost
        after its copy was stored) can raise by two before either is kept."""
        return _touch(self._kept, key, self._kept.get(key, 0) + 1, self._capacity)

    def attempt_seen(self, key: str, delivery_count: int) -> AttemptSeen:
        """What this listener saw of delivery attempt ``delivery_count`` of ``key``."""
        seen = self._attempts.get(key)
        if seen is None or delivery_count > seen[0]:
            return AttemptSeen.NEW
        if delivery_count < seen[0] or seen[1]:
            return AttemptSeen.DONE
        return AttemptSeen.HANDED

    @property
    def attempts(self) -> bool:
        """Whether any message's attempt is remembered (else a first delivery need not look)."""
        return bool(self._attempts)

    def handed(self, key: str, delivery_count: int) -> None:
        """A copy of ``key`` (``delivery_count`` above 1) goes to the handler."""
        _touch(self._attempts, key, (delivery_count, False), self._capacity)

    def superseded(self, key: str, delivery_count: int) -> None:
        """A settlement of attempt ``delivery_count`` of ``key`` that supersedes it returned
        (not a kept copy's, which has its attempt's count and would be lost)."""
        if self._attempts.get(key) == (delivery_count, False):
            _touch(self._attempts, key, (delivery_count, True), self._capacity)

    def redelivered(self, key: str, delivery_count: int) -> History:
        """``key`` was redelivered as delivery ``delivery_count``: a strike if the broker
        had confirmed moving that very delivery to the error destination; ``copied`` if it had
        confirmed that delivery's copies. The latter is remembered on: the ack that settles it
        now may be lost in turn."""
        copied = self._copied.get(key) == delivery_count
        if self._moved.get(key) == delivery_count:
            del self._moved[key]
            return History(self.strike(key), copied)
        return History(self.count(key), copied)


def _touch(table: OrderedDict[str, V], key: str, value: V, capacity: int) -> V:
    """Set ``table[key]`` as the most recent entry, forgetting the oldest past ``capacity``."""
    table.pop(key, None)
    table[key] = value
    if len(table) > capacity:
        table.popitem(last=False)
    return value

