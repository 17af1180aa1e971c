"""What a message is known by wherever mdb meets it again (docs/architecture.md, "Identity"):
one function for the inbox of an exactly-once listener, every copy mdb makes of a message (a
redelivery, a copy in doubt, a kept copy, an error copy), the ids of a handler's sends and a
listener's strikes. The rules per kind of producer are in docs/exactly-once.md, "Identity".

A message is known by its ``mdb_id``, else by the id its broker keeps for it
(``Delivery.message_id``: ActiveMQ's JMSMessageID, a producer's AMQP message-id on
RabbitMQ), else by a digest of its content. Every copy mdb makes carries that identity as its
``mdb_id`` (``mdb.message.Message.id``), so the copy is known as its original was, on any
member of any broker.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from mdb.broker import Delivery
from mdb.message import ID

MAX_ID = 128
"""Characters of an id taken as it is; a longer one (a producer may write anything) is known by
its digest, which the inbox's column and every header of a copy can hold."""
DIGEST = "sha256:"


@dataclass(frozen=True, slots=True)
class Identity:
    key: str
    by_content: bool
    """The message came with no id: ``key`` is a digest of its body and application headers,
    which two different messages of one content share."""


def identity(delivery: Delivery) -> Identity:
    """The identity of ``delivery``'s message (see the module docstring). The broker's headers
    for this one delivery (``Delivery.protocol_headers``) are not part of a content digest."""
    key = identity_key(delivery)
    return Identity(key, not (delivery.headers.get(ID) or delivery.message_id))


def identity_key(delivery: Delivery) -> str:
    """``identity(delivery).key``, without the ``Identity``: asked of every delivery."""
    given = delivery.headers.get(ID) or delivery.message_id
    if given:
        return given if len(given) <= MAX_ID else digest(given.encode())
    protocol = delivery.protocol_headers
    headers = sorted((k, v) for k, v in delivery.headers.items() if k not in protocol)
    return digest(delivery.body, repr(headers).encode())


def digest(*parts: bytes) -> str:
    """A digest of ``parts``, shaped as an identity made from content is."""
    found = hashlib.sha256()
    for part in parts:
        found.update(part)
    return f"{DIGEST}{found.hexdigest()}"
