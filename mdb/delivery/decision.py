"""What becomes of a delivery, decided purely: no I/O, no event loop, no broker.

The container, not the broker, owns redelivery (ActiveMQ over STOMP gives no delivery count
and does not redeliver an aborted ack on a live subscription). A failed delivery is settled by
acknowledging it and, in the same transaction, re-sending a copy to the subscription's own
queue with ``mdb_delivery_count`` one higher — or, past the limit, to the error destination.
The count therefore lives in the message and survives a crash of the process. A delivery the
broker flags redelivered had an unknown outcome (a process died or a connection dropped while
holding it): it counts as a failed delivery and is re-sent the same way before being processed,
so even a message that kills the process cannot loop forever.

What fails outside the handler cannot be counted in the message (a copy the broker refuses
leaves it as it was, and it comes back flagged redelivered): each listener counts in the
process how often settling a message failed by the broker's doing (``mdb.delivery.strikes``). At
``MAX_STRIKES`` the message moves to the error destination whatever its count says; past it,
to the broker's own dead-letter queue where the broker surely keeps it there (``DeadLetter``),
else it stays with its subscription behind growing pauses (``Keep``).

Two pure steps, shared by a delivery processed on its own and by a batch:

* ``classify`` says once what a delivery is, before any handler runs: ``Fresh`` (for the
  handler), ``NotSelected``, ``AckLost``, ``AlreadyProcessed``, ``InDoubt``, ``Unreadable``
  or ``Stuck``;
* ``decide`` maps (the message, what happened to it — the class, or what the handler run made
  of a fresh one —, the listener's ``Policy``) to an ``Outcome``, every one of them:
  ``Settle``, ``Filter``, ``Redeliver``, ``MoveToError``, ``DeadLetter`` or ``Keep``, with
  the headers of any copy to send, already within the policy's header limits
  (``mdb.copies``).

``mdb.delivery.processor`` carries the outcome out, in one place.
"""

from __future__ import annotations

import enum
import re
import traceback
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import ClassVar, overload

from mdb import codec
from mdb import message as headers_
from mdb.broker import Delivery, HeaderLimits, Problem, ProblemKind, never
from mdb.copies import ERROR_TYPE_LIMIT, bounded, error_text, with_failure
from mdb.destinations import Destination
from mdb.errors import error_type
from mdb.identity import identity_key
from mdb.message import Message
from mdb.options import Redelivery

FRAMES_LIMIT = 4000  # characters of a handler's traceback frames kept for logs and spans
MAX_STRIKES = 3
"""A message whose settlement failed this many times by the broker's doing (``Stuck``) moves to
the error destination; one more, and it is given up to the broker's dead-letter queue (or
kept)."""
MAX_DELIVERY_COUNT = 1_000_000_000
"""The highest delivery count read from a header: above any ``Redelivery.limit``, and small
enough for every span attribute and header that shows it."""
_WHOLE = re.compile(r"\s*(?P<sign>[+-]?)0*(?P<digits>[0-9]+)\s*")


def to_message(delivery: Delivery, destination: Destination) -> Message:
    """``delivery`` as the handler sees it: from the listener's logical ``destination``, whatever
    member or re-send queue it came through, known by its identity (``mdb.identity``), which
    every copy of it carries on. Its count is ``mdb_delivery_count`` (1 when absent or not a
    whole number; at most ``MAX_DELIVERY_COUNT``)."""
    h = delivery.headers
    count = _count(h.get(headers_.DELIVERY_COUNT))
    return Message(
        id=identity_key(delivery),
        destination=destination,
        body=delivery.body,
        headers=h,
        redelivered=count > 1 or delivery.broker_redelivered,
        delivery_count=count,
        reply_to=delivery.reply_to,
        correlation_id=delivery.correlation_id,
    )


def _count(text: str | None) -> int:
    """The count a header says, read as untrusted input: any producer may set it (the count is
    advisory, docs/security.md), so any text gives a count in ``1..MAX_DELIVERY_COUNT``: a
    whole number is clamped to that range, whatever its length, anything else counts as 1."""
    whole = None if text is None else _WHOLE.fullmatch(text)
    if whole is None or whole["sign"] == "-":
        return 1
    digits = whole["digits"]
    # Judged by length before int() reads it: int() refuses more than a few thousand digits.
    if len(digits) > len(str(MAX_DELIVERY_COUNT)):
        return MAX_DELIVERY_COUNT
    return min(max(int(digits), 1), MAX_DELIVERY_COUNT)


class Round(enum.Enum):
    """What the listener has seen of a message's round (its copies of one delivery count)."""

    NEW = "new"
    """No copy of this round or a later one reached this listener (or it was forgotten)."""
    HANDED = "handed"
    """A copy of this round went to the handler; no settlement of it returned (yet)."""
    DONE = "done"
    """A settlement of this round that carries the message on returned, or a later round
    reached this listener: the message is carried on without this copy."""


@dataclass(frozen=True, slots=True)
class Recalled:
    """What a listener remembers of a delivery's message as it arrives
    (``mdb.delivery.strikes.Strikes.recall``): what ``classify`` needs besides the delivery."""

    strikes: int = 0
    """Its message's strikes, one more if the broker had confirmed moving this very delivery to
    the error destination."""
    copied: bool = False
    """The broker confirmed every copy an earlier settlement of this very delivery sent, not
    its ack."""
    seen: Round = Round.NEW
    """What the listener saw of its message's round."""


NOTHING = Recalled()
"""What a listener remembers of a message it never struck nor saw a copy of."""


# -- what happened -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Succeeded:
    """The handler returned (and the sends it made outside the transaction were made)."""


@dataclass(frozen=True, slots=True)
class AlreadyProcessed:
    """A copy of a message already processed, settled without running the handler: an
    exactly-once listener's inbox holds it, its run committed (docs/exactly-once.md); or a
    copy of a round this listener settled, or of an earlier round than one it saw
    (``mdb.delivery.strikes``, ``Round.DONE``)."""


@dataclass(frozen=True, slots=True)
class NotSelected:
    """A topic listener's selector rejects the message: it is settled unseen (see
    ``mdb.planning``)."""


@dataclass(frozen=True, slots=True)
class AckLost:
    """The broker flagged the delivery redelivered, and it is the very delivery whose earlier
    settlement's copies were stored, not its ack (``Strikes.copied``): those copies carry the
    message on, so it is acked unseen, neither handled nor struck again."""


@dataclass(frozen=True, slots=True)
class InDoubt:
    """The broker flagged the delivery redelivered: an earlier delivery's outcome is unknown.
    It is re-sent at once, with the count raised, before the handler sees it."""

    error_type: ClassVar[str] = "mdb.InDoubt"
    text: ClassVar[str] = "an earlier delivery's outcome is unknown (process or connection lost)"


@dataclass(frozen=True, slots=True)
class Undecodable:
    """The body does not decode into the handler's annotation; retrying cannot fix that."""

    text: str
    error_type: ClassVar[str] = "mdb.DecodeError"


@dataclass(frozen=True, slots=True)
class Unreadable:
    """The adapter could not hand the message over as its sender sent it (``Delivery.problem``:
    a damaged frame, a kind of message its protocol cannot carry): like a body that does not
    decode, it is never given to the handler nor retried; it moves to the error destination
    at once, the problem's kind as its error type."""

    problem: Problem

    @property
    def error_type(self) -> str:
        return self.problem.kind.value

    @property
    def text(self) -> str:
        return self.problem.text

    @property
    def damaged(self) -> bool:
        return self.problem.kind is ProblemKind.DAMAGED


@dataclass(frozen=True, slots=True)
class Reused:
    """An exactly-once listener's inbox knows the message's identity from another message
    (``mdb.errors.IdentityReused``, ``text`` saying which): not a copy of it, so neither
    settled as one nor run; like a body that does not decode, it moves to the error
    destination at once."""

    text: str
    error_type: ClassVar[str] = "mdb.IdentityReused"


@dataclass(frozen=True, slots=True)
class Raised:
    """The handler raised, or a send it made outside the transaction failed."""

    error_type: str
    text: str
    frames: str = field(default="", compare=False, repr=False)
    """Where it was raised: the traceback's frames, code only (no exception text, which may
    hold the body; ``text`` is what may be shown of it)."""

    @classmethod
    def of(cls, exc: BaseException) -> Raised:
        """What ``exc`` says, bounded for every place that shows it (logs, span status, error
        headers), even for an exception that cannot be rendered; a pydantic
        ``ValidationError`` without the values it was given, which are often the body
        (``codec.describe``)."""
        frames = "".join(traceback.format_tb(exc.__traceback__))
        if len(frames) > FRAMES_LIMIT:  # the innermost frames, where it was raised
            frames = "  ...\n" + frames[-FRAMES_LIMIT:].partition("\n")[2]
        return cls(error_text(error_type(exc), ERROR_TYPE_LIMIT), codec.describe(exc), frames)

    @property
    def traceback(self) -> str:
        """The traceback as Python prints it, with ``text`` in place of the exception's own;
        "" when there are no frames."""
        return (f"Traceback (most recent call last):\n{self.frames}{self.error_type}: "
                f"{self.text}" if self.frames else "")


@dataclass(frozen=True, slots=True)
class Stuck:
    """Settling the message failed ``strikes`` times outside the handler, by the broker's
    doing (it refused the copy, ``mdb.delivery.strikes``). The handler does not see it again.
    ``dead_letter``: the broker surely keeps it on its own dead-letter queue
    (``Capabilities.dead_letters``)."""

    strikes: int
    dead_letter: bool
    error_type: ClassVar[str] = "mdb.Stuck"

    @property
    def text(self) -> str:
        return (f"settling it failed {self.strikes} times outside the handler (a copy the "
                "broker refuses: may mdb's user write the error destination?)")


@dataclass(frozen=True, slots=True)
class Fresh:
    """A delivery for the handler. ``struck``: settling its message failed before, by the
    broker's doing (``mdb.delivery.strikes``): it is processed on its own, never in a batch."""

    struck: bool = False


Failure = InDoubt | Undecodable | Unreadable | Reused | Raised | Stuck
Kind = Fresh | NotSelected | AckLost | AlreadyProcessed | InDoubt | Unreadable | Stuck
"""What a delivery is before any handler runs (``classify``)."""
Happened = Succeeded | AlreadyProcessed | NotSelected | AckLost | Failure
"""What ``decide`` decides on: the class of a delivery that does not go to the handler, or
what the handler's run made of one that did."""

SUCCEEDED = Succeeded()
ALREADY_PROCESSED = AlreadyProcessed()
FRESH = Fresh()
STRUCK = Fresh(struck=True)
NOT_SELECTED = NotSelected()
ACK_LOST = AckLost()
IN_DOUBT = InDoubt()


def classify(delivery: Delivery, *, selected: bool, strikes: int, copied: bool = False,
             seen: Round = Round.NEW,
             dead_letters: Callable[[Delivery], bool] = never) -> Kind:
    """What ``delivery`` is, whose message was struck ``strikes`` times
    (``mdb.delivery.strikes``) and is ``selected`` or not by the subscription's selector;
    ``copied``: the broker confirmed the copies of an earlier settlement of this very delivery,
    not its ack (``Strikes.came_back``); ``seen``: what the listener saw of its message's round
    (``Strikes.round``); ``dead_letters``: the broker's ``Capabilities.dead_letters``, asked
    of a stuck delivery only. In this order: its ack lost, if it came back flagged redelivered
    after such a settlement (whatever else it is: its copies carry it on); already processed, a
    copy of a round settled or overtaken (carried on without it); stuck at ``MAX_STRIKES``;
    unreadable; not selected (settled unseen, see ``mdb.planning``); in doubt (the broker
    flagged it redelivered, or a copy of its round is with the handler or was: a second copy
    of one round); else fresh."""
    if copied and delivery.broker_redelivered:
        return ACK_LOST
    if seen is Round.DONE:
        return ALREADY_PROCESSED
    if strikes >= MAX_STRIKES:
        return Stuck(strikes, dead_letters(delivery))
    if delivery.problem is not None:
        return Unreadable(delivery.problem)
    if not selected:
        return NOT_SELECTED
    if delivery.broker_redelivered or seen is Round.HANDED:
        return IN_DOUBT
    return STRUCK if strikes else FRESH


# -- what to do --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Settle:
    """Acknowledge the delivery (in the handler's transaction when it sent anything).
    ``repeat``: a copy of a message already processed, counted as such. ``ack_lost``: a
    delivery back after the copies of its settlement were stored (``AckLost``): acked unseen,
    counted nowhere (its settlement counted as rolled back)."""

    repeat: bool = False
    ack_lost: bool = False


@dataclass(frozen=True, slots=True)
class Filter:
    """Acknowledge the delivery unseen: no span, counted as filtered."""


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Ack the delivery and, in the same transaction, send a copy of its body, delivery number
    ``delivery_count``, with ``headers`` to ``destination`` (the subscription's requeue
    destination), to be delivered ``delay`` seconds later: held back by the broker where it
    can (``Capabilities.cannot_hold_delays``), else waited out before the transaction.
    ``failure`` is why."""

    delay: float
    delivery_count: int
    destination: Destination
    headers: Mapping[str, str]
    failure: InDoubt | Raised


@dataclass(frozen=True, slots=True)
class MoveToError:
    """Ack the delivery and, in the same transaction, send a copy of its body with ``headers``
    (which say what failed: ``failure``) to ``destination``, the listener's error
    destination."""

    destination: Destination
    headers: Mapping[str, str]
    failure: Failure


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Hand the delivery to the broker's own dead-letter queue (``Connection.dead_letter``),
    which settles it: no copy is sent."""

    failure: Stuck


@dataclass(frozen=True, slots=True)
class Keep:
    """Wait ``delay`` seconds, then ack the delivery and, in the same transaction, send an
    unchanged copy (the same count) with ``headers`` to ``destination``, the subscription's
    requeue destination: the message stays with its subscription, behind the others, and is
    not handled again by this process."""

    delay: float
    destination: Destination
    headers: Mapping[str, str]
    failure: Stuck


Outcome = Settle | Filter | Redeliver | MoveToError | DeadLetter | Keep


@dataclass(frozen=True, slots=True)
class Policy:
    """What ``decide`` needs to know of a listener and the subscription a delivery came from;
    ``header_limits`` are those its copies keep to (``mdb.copies``)."""

    listener: str
    redelivery: Redelivery
    requeue_destination: Destination
    error_destination: Destination
    header_limits: HeaderLimits


SETTLE = Settle()
SETTLE_REPEAT = Settle(repeat=True)
SETTLE_ACK_LOST = Settle(ack_lost=True)
FILTER = Filter()


@overload
def decide(message: Message, happened: Succeeded | AlreadyProcessed | AckLost, policy: Policy,
           protocol_headers: Set[str] = ...) -> Settle: ...
@overload
def decide(message: Message, happened: NotSelected, policy: Policy,
           protocol_headers: Set[str] = ...) -> Filter: ...
@overload
def decide(message: Message, happened: InDoubt | Undecodable | Unreadable | Reused | Raised,
           policy: Policy, protocol_headers: Set[str] = ...) -> Redeliver | MoveToError: ...
@overload
def decide(message: Message, happened: Stuck, policy: Policy,
           protocol_headers: Set[str] = ...) -> MoveToError | DeadLetter | Keep: ...
@overload
def decide(message: Message, happened: Happened, policy: Policy,
           protocol_headers: Set[str] = ...) -> Outcome: ...
def decide(message: Message, happened: Happened, policy: Policy,
           protocol_headers: Set[str] = frozenset()) -> Outcome:
    """The outcome of ``message`` after ``happened``.

    A success is settled, and so is a copy of a message already processed and a delivery whose
    ack was lost after its settlement's copies were stored; a message not selected is
    filtered. A failure (the handler raised, or the delivery is in doubt) is redelivered
    while ``message.delivery_count`` is at most the policy's ``limit`` — after
    ``delay_before(count)`` seconds for a handler failure, at once for a delivery in doubt —
    and past it, or at once for an undecodable or unreadable message or one whose identity is
    another's, moved to the error destination. A message stuck ``MAX_STRIKES`` times moves
    to the error destination; past that, to the broker's dead-letter queue where the broker
    keeps it there, else it is kept (``Redelivery.keep_delay``). ``protocol_headers`` are the
    names of the headers the broker set for this one delivery (``Delivery.protocol_headers``):
    they are not copied.

    A copy's headers are cut to the policy's ``header_limits`` (``mdb.copies``). A
    message whose headers do not all fit is not redelivered (its copy would lack some): it
    moves to the error destination at once, with the headers that fit and
    ``mdb_headers_dropped``; a kept copy keeps what fits.
    """
    match happened:
        case Succeeded():
            return SETTLE
        case AlreadyProcessed():
            return SETTLE_REPEAT
        case AckLost():
            return SETTLE_ACK_LOST
        case NotSelected():
            return FILTER
        case Stuck(dead_letter=True) if happened.strikes > MAX_STRIKES:
            return DeadLetter(happened)
        case Stuck() if happened.strikes > MAX_STRIKES:
            rounds = happened.strikes - MAX_STRIKES
            kept, _ = bounded(redelivery_headers(message, protocol_headers,
                                                 message.delivery_count), policy.header_limits)
            return Keep(policy.redelivery.keep_delay(rounds), policy.requeue_destination, kept,
                        happened)
        case InDoubt() | Raised() if message.delivery_count <= policy.redelivery.limit:
            count = message.delivery_count
            headers, dropped = bounded(redelivery_headers(message, protocol_headers, count + 1),
                                       policy.header_limits)
            if dropped:
                return _moved(message, happened, policy, protocol_headers)
            delay = (0.0 if isinstance(happened, InDoubt)
                     else policy.redelivery.delay_before(count))
            return Redeliver(delay, count + 1, policy.requeue_destination, headers, happened)
        case InDoubt() | Undecodable() | Unreadable() | Reused() | Raised() | Stuck():
            return _moved(message, happened, policy, protocol_headers)


def carries_on(outcome: Outcome) -> bool:
    """Whether the copies ``outcome`` sends carry its message on, so that its delivery, should
    the broker confirm them and not its ack, is remembered and acked unseen when it comes back
    (``AckLost``): a handler's sends, a retry copy (the next count), an error copy. Not a kept
    copy: it has its delivery's count, and were the delivery's ack applied after all, the kept
    copy coming back in doubt could not be told from it (it is kept again instead)."""
    return not isinstance(outcome, Keep)


def _moved(message: Message, failure: Failure, policy: Policy,
           protocol_headers: Set[str]) -> MoveToError:
    headers, _ = bounded(error_headers(message, failure, policy.listener, protocol_headers),
                         policy.header_limits)
    return MoveToError(policy.error_destination, headers, failure)


def redelivery_headers(message: Message, protocol_headers: Set[str],
                       delivery_count: int) -> dict[str, str]:
    """The headers of ``message``'s copy re-sent to its subscription: its own, its ``mdb_id``,
    ``delivery_count`` and the logical destination it came from."""
    headers = _kept(message, protocol_headers)
    headers[headers_.DELIVERY_COUNT] = str(delivery_count)
    headers[headers_.REDELIVERY_OF] = str(message.destination)
    return headers


def error_headers(message: Message, failure: Failure, listener: str,
                  protocol_headers: Set[str]) -> dict[str, str]:
    """The headers of ``message``'s copy moved to the error destination: its own, its
    ``mdb_id``, its count, and what failed where (``mdb.copies.with_failure``)."""
    headers = _kept(message, protocol_headers)
    headers[headers_.DELIVERY_COUNT] = str(message.delivery_count)
    return with_failure(headers, failure.error_type, failure.text,
                        str(message.destination), listener,
                        failure.frames if isinstance(failure, Raised) else "")


def _kept(message: Message, protocol_headers: Set[str]) -> dict[str, str]:
    """The application's headers of ``message``, fit for a copy: without the broker's ones for
    this delivery and without a stale ``mdb_redelivery_of``, with its ``mdb_id``."""
    headers = {k: v for k, v in message.headers.items() if k not in protocol_headers}
    headers.pop(headers_.REDELIVERY_OF, None)
    headers[headers_.ID] = message.id
    return headers
