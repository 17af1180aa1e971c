"""``mdb.identity``: one identity per message, kept by every copy mdb makes of it."""

from __future__ import annotations

from collections.abc import Mapping

from mdb.broker import Delivery
from mdb.delivery.decision import IN_DOUBT, error_headers, redelivery_headers, to_message
from mdb.destinations import Destination
from mdb.identity import MAX_ID, identity

ORDERS = Destination.parse("queue:orders")
PROTOCOL = frozenset({"message-id", "redelivered"})


def delivery(headers: Mapping[str, str], message_id: str | None, body: bytes = b"x", *,
             redelivered: bool = False) -> Delivery:
    return Delivery(ORDERS, body, headers, message_id, redelivered, None,
                    protocol_headers=PROTOCOL)


def copy_of(original: Delivery, message_id: str | None, *, to_error: bool = False) -> Delivery:
    """The copy mdb re-sends of ``original``, as its broker delivers it (with an id of the
    broker's own for the copy, where the broker gives one)."""
    message = to_message(original, ORDERS)
    headers = (error_headers(message, IN_DOUBT, "l", PROTOCOL) if to_error
               else redelivery_headers(message, PROTOCOL, 2))
    return delivery(headers, message_id, original.body)


def test_a_message_is_known_by_its_mdb_id_first_then_its_brokers_id_then_its_content() -> None:
    assert identity(delivery({"mdb_id": "m-7"}, "ID:broker-1")).key == "m-7"
    assert identity(delivery({}, "ID:broker-1")).key == "ID:broker-1"
    by_content = identity(delivery({"k": "v"}, None))
    assert by_content.by_content and by_content.key.startswith("sha256:")
    assert not identity(delivery({}, "ID:broker-1")).by_content


def test_every_copy_of_a_foreign_message_keeps_its_first_identity() -> None:
    kept_id = delivery({"k": "v", "message-id": "ID:1"}, "ID:1")  # ActiveMQ: an id kept
    no_id = delivery({"k": "v", "message-id": "T_1@@1"}, None)  # RabbitMQ: none kept
    for original in (kept_id, no_id):
        first = identity(original).key
        assert identity(copy_of(original, "ID:copy-2")).key == first
        assert identity(copy_of(original, None, to_error=True)).key == first
        assert identity(copy_of(copy_of(original, "ID:copy-2"), "ID:copy-3")).key == first


def test_a_redelivery_by_the_broker_is_known_as_its_first_delivery() -> None:
    # RabbitMQ names each delivery anew: its id is a protocol header, not the message's.
    first = delivery({"k": "v", "message-id": "T_1@@1"}, None)
    again = delivery({"k": "v", "message-id": "T_2@@1", "redelivered": "true"}, None,
                     redelivered=True)
    assert identity(first) == identity(again)
    assert identity(first) != identity(delivery({"k": "v"}, None, b"y"))


def test_an_id_too_long_to_keep_is_known_by_its_digest_through_its_copies() -> None:
    original = delivery({"mdb_id": "x" * (MAX_ID + 1)}, "ID:1")
    key = identity(original).key
    assert len(key) <= MAX_ID and key != identity(delivery({"mdb_id": "x" * MAX_ID}, "ID:1")).key
    assert identity(copy_of(original, "ID:2")).key == key
