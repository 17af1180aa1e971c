"""What becomes of a delivery, decided purely: no I/O, no event loop, no broker.

The rules it keeps are docs/architecture.md, "Delivery contract": the container, not the
broker, owns redelivery, so a failed delivery is acked and, in the same transaction, copied to
its subscription's own queue with ``mdb_delivery_count`` one higher, or past the limit to the
error destination; a delivery the broker flags redelivered counts as a failed one; what fails
outside the handler is counted per message in the process (``mdb.delivery.strikes``), and at
``MAX_STRIKES`` the message moves to the error destination, past it to the broker's
dead-letter queue where the broker surely keeps it there (``DeadLetter``), else it stays with
its subscription behind growing pauses (``Keep``).

Two pure steps, shared by a delivery processed on its own and by a batch:

* ``classify`` says once what a delivery is, before any handler runs: ``Fresh`` (for the
  handler), ``NotSelected``, ``AckLost``, ``AlreadyProcessed``, ``InDoubt``, ``Unreadable``
  or ``Stuck``;
* ``decide`` maps (the message, what happened to it — the class, or what the handler run made
  of a fresh one —, the listener's ``Policy``) to an ``Outcome``, every one of them:
  ``Settle``, ``Filter``, ``Redeliver``, ``MoveToError``, ``DeadLetter`` or ``Keep``, with
  the headers of any copy to send, already within the policy's header limits
  (``mdb.messages.copies``).

``mdb.delivery.processor`` carries the outcome out, in one place.
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import ClassVar, overload

from mdb.errors import IdentityReused, error_type
from mdb.listeners.options import Redelivery
from mdb.messages import codec
from mdb.messages.copies import (
    ERROR_TYPE_LIMIT,
    bounded,
    error_headers,
    error_text,
    redelivery_headers,
)
from mdb.messages.destinations import Destination
from mdb.messages.message import Message
from mdb.seam.broker import Delivery, HeaderLimits, Problem, ProblemKind, never

FRAMES_LIMIT = 4000  # characters of a handler's traceback frames kept for logs and spans
MAX_STRIKES = 3
"""A message whose settlement failed this many times by the broker's doing (``Stuck``) moves to
the error destination; one more, and it is given up to the broker's dead-letter queue (or
kept)."""


class AttemptSeen(enum.Enum):
    """What the listener has seen of a delivery attempt (a message's copies of one count)."""

    NEW = "new"
    """No copy of this attempt or a later one reached this listener (or it was forgotten)."""
    HANDED = "handed"
    """A copy of this attempt went to the handler; no settlement of it returned (yet)."""
    DONE = "done"
    """A settlement of this attempt that supersedes it returned, or a later attempt reached
    this listener: the message went on without this copy."""


# -- what happened -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Succeeded:
    """The handler returned (and the sends it made outside the transaction were made)."""


@dataclass(frozen=True, slots=True)
class AlreadyProcessed:
    """A copy of a message already processed, settled without running the handler: an
    exactly-once listener's inbox holds it, its run committed (docs/exactly-once.md); or a
    copy of an attempt this listener settled, or of an earlier attempt than one it saw
    (``mdb.delivery.strikes``, ``AttemptSeen.DONE``)."""


@dataclass(frozen=True, slots=True)
class NotSelected:
    """A topic listener's selector rejects the message: it is settled unseen (see
    ``mdb.routing.planning``)."""


@dataclass(frozen=True, slots=True)
class AckLost:
    """The broker flagged the delivery redelivered, and it is the very delivery whose earlier
    settlement's copies were stored, not its ack (``Strikes.copied``): those copies supersede
    it, so it is acked unseen, neither handled nor struck again."""


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
    error_type: ClassVar[str] = IdentityReused.error_type


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
             seen: AttemptSeen = AttemptSeen.NEW,
             dead_letters: Callable[[Delivery], bool] = never) -> Kind:
    """What ``delivery`` is, whose message was struck ``strikes`` times
    (``mdb.delivery.strikes``) and is ``selected`` or not by the subscription's selector;
    ``copied``: the broker confirmed the copies of an earlier settlement of this very delivery,
    not its ack (``Strikes.redelivered``); ``seen``: what the listener saw of its message's attempt
    (``Strikes.attempt_seen``); ``dead_letters``: the broker's ``Capabilities.dead_letters``, asked
    of a stuck delivery only. In this order: its ack lost, if it came back flagged redelivered
    after such a settlement (whatever else it is: its copies supersede it); already processed, a
    copy of an attempt settled or overtaken (superseded); stuck at ``MAX_STRIKES``;
    unreadable; not selected (settled unseen, see ``mdb.routing.planning``); in doubt (the broker
    flagged it redelivered, or a copy of its attempt is with the handler or was: a second copy
    of one attempt); else fresh."""
    if copied and delivery.broker_redelivered:
        return ACK_LOST
    if seen is AttemptSeen.DONE:
        return ALREADY_PROCESSED
    if strikes >= MAX_STRIKES:
        return Stuck(strikes, dead_letters(delivery))
    if delivery.problem is not None:
        return Unreadable(delivery.problem)
    if not selected:
        return NOT_SELECTED
    if delivery.broker_redelivered or seen is AttemptSeen.HANDED:
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
    ``header_limits`` are those its copies keep to (``mdb.messages.copies``)."""

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
    keeps it there, else it is kept (``Redelivery.keep_delay``).

    A copy's headers (``mdb.messages.copies``, without ``protocol_headers``: the broker's for
    this one delivery) are cut to the policy's ``header_limits``. A message whose headers do not
    all fit is not redelivered (its copy would lack some): it moves to the error destination at
    once, with the headers that fit and ``mdb_headers_dropped``; a kept copy keeps what fits.
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
            times = happened.strikes - MAX_STRIKES
            kept, _ = bounded(redelivery_headers(message, protocol_headers,
                                                 message.delivery_count), policy.header_limits)
            return Keep(policy.redelivery.keep_delay(times), policy.requeue_destination, kept,
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


def _moved(message: Message, failure: Failure, policy: Policy,
           protocol_headers: Set[str]) -> MoveToError:
    frames = failure.frames if isinstance(failure, Raised) else ""
    headers, _ = bounded(error_headers(message, protocol_headers, failure.error_type,
                                       failure.text, policy.listener, frames),
                         policy.header_limits)
    return MoveToError(policy.error_destination, headers, failure)
