"""What a message is known by wherever mdb meets it again (docs/architecture.md, "Identity"):
one function for the inbox of an exactly-once listener, every copy mdb makes of a message (a
redelivery, a copy in doubt, a kept copy, an error copy), the ids of a handler's sends and a
listener's strikes. The rules per kind of producer are in docs/exactly-once.md, "Identity".

Every message mdb sends carries a proof that mdb made it (``mdb_proof``): a MAC of its
``mdb_id`` and its content with the application's secret (``Seal``). A message is known by

* its ``mdb_id`` where its proof holds: mdb made it (or a copy of it) under that identity;
* else an id its producer chose, bound to its content (``<id>#<digest>``): an ``mdb_id``
  without a proof, or the broker's ``Delivery.message_id`` where the producer gave it
  (RabbitMQ's AMQP message id). A producer that copies or predicts an id thus never meets the
  message it belongs to, and a repeat of one message (its id and content again) is that
  message;
* else the id its broker gave it (``Delivery.message_id`` where
  ``Capabilities.assigned_ids``: ActiveMQ's JMSMessageID), which no producer chooses;
* else its content alone (``sha256:<digest>``): two messages of one content are one.

Every copy mdb makes carries the identity as its ``mdb_id``, with a proof, so that it is known
as its original was, on any member of any broker. A key space a producer reaches (an id of
its choosing) is bound to the content it sent, and the others are out of its reach: no
message a producer sends has another's identity unless it is that message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Protocol

from mdb.config.settings import Settings
from mdb.messages.destinations import Destination
from mdb.messages.headers import DELIVERY_COUNT, ID, MAYBE_REPEAT, PROOF
from mdb.messages.message import Message, OutgoingMessage, count_of
from mdb.seam.broker import Delivery, HeaderLimits

MAX_ID = 128
"""Characters of an identity at most: a longer id (a producer may write anything) is known by
its digest, which the inbox's column and every header of a copy can hold."""
DIGEST = "sha256:"
_BOUND = 32  # hexadecimal digits of the digest that binds an id to its content
_VERSION = "1."  # of the proof: a later form can be told from this one
_PROOF_DIGITS = 32  # hexadecimal digits of the MAC a proof keeps: 128 bits

# What a proof, and the binding of an id a producer chose, leave out of a message's content:
# the proof itself; the trace context and the repeat mark, which a send gets anew each time
# it is made; the JMS header fields a broker writes in its own form or counts down on the
# way (a reply-to's address, an expiry, a time to live, a priority, the delivery mode, and
# the originalDestination ActiveMQ writes on a message of a virtual topic's queue) and the
# JMSX properties a broker may set. The correlation id is covered, as the field it is on both
# sides.
_UNCOVERED = frozenset({PROOF, MAYBE_REPEAT, "traceparent", "tracestate", "baggage",
                        "reply-to", "correlation-id", "expires", "expiration", "priority",
                        "persistent", "original-destination"})


class _Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Identity:
    key: str
    by_content: bool
    """The message came with no id of any kind: ``key`` is a digest of its body and
    application headers, which two different messages of one content share."""


class Seal:
    """The application's ``secret``, with which every message mdb sends is proven
    (``sealed``) and every message it receives is checked (``proves``). Processes that do not
    share it cannot prove messages to each other: each knows the other's as a producer's
    (``identity``)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def of(cls, settings: Settings) -> Seal:
        """The secret of ``settings`` (``identity_secret_file``), else this process's own
        (``PROCESS``), until a container finds its database's (docs/security.md)."""
        secret = settings.identity_secret
        if secret is None:
            return PROCESS
        return cls(secret.get_secret_value().encode())

    def sealed(self, message: OutgoingMessage) -> OutgoingMessage:
        """``message`` with its proof, made last: its headers, body and correlation id are
        as it is to be sent (its trace context aside)."""
        headers = message.headers
        correlation = (message.correlation_id if message.correlation_id is not None
                       else headers.get("correlation-id"))
        proof = self._proof(headers[ID], message.body, correlation, _covered(headers))
        return dataclasses.replace(message, headers={**headers, PROOF: proof})

    def proves(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` carries a proof of its ``mdb_id`` and content with this
        secret."""
        headers = delivery.headers
        given, claimed = headers.get(PROOF), headers.get(ID)
        if not given or not claimed:
            return False
        made = self._proof(claimed, delivery.body, delivery.correlation_id,
                           _covered(headers, delivery.protocol_headers))
        return hmac.compare_digest(given, made)

    def known_as(self, message: OutgoingMessage) -> str:
        """The identity a process with this secret knows ``message`` (with its ``mdb_id``) by
        once it is delivered: its ``mdb_id`` where this secret proved it, else that id bound
        to its content (``identity``)."""
        headers = message.headers
        claimed = headers[ID]
        correlation = (message.correlation_id if message.correlation_id is not None
                       else headers.get("correlation-id"))
        covered = _covered(headers)
        if headers.get(PROOF) == self._proof(claimed, message.body, correlation, covered):
            return _kept(claimed, MAX_ID)
        return _bound(b"mdb_id", claimed, message.body, correlation, covered)

    def _proof(self, claimed: str, body: bytes, correlation: str | None,
               headers: list[tuple[str, str]]) -> str:
        mac = hmac.new(self._secret, digestmod=hashlib.sha256)
        _content(mac, b"proof", claimed, body, correlation, headers)
        return _VERSION + mac.hexdigest()[:_PROOF_DIGITS]


PROCESS = Seal(secrets.token_bytes(32))
"""The seal of a process given no secret: what it sends is proven only to itself."""
PROOF_SIZE = len(_VERSION) + _PROOF_DIGITS
"""Characters of a proof's value."""


def identity(delivery: Delivery, seal: Seal, *, assigned: bool) -> Identity:
    """The identity of ``delivery``'s message (see the module docstring), its proof checked
    with ``seal``; ``assigned``: its broker gives every message an id of its own
    (``Capabilities.assigned_ids``). The broker's headers for this one delivery
    (``Delivery.protocol_headers``) are not part of its content."""
    claimed, given = delivery.headers.get(ID), delivery.message_id
    if claimed and seal.proves(delivery):
        return Identity(_kept(claimed, MAX_ID), False)
    chosen = claimed or (None if assigned else given)
    if chosen:
        kind = b"mdb_id" if claimed else b"message id"
        return Identity(_bound(kind, chosen, delivery.body, delivery.correlation_id,
                               _covered(delivery.headers, delivery.protocol_headers)), False)
    if given:
        return Identity(_kept(given, MAX_ID), False)
    protocol = delivery.protocol_headers
    headers = sorted((k, v) for k, v in delivery.headers.items() if k not in protocol)
    return Identity(digest(delivery.body, repr(headers).encode()), True)


def to_message(delivery: Delivery, destination: Destination, known: Identity) -> Message:
    """``delivery`` as the handler sees it: from the listener's logical ``destination``, whatever
    member or re-send queue it came through, known by its identity (``known``,
    ``identity``), which every copy of it carries on. Its count is
    ``mdb_delivery_count`` (1 when absent or not a whole number above 0; at most ``MAX_COUNT``:
    ``mdb.messages.message.count_of``)."""
    h = delivery.headers
    count = count_of(h.get(DELIVERY_COUNT)) or 1
    return Message(
        id=known.key,
        destination=destination,
        body=delivery.body,
        headers=h,
        redelivered=count > 1 or delivery.broker_redelivered,
        delivery_count=count,
        reply_to=delivery.reply_to,
        correlation_id=delivery.correlation_id,
        by_content=known.by_content,
    )


def digest(*parts: bytes) -> str:
    """A digest of ``parts``, shaped as an identity made from content is."""
    found = hashlib.sha256()
    for part in parts:
        found.update(part)
    return f"{DIGEST}{found.hexdigest()}"


def room_for_the_proof(limits: HeaderLimits) -> HeaderLimits:
    """``limits`` less the header of the proof every message mdb sends carries: what its own
    headers keep to."""
    return dataclasses.replace(limits, count=limits.count - 1,
                               total=limits.total - limits.size(PROOF, "0" * PROOF_SIZE))


def _kept(given: str, limit: int) -> str:
    """``given`` as an identity keeps it: itself, or its digest when longer than ``limit``."""
    return given if len(given) <= limit else digest(given.encode())


def _bound(kind: bytes, chosen: str, body: bytes, correlation: str | None,
           headers: list[tuple[str, str]]) -> str:
    """``chosen``, an id of ``kind`` a producer gave a message, bound to its content:
    ``<id>#<digest>``, within ``MAX_ID``."""
    found = hashlib.sha256()
    _content(found, kind, chosen, body, correlation, headers)
    return f"{_kept(chosen, MAX_ID - _BOUND - 1)}#{found.hexdigest()[:_BOUND]}"


def _covered(headers: Mapping[str, str],
             protocol: Set[str] = frozenset()) -> list[tuple[str, str]]:
    """The headers of a message's content, in order: all but ``protocol`` and
    ``_UNCOVERED``."""
    return sorted((name, value) for name, value in headers.items()
                  if name not in protocol and name not in _UNCOVERED
                  and not name.startswith("JMSX"))


def _content(into: _Hash, kind: bytes, claimed: str, body: bytes, correlation: str | None,
             headers: list[tuple[str, str]]) -> None:
    """Feed what a message is, each part with its length (so that no two contents make one
    stream), to ``into``: in one ``update``, the same stream as one per piece, whose calls
    (two per header, through ``hmac``'s Python layer) cost more than the hashing of every
    message received or sent."""
    parts = [kind, claimed.encode(errors="surrogatepass"), body,
             b"" if correlation is None else b"=" + correlation.encode(errors="surrogatepass")]
    for name, value in headers:
        parts += (name.encode(errors="surrogatepass"), value.encode(errors="surrogatepass"))
    into.update(b"".join([piece for part in parts
                          for piece in (len(part).to_bytes(8, "big"), part)]))
