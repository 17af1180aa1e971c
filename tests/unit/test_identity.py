"""``mdb.messages.identity``: one identity per message, kept by every copy mdb makes of it, proven
with the application's secret; an id a producer chose is bound to its content
(docs/architecture.md, "Identity")."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from mdb.delivery.decision import IN_DOUBT
from mdb.messages.copies import error_headers, redelivery_headers
from mdb.messages.destinations import Destination
from mdb.messages.headers import PROOF
from mdb.messages.identity import (
    DIGEST,
    MAX_ID,
    PROOF_SIZE,
    Seal,
    identity,
    room_for_the_proof,
    to_message,
)
from mdb.messages.message import OutgoingMessage
from mdb.seam.broker import Delivery, HeaderLimits

ORDERS = Destination.parse("queue:orders")
PROTOCOL = frozenset({"message-id", "redelivered"})
SEAL = Seal(b"the application's secret")


def delivery(headers: Mapping[str, str], message_id: str | None, body: bytes = b"x", *,
             redelivered: bool = False, correlation_id: str | None = None) -> Delivery:
    return Delivery(ORDERS, body, headers, message_id, redelivered, None,
                    protocol_headers=PROTOCOL, correlation_id=correlation_id)


def known(d: Delivery, seal: Seal = SEAL, *, assigned: bool = True) -> str:
    return identity(d, seal, assigned=assigned).key


def delivered(sent: OutgoingMessage, message_id: str | None, **added: str) -> Delivery:
    """``sent`` as its broker delivers it: with headers of its own for this delivery, an id of
    the broker's own where it gives one."""
    return delivery({**sent.headers, **added}, message_id, sent.body,
                    correlation_id=sent.correlation_id)


def copy_of(original: Delivery, message_id: str | None, *, to_error: bool = False) -> Delivery:
    """The copy mdb re-sends of ``original`` (its headers as ``decide`` makes them, sealed as
    it is sent), as its broker delivers it."""
    message = to_message(original, ORDERS, identity(original, SEAL, assigned=True))
    headers = (error_headers(message, PROTOCOL, IN_DOUBT.error_type, IN_DOUBT.text, "l") if to_error
               else redelivery_headers(message, PROTOCOL, 2))
    return delivered(SEAL.sealed(OutgoingMessage(original.body, headers)), message_id)


def test_a_message_is_known_by_its_proven_mdb_id_then_by_what_no_producer_reaches() -> None:
    proven = delivered(SEAL.sealed(OutgoingMessage(b"x", {"mdb_id": "m-7"})), "ID:broker-1")
    assert known(proven) == "m-7"
    claimed = known(delivery({"mdb_id": "m-7"}, "ID:broker-1"))  # no proof: a producer's
    assert claimed.startswith("m-7#") and len(claimed) <= MAX_ID
    assert known(delivery({}, "ID:broker-1")) == "ID:broker-1"  # the broker gave it
    chosen = known(delivery({}, "amqp-7"), assigned=False)  # RabbitMQ's: its producer gave it
    assert chosen.startswith("amqp-7#")
    by_content = identity(delivery({"k": "v"}, None), SEAL, assigned=True)
    assert by_content.by_content and by_content.key.startswith(DIGEST)
    assert not identity(delivery({}, "ID:broker-1"), SEAL, assigned=True).by_content
    assert not identity(delivery({"mdb_id": "m-7"}, None), SEAL, assigned=True).by_content


def test_a_claimed_id_never_meets_the_message_it_copies_or_predicts() -> None:
    genuine = delivered(SEAL.sealed(OutgoingMessage(b"order", {"mdb_id": "m-7"})), "ID:1")
    forged = [
        delivery({"mdb_id": "m-7"}, "ID:2", b"order"),  # its id and body, no proof
        delivery({**genuine.headers, "tenant": "evil"}, "ID:2", b"order"),  # its proof lifted
        delivery({**genuine.headers}, "ID:2", b"another order"),
        delivery({"mdb_id": "m-7", PROOF: "1." + "0" * 32}, "ID:2", b"order"),
        delivery({"mdb_id": "ID:1"}, "ID:2", b"order"),  # a broker's id, predicted
    ]
    keys = {known(genuine), "ID:1"}
    for message in forged:
        assert known(message) not in keys
    # A repeat of a producer's message (its id and content again) is that message.
    assert known(forged[0]) == known(delivery({"mdb_id": "m-7"}, "ID:3", b"order"))


def test_a_proof_holds_what_a_broker_rewrites_on_the_way_and_nothing_else() -> None:
    sent = SEAL.sealed(OutgoingMessage(
        b"x", {"mdb_id": "m-7", "k": "v", "traceparent": "00-a-b-01", "expiration": "60000"},
        correlation_id="c-1"))
    rewritten = delivered(sent, "ID:1", **{
        "traceparent": "00-c-d-01", "expiration": "59990", "reply-to":
        "/remote-temp-queue/ID:x", "JMSXUserID": "shop", "redelivered": "true",
        "original-destination": "/topic/VirtualTopic.orders"})
    assert SEAL.proves(rewritten)
    assert not SEAL.proves(delivered(sent, "ID:1", k="w"))
    assert not SEAL.proves(delivered(sent, "ID:1", another="header"))
    assert not SEAL.proves(delivery(sent.headers, "ID:1", b"y", correlation_id="c-1"))
    assert not SEAL.proves(delivery(sent.headers, "ID:1", b"x", correlation_id="c-2"))
    assert not Seal(b"another application's secret").proves(rewritten)


def test_every_copy_of_a_message_keeps_its_first_identity() -> None:
    kept_id = delivery({"k": "v", "message-id": "ID:1"}, "ID:1")  # ActiveMQ: an id kept
    no_id = delivery({"k": "v", "message-id": "T_1@@1"}, None)  # RabbitMQ: none kept
    claimed = delivery({"k": "v", "mdb_id": "m-1"}, "ID:1")  # an id no proof covers
    for original in (kept_id, no_id, claimed):
        first = known(original)
        assert known(copy_of(original, "ID:copy-2")) == first
        assert known(copy_of(original, None, to_error=True)) == first
        assert known(copy_of(copy_of(original, "ID:copy-2"), "ID:copy-3")) == first


def test_a_redelivery_by_the_broker_is_known_as_its_first_delivery() -> None:
    # RabbitMQ names each delivery anew: its id is a protocol header, not the message's.
    first = delivery({"k": "v", "message-id": "T_1@@1"}, None)
    again = delivery({"k": "v", "message-id": "T_2@@1", "redelivered": "true"}, None,
                     redelivered=True)
    assert known(first) == known(again)
    assert known(first) != known(delivery({"k": "v"}, None, b"y"))


def test_an_id_too_long_to_keep_is_known_by_its_digest_through_its_copies() -> None:
    for original in (delivered(SEAL.sealed(OutgoingMessage(b"x", {"mdb_id": "x" * 200})), "I"),
                     delivery({"mdb_id": "x" * 200}, "ID:1")):
        key = known(original)
        assert len(key) <= MAX_ID
        assert known(copy_of(original, "ID:2")) == key
    assert known(delivery({"mdb_id": "x" * (MAX_ID + 1)}, "ID:1")) != known(
        delivery({"mdb_id": "x" * MAX_ID}, "ID:1"))


@pytest.mark.parametrize("count", [3, 50])
def test_the_headers_mdb_sends_leave_room_for_the_proof(count: int) -> None:
    limits = HeaderLimits(count=count, line=100, total=1000, size=lambda k, v: len(k) + len(v))
    room = room_for_the_proof(limits)
    assert room.count == count - 1
    assert room.total == 1000 - len(PROOF) - PROOF_SIZE
    assert len(SEAL.sealed(OutgoingMessage(b"x", {"mdb_id": "m"})).headers[PROOF]) == PROOF_SIZE


def test_a_sender_knows_the_identity_its_message_will_have_where_it_is_delivered() -> None:
    """What ``mdb dlq replay`` tells the testing kit's waits: the identity a receiver with the
    same secret gives the message, proven or not."""
    plain = OutgoingMessage(b"x", {"mdb_id": "m-7", "k": "v"}, correlation_id="c")
    for sent in (SEAL.sealed(plain), plain):
        assert SEAL.known_as(sent) == known(delivered(sent, "ID:1", redelivered="true"))
    assert SEAL.known_as(SEAL.sealed(OutgoingMessage(b"x", {"mdb_id": "m-7"}))) == "m-7"


def test_proofs_and_bound_ids_stay_what_earlier_releases_made() -> None:
    """A message sealed by an earlier mdb (on a queue, in an error destination) is still proven,
    and an id bound to its content still names it: the stream of its parts is fixed."""
    sent = SEAL.sealed(OutgoingMessage(b"body", {"mdb_id": "m-7", "k": "v"},
                                       correlation_id="c-1"))
    assert sent.headers[PROOF] == "1.5f29e5941d0d23f9df1dd6d84b41c29d"
    claimed = delivery({"mdb_id": "m-7", "k": "v"}, None, b"body", correlation_id="c-1")
    assert known(claimed) == "m-7#7710b32cf0fedeb4074835c3382bcad4"
