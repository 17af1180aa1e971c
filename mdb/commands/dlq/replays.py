"""What a replay sends back, and where: ``replay_target`` (where a message failed, when the
application's listeners consume there; else why not, ``Left``), the message replayed (its
identity kept or proven anew, its count afresh, its failure kept as history) and the message
moved back to the error destination's back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from mdb.commands.dlq.failed_message import Failed
from mdb.errors import ConfigurationError, IdentityReused
from mdb.messages.destinations import Destination, Kind
from mdb.messages.headers import (
    ID,
    LAST_FAILURE,
    ORIGINAL_DESTINATION,
    PROOF,
    REDELIVERY_OF,
    REPLAYS,
)
from mdb.messages.identity import Seal
from mdb.messages.message import OutgoingMessage, count_of, new_id
from mdb.observability.redaction import printable


@dataclass(frozen=True, slots=True)
class Left:
    """A selected message a replay leaves on the error destination (``id``, as it is), and
    why, for an operator (``reason``, printable): where it failed is not known, or is not where
    a replay may send it (``replay_target``)."""

    id: str
    reason: str


def replay_target(failed: Failed, error_destination: Destination,
                  origins: frozenset[Destination]) -> Destination | Left:
    """Where a replay sends ``failed`` back: where it failed, when that is one of ``origins``
    (the queues the application's listeners consume); else why not. Never a topic (a replay
    there reaches every subscription of it) nor the error destination itself: only the
    operator may name those (``ErrorDestination.replay``'s ``to``)."""
    said = failed.original_destination
    if not said:
        return Left(failed.id, f"names no original destination ({ORIGINAL_DESTINATION}): "
                               "give --to DESTINATION to replay it there")
    try:
        origin = Destination.parse(said)
    except ConfigurationError:
        return Left(failed.id, f"its original destination '{printable(said)}' is not one mdb "
                               "can name: give --to DESTINATION to replay it there")
    if origin in (error_destination, failed.member.destination):
        return Left(failed.id, f"names the error destination itself ({origin}): give --to "
                               "DESTINATION to replay it elsewhere")
    if origin.kind is Kind.TOPIC:
        return Left(failed.id, f"came from {origin}: a replay there reaches every "
                               f"subscription of it; give --to {origin}, or --to its "
                               "listener's subscription queue")
    if origin not in origins:
        return Left(failed.id, f"came from {origin}, where no listener of this application "
                               "consumes (as --module or the error destination's name say); "
                               f"give --to {origin} to replay it there")
    return origin


def named_origins(error_destination: Destination) -> frozenset[Destination]:
    """The queue whose error destination ``error_destination`` is by mdb's naming alone
    (``Destination.error_queue``): ``queue:orders`` for ``queue:orders.DLQ``; none for another
    name."""
    name = error_destination.name.removesuffix(".DLQ")
    if name == error_destination.name or not name:
        return frozenset()
    return frozenset({Destination(Kind.QUEUE, name)})


def application_headers(failed: Failed) -> dict[str, str]:
    return {k: v for k, v in failed.headers.items() if k not in failed.protocol_headers}


def unchanged_message(failed: Failed) -> OutgoingMessage:
    """``failed`` as it is (its proof too), to go to the back of its error destination."""
    headers = application_headers(failed)
    headers[ID] = failed.id
    return OutgoingMessage(failed.body, headers, copy_of=failed.headers)


def replayed_message(failed: Failed, seal: Seal) -> OutgoingMessage:
    """``failed`` as a replay sends it (see the module docstring): proven with ``seal`` where
    mdb vouches for its identity (``Failed.vouched``), else as the producer's word it came as,
    its proof left out: an ``mdb_id`` no proof covers may be another message's."""
    headers = application_headers(failed)
    headers.pop(PROOF, None)
    for name, history in LAST_FAILURE.items():
        if name in headers:
            headers[history] = headers.pop(name)
    headers.pop(REDELIVERY_OF, None)
    headers[REPLAYS] = str((count_of(failed.headers.get(REPLAYS)) or 0) + 1)
    # One moved aside as reused is not the message its identity names (a twin, another body
    # under one id): a message of its own, under an identity of its own (which a replay of it
    # cut short and made again makes once more).
    reused = failed.error_type == IdentityReused.error_type
    headers[ID] = new_id() if reused else failed.id
    message = OutgoingMessage(failed.body, headers, copy_of=failed.headers)
    return seal.sealed(message) if reused or failed.vouched else message
