"""The ids of a handler's sends (docs/concepts.md, "The delivery contract", rule 6): derived
from the incoming message, the listener, its subscription and the send's place, so that a
processing after a redelivery sends again under the same ids; random for a producer's."""

from __future__ import annotations

import anyio
import pytest

from mdb.errors import EncodeError
from mdb.listeners.context import Context
from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID, MAYBE_REPEAT
from mdb.messages.message import Message, OutgoingMessage, ReplyAddress, ReplyTo, derived_id
from mdb_memory import MemoryBroker

INCOMING, SUBSCRIPTION, LISTENER = "0123abcd" * 4, "shop-on_order", "on_order"


def test_the_same_send_of_the_same_processing_gets_the_same_id() -> None:
    first = derived_id(INCOMING, SUBSCRIPTION, LISTENER, 0)
    assert derived_id(INCOMING, SUBSCRIPTION, LISTENER, 0) == first
    assert len(first) == 32 and int(first, 16) >= 0


@pytest.mark.parametrize("other", [
    ("ffff" * 8, SUBSCRIPTION, LISTENER, 0),
    (INCOMING, "shop-s2-on_order", LISTENER, 0),
    (INCOMING, SUBSCRIPTION, "on_refund", 0),
    (INCOMING, SUBSCRIPTION, LISTENER, 1),
    # The parts are kept apart: moving a character from one to the next changes the id.
    (INCOMING, SUBSCRIPTION + "o", LISTENER[1:], 0),
])
def test_any_other_send_gets_another_id(other: tuple[str, str, str, int]) -> None:
    assert derived_id(*other) != derived_id(INCOMING, SUBSCRIPTION, LISTENER, 0)


def test_a_producers_messages_get_random_ids() -> None:
    assert codec.outgoing("a").headers[ID] != codec.outgoing("a").headers[ID]


def test_a_producer_that_gives_an_id_keeps_it() -> None:
    # To send a message again under its id (after SendOutcomeUnknown): a receiver that
    # remembers ids sees one message.
    assert codec.outgoing("a", {ID: "order-17"}).headers[ID] == "order-17"


def test_an_empty_id_is_refused() -> None:
    with pytest.raises(EncodeError, match="header mdb_id is empty: give the message's id, or "
                                          "leave the header out for a new one"):
        codec.outgoing("a", {ID: ""})


def incoming(redelivered: bool) -> Message:
    return Message(INCOMING, Destination.parse("queue:orders"), b"{}", {ID: INCOMING},
                   redelivered=redelivered, delivery_count=2 if redelivered else 1,
                   reply_to=ReplyAddress("/queue/replies"))


async def handler_sends(redelivered: bool) -> list[OutgoingMessage]:
    """What a handler that sends twice and replies once sends, processing ``incoming``."""
    sent: list[OutgoingMessage] = []

    async def send(target: ReplyTo, message: OutgoingMessage, key: str | None) -> None:
        sent.append(message)

    ctx = Context(incoming(redelivered), LISTENER, send, SUBSCRIPTION,
                  MemoryBroker.header_limits)
    await ctx.send("queue:a", "x", {ID: "chosen by the handler"})
    await ctx.send("queue:a", "x")
    await ctx.reply("done")
    return sent


@pytest.mark.anyio
async def test_a_processing_again_sends_under_the_same_ids_flagged_as_maybe_repeats() -> None:
    first, again = await handler_sends(False), await handler_sends(True)
    ids = [m.headers[ID] for m in first]
    assert ids == [derived_id(INCOMING, SUBSCRIPTION, LISTENER, n) for n in range(3)]
    assert [m.headers[ID] for m in again] == ids
    assert all(MAYBE_REPEAT not in m.headers for m in first)
    assert all(m.headers[MAYBE_REPEAT] == "true" for m in again)


@pytest.mark.anyio
async def test_a_plain_handlers_sends_count_in_order_too() -> None:
    sent: list[OutgoingMessage] = []

    async def send(target: ReplyTo, message: OutgoingMessage, key: str | None) -> None:
        sent.append(message)

    ctx = Context(incoming(False), LISTENER, send, SUBSCRIPTION, MemoryBroker.header_limits)
    await anyio.to_thread.run_sync(lambda: [ctx.send("queue:a", n) for n in range(2)])
    assert [m.headers[ID] for m in sent] == [
        derived_id(INCOMING, SUBSCRIPTION, LISTENER, n) for n in range(2)]
