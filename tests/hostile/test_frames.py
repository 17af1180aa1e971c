"""Hostile frames (docs/security.md, "Hostile input: frames"): NUL bytes in headers, frames
split at a NUL, and headers too many or too large for the broker to take back in an
error-destination copy.

Each case checks that the container stays ready, that the message behind the hostile one is
processed, and that the hostile message ends intact on an error destination: never lost, never
acked as an empty body, never looping.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import anyio
import pytest

from mdb import Container, Context, Producer, Redelivery, listener
from mdb.errors import BrokerError, EncodeError
from mdb.listeners.events import EventKind
from mdb.messages.copies import bounded
from mdb.messages.destinations import Destination
from mdb.messages.headers import ERROR_MESSAGE, ERROR_TYPE, HEADERS_DROPPED, ID
from mdb.messages.message import OutgoingMessage
from mdb.seam.broker import ConnectionOptions, SubscriptionRequest
from mdb.seam.registry import broker_for
from mdb_stomp.protocol.inbound import NUL_IN_HEADER, Splitter
from mdb_stomp.protocol.limits import HEADER_LIMITS
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.messages import read

pytestmark = pytest.mark.anyio

WAIT = 20.0


@pytest.fixture(
    params=[
        pytest.param("activemq", marks=pytest.mark.activemq),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def stomp_url(request: pytest.FixtureRequest) -> str:
    """The STOMP brokers only: what a raw frame does there."""
    return str(request.getfixturevalue(request.param).url)


def raw_send(url: str, path: str, header_lines: bytes, body: bytes) -> None:
    """SEND a frame as another producer might write it (header lines given raw, NULs and all),
    persistent, and wait for its receipt."""
    parts = urlsplit(url)
    rabbit = parts.scheme.endswith("rabbitmq")
    login = f"login:{parts.username or 'guest'}\npasscode:{parts.password or 'guest'}\n"
    connect = (f"CONNECT\naccept-version:1.2\nhost:{'/' if rabbit else 'localhost'}\n"
               f"heart-beat:0,0\n{login if rabbit or parts.username else ''}\n").encode()
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 61613),
                                  timeout=WAIT) as sock:
        sock.sendall(connect + b"\x00")
        assert sock.recv(4096).startswith(b"CONNECTED")
        sock.sendall(b"SEND\ndestination:" + path.encode() + b"\npersistent:true\nreceipt:r\n"
                     + header_lines + b"\n" + body + b"\x00")
        answer = b""
        while b"\x00" not in answer:
            answer += sock.recv(4096)
        assert answer.startswith(b"RECEIPT"), answer


def damaged_count(container: Container, listener_name: str) -> int:
    """``Stats.damaged`` of one listener of ``container``."""
    [deployed] = [d for d in container.deployed if d.spec.name == listener_name]
    return deployed.stats.damaged


# -- NUL bytes ------------------------------------------------------------------------------------

async def test_a_header_with_a_nul_is_refused_before_anything_is_sent(broker_url: str) -> None:
    queue = f"queue:{unique('nulsend')}"
    async with Producer(settings_for(broker_url)) as producer:
        with pytest.raises(EncodeError, match="NUL"):
            await producer.send(queue, "x", headers={"a": "b\x00c"})
        with pytest.raises(EncodeError, match="NUL"):
            await producer.send(queue, "x", headers={"a\x00": "b"})
        await producer.send(queue, "after")
    [only] = await read(broker_url, queue, 1)
    assert only.body == b"after"


async def test_the_stomp_adapter_never_writes_a_nul(stomp_url: str) -> None:
    """The last line of defence, below the codec: a message built by hand."""
    connection = await broker_for(ConnectionOptions(url=stomp_url)).connect()
    try:
        with pytest.raises(EncodeError, match="NUL"):
            await connection.send(Destination.parse(f"queue:{unique('nul')}"),
                                  OutgoingMessage(b"x", {"mdb_id": "1", "a": "b\x00c"}))
        assert connection.is_open
    finally:
        await connection.close()


async def test_a_frame_split_at_a_nul_ends_intact_on_the_error_destination(
    stomp_url: str,
) -> None:
    """Another producer's header holds a NUL: stomp.py cuts the MESSAGE frame there. The slot
    must not stall (ActiveMQ: the head has no ``subscription``) nor ack an empty body
    (RabbitMQ: the head has no body)."""
    name = unique("split")
    queue = f"queue:{name}"
    calls = Calls()

    @listener(queue, pool=1)
    async def handler(body: bytes) -> None:
        calls.add("body", body)

    async with running(settings_for(stomp_url), handler) as container:
        raw_send(stomp_url, f"/queue/{name}", b"a:b\x00c\n", b"the real body")
        async with Producer(settings_for(stomp_url)) as producer:
            await producer.send(queue, b"next")
        await calls.wait(lambda c: b"next" in c.of("body"), timeout=WAIT)
        [moved] = await read(stomp_url, f"{queue}.DLQ", 1, timeout=WAIT)
        assert container.health().ready
        assert damaged_count(container, handler.__name__) == 1
    assert calls.of("body") == [b"next"]
    assert moved.body == b"the real body"
    assert moved.headers[ERROR_TYPE] == "mdb.DamagedFrame"
    assert moved.headers["a"] == "b\ufffdc"


async def test_a_failure_text_with_a_nul_still_reaches_the_error_destination(
    broker_url: str,
) -> None:
    """The exception text is copied into ``mdb_error_message``: its NUL must not stop the copy
    (the adapter refuses a NUL, so the copy replaces it)."""
    queue = f"queue:{unique('nultext')}"

    @listener(queue, pool=1, redelivery=Redelivery(limit=0))
    async def handler(body: str) -> None:
        raise ValueError("bad\x00text")

    async with Producer(settings_for(broker_url)) as producer:
        await producer.send(queue, "payload")
    async with running(settings_for(broker_url), handler) as container:
        [moved] = await read(broker_url, f"{queue}.DLQ", 1, timeout=WAIT)
        assert container.health().ready
    assert moved.body == b"payload"
    assert "\x00" not in moved.headers[ERROR_MESSAGE]


# -- too many or too large headers -----------------------------------------------------------------

@pytest.mark.activemq
async def test_a_refused_transacted_send_is_never_followed_by_its_ack(
    activemq: BrokerProcess,
) -> None:
    """How a refused copy could lose its message: ActiveMQ refuses a SEND with too many headers
    but goes on reading the frames behind it, and would commit a pipelined ACK without the copy.
    A transacted SEND the broker refuses must fail before the caller can ack anything.
    (RabbitMQ took every such frame measured: 2,000 headers, one of 200 KB.)"""
    stomp_url = activemq.url
    name = unique("refused")
    async with Producer(settings_for(stomp_url)) as producer:
        await producer.send(f"queue:{name}", "keep me")
    connection = await broker_for(ConnectionOptions(url=stomp_url)).connect()
    try:
        subscription = await connection.subscribe(SubscriptionRequest(
            Destination.parse(f"queue:{name}"), name=None, durable=True, selector=None,
            prefetch=1))
        with anyio.fail_after(WAIT):
            await subscription.receive()
        tx = await connection.begin()
        headers = {f"h{n}": "x" for n in range(1100)} | {"big": "y" * 20_000, "mdb_id": "1"}
        with pytest.raises(BrokerError):
            await tx.send(Destination.parse(f"queue:{name}.copy"),
                          OutgoingMessage(b"copy", headers))
        await tx.abort()
    finally:
        await connection.close()
    [kept] = await read(stomp_url, f"queue:{name}", 1, timeout=WAIT)
    assert kept.body == b"keep me"


async def test_a_message_with_too_many_headers_ends_on_the_error_destination(
    broker_url: str,
) -> None:
    """A message that fails with nearly as many headers as ActiveMQ takes (996): its error
    copy adds mdb's, and used to be refused, again and again, until the message was lost."""
    name = unique("manyheaders")
    queue = f"queue:{name}"
    calls = Calls()

    @listener(queue, pool=1)
    async def handler(body: dict[str, int]) -> None:
        calls.add("body", body)

    many = {f"h{n:03}": "x" for n in range(996)}
    # A foreign producer: a Producer refuses this many headers (Broker.header_limits).
    if broker_url.startswith("memory"):
        connection = await broker_for(ConnectionOptions(url=broker_url)).connect()
        await connection.send(Destination.parse(queue), OutgoingMessage(b"not json", many))
        await connection.close()
    else:
        raw_send(broker_url, f"/queue/{name}",
                 "".join(f"{k}:{v}\n" for k, v in many.items()).encode(), b"not json")
    async with Producer(settings_for(broker_url)) as producer:
        await producer.send(queue, {"n": 1})
    async with running(settings_for(broker_url), handler) as container:
        await calls.wait(lambda c: bool(c.of("body")), timeout=WAIT)
        [moved] = await read(broker_url, f"{queue}.DLQ", 1, timeout=WAIT)
        assert container.health().ready
        assert container.events.counts[EventKind.CONNECTION_LOST] == 0
    assert moved.body == b"not json"
    assert moved.headers[ERROR_TYPE] == "mdb.DecodeError"
    kept = [k for k in moved.headers if k.startswith("h")]
    assert 0 < len(kept) < 996
    assert int(moved.headers[HEADERS_DROPPED]) == 996 - len(kept)


# -- the pure pieces -------------------------------------------------------------------------------

def test_a_frame_with_a_nul_in_a_header_is_read_whole() -> None:
    """As measured on ActiveMQ: the custom header with a NUL comes first, so stomp.py's cut
    would leave a head without ``subscription`` and a tail that looks like a frame of command
    ``c``."""
    splitter = Splitter()
    [whole] = splitter.feed(b"MESSAGE\na:b\x00c\ncontent-length:4\nsubscription:1\nack:9\n\n"
                            b"BODY\x00")
    assert whole.damage == NUL_IN_HEADER
    assert whole.headers == {"a": "b\x00c", "content-length": "4", "subscription": "1",
                             "ack": "9"}
    assert whole.body == b"BODY"
    [intact] = splitter.feed(b"MESSAGE\nsubscription:1\nack:10\n\nx\x00")
    assert intact.damage is None


def test_a_damaged_body_waits_for_its_content_length() -> None:
    splitter = Splitter()
    assert splitter.feed(b"MESSAGE\ncontent-length:5\nsubscription:1\nack:1\na:b\x00") == []
    assert splitter.feed(b"c\n\nab\x00de") == []  # the body holds a NUL too; its own NUL: not yet
    [whole] = splitter.feed(b"\x00")
    assert whole.body == b"ab\x00de" and whole.damage == NUL_IN_HEADER


def test_copies_keep_mdb_headers_and_drop_what_does_not_fit() -> None:
    headers = {f"h{n}": "x" for n in range(2000)} | {
        "big": "y" * 20_000, ERROR_MESSAGE: "é" * 9_000, ID: "id-1"}
    kept, dropped = bounded(headers, HEADER_LIMITS)
    assert len(kept) <= HEADER_LIMITS.count
    assert all(HEADER_LIMITS.size(k, v) <= HEADER_LIMITS.line for k, v in kept.items())
    assert kept[ID] == "id-1" and kept[ERROR_MESSAGE].startswith("é")
    assert "big" not in kept
    assert dropped == len(headers) - (len(kept) - 1) and kept[HEADERS_DROPPED] == str(dropped)
    assert bounded({"a": "b", ID: "1"}, HEADER_LIMITS) == ({"a": "b", ID: "1"}, 0)


async def test_a_reply_split_at_a_nul_reaches_the_requester_whole(stomp_url: str) -> None:
    """A replier's header holds a NUL: the reply on the requester's temporary queue is joined
    again, as a listener's message is, never an empty body or a lost reply."""
    queue = f"queue:{unique('nul_replier')}"

    @listener(queue, pool=1)
    async def handler(body: str, ctx: Context) -> None:
        assert ctx.message.reply_to is not None
        header_lines = f"correlation-id:{ctx.message.id}\na:b\x00c\n".encode()
        await anyio.to_thread.run_sync(raw_send, stomp_url, str(ctx.message.reply_to),
                                       header_lines, b"the real reply")

    async with running(settings_for(stomp_url), handler), \
            Producer(settings_for(stomp_url)) as producer:
        reply = await producer.request(queue, "ask", timeout=WAIT)
    assert reply.body == b"the real reply"
    assert reply.headers["a"] == "b\ufffdc"
