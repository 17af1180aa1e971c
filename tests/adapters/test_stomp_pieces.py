"""The STOMP adapter's pure pieces, without a broker: the ack bookkeeping
(``mdb_stomp.subscriptions.unsettled``), receipts and how an unanswered one is reported
(``mdb_stomp.protocol.receipts``), the SEND headers (``mdb_stomp.protocol.frames``), the heart-beats
and the silence rule and where each frame read goes (``mdb_stomp.protocol.heartbeats``,
``mdb_stomp.protocol.inbound.FrameReader``), the order in which a settlement with confirmed sends
writes its frames (``mdb_stomp.dialects.confirmed``), and the deliveries a subscription prefetched
(``mdb_stomp.subscriptions.prefetched``)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import pytest
import stomp

from mdb.errors import (
    BrokerError,
    ConnectionLost,
    EncodeError,
    SendOutcomeUnknown,
    SubscriptionFailed,
    TransactionRolledBack,
)
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyAddress, ReplyTo
from mdb.seam.broker import ConnectionOptions, Delivery
from mdb_stomp import ActiveMQDialect, Dialect, RabbitMQDialect
from mdb_stomp.broker import capabilities_of
from mdb_stomp.protocol.frames import encode, escaped, send_frame, send_headers, text
from mdb_stomp.protocol.heartbeats import Heartbeats, Silence
from mdb_stomp.protocol.inbound import NO_SUBSCRIPTION, NUL_IN_HEADER, FrameReader
from mdb_stomp.protocol.reading import LoopReading
from mdb_stomp.protocol.receipts import ReceiptErrors, Receipts, Request, Unanswered
from mdb_stomp.protocol.wire import Wire
from mdb_stomp.subscriptions.prefetched import Prefetched
from mdb_stomp.subscriptions.subscription import StompSubscription
from mdb_stomp.subscriptions.unsettled import Unsettled
from mdb_stomp.transaction import StompTransaction

# -- unsettled deliveries ----------------------------------------------------------------------


def dispatched(*ack_ids: str, cumulative: bool = True) -> Unsettled:
    unsettled = Unsettled(cumulative=cumulative)
    for ack_id in ack_ids:
        unsettled.dispatched(ack_id)
    return unsettled


def test_acks_alone_settle_in_dispatch_order_when_cumulative() -> None:
    unsettled = dispatched("a", "b")
    with pytest.raises(BrokerError, match="would also settle the earlier delivery a"):
        unsettled.settle_alone("b")
    unsettled.settle_alone("a")
    unsettled.settle_alone("b")
    assert len(unsettled) == 0
    with pytest.raises(BrokerError, match="already settled"):
        unsettled.settle_alone("b")


def test_individual_acks_settle_in_any_order() -> None:
    unsettled = dispatched("a", "b", cumulative=False)
    unsettled.settle_alone("b")
    assert len(unsettled) == 1


def test_a_transaction_may_ack_later_deliveries_only_holding_the_earlier_ones() -> None:
    unsettled = dispatched("a", "b")
    mine, other = object(), object()
    with pytest.raises(BrokerError, match="earlier delivery a"):
        unsettled.claim("b", mine)
    unsettled.claim("a", mine)
    unsettled.claim("b", mine)
    with pytest.raises(BrokerError, match="already acked in an open transaction"):
        unsettled.claim("a", other)
    with pytest.raises(BrokerError, match="already acked in an open transaction"):
        unsettled.settle_alone("a")


def test_a_committed_transaction_settles_its_claims_an_aborted_one_releases_them() -> None:
    unsettled = dispatched("a", "b", "c")
    committed, aborted = object(), object()
    unsettled.claim("a", committed)
    unsettled.end_claims(committed, settled=True)
    assert len(unsettled) == 2
    unsettled.claim("b", aborted)
    unsettled.end_claims(aborted, settled=False)
    assert len(unsettled) == 2
    unsettled.settle_alone("b")  # released: no longer held by anyone
    assert len(unsettled) == 1


# -- receipts ----------------------------------------------------------------------------------

SEND = Request("SEND", "broker:61613", 1.5)


def test_each_unanswered_outcome_becomes_the_error_the_request_names() -> None:
    errors = ReceiptErrors(
        "queue:q",
        refused=BrokerError,
        unconfirmed=SendOutcomeUnknown,
        lost=SendOutcomeUnknown,
        consequence="the message may have been stored",
    )
    refused = errors.error(Unanswered("refused", SEND, "no such queue"))
    assert type(refused) is BrokerError
    assert str(refused) == "queue:q: the broker refused the SEND: no such queue"
    timed_out = errors.error(Unanswered("timeout", SEND))
    assert type(timed_out) is SendOutcomeUnknown
    assert str(timed_out) == (
        "queue:q: no receipt for SEND from broker:61613 within 1.5s; "
        "the message may have been stored"
    )
    lost = errors.error(Unanswered("lost", SEND, "the socket closed"))
    assert type(lost) is SendOutcomeUnknown
    assert str(lost) == (
        "queue:q: the socket closed before the SEND receipt from broker:61613; "
        "the message may have been stored"
    )


def test_a_lost_connection_is_connection_lost_unless_the_request_says_otherwise() -> None:
    errors = ReceiptErrors("topic:t", refused=SubscriptionFailed, unconfirmed=SubscriptionFailed)
    assert type(errors.error(Unanswered("lost", SEND, "gone"))) is ConnectionLost
    commit = ReceiptErrors(
        "transaction 1", TransactionRolledBack, TransactionRolledBack, TransactionRolledBack
    )
    assert type(commit.error(Unanswered("lost", SEND, "gone"))) is TransactionRolledBack


@pytest.mark.anyio
async def test_receipts_are_answered_refused_timed_out_or_failed() -> None:
    receipts = Receipts(asyncio.get_running_loop())
    quick = Request("COMMIT", "b:1", 5.0)

    async def outcome(receipt: str, request: Request = quick) -> str:
        try:
            await receipts.wait(receipt, request)
        except Unanswered as unanswered:
            return f"{unanswered.why}:{unanswered.detail}"
        return "answered"

    answered = asyncio.ensure_future(outcome("r1"))
    refused = asyncio.ensure_future(outcome("r2"))
    lost = asyncio.ensure_future(outcome("r3"))
    await asyncio.sleep(0)
    receipts.answer("r1")
    assert receipts.refuse("r2", "bad selector")
    assert not receipts.refuse("nobody", "unrelated")
    receipts.fail_all("heartbeat timeout")
    assert await answered == "answered"
    assert await refused == "refused:bad selector"
    assert await lost == "lost:heartbeat timeout"
    assert await outcome("r4", Request("COMMIT", "b:1", 0.01)) == "timeout:"


@pytest.mark.anyio
async def test_each_receipt_times_out_at_its_own_deadline_under_the_one_timer() -> None:
    receipts = Receipts(asyncio.get_running_loop())

    async def outcome(receipt: str, timeout: float) -> str:
        try:
            await receipts.wait(receipt, Request("SEND", "b:1", timeout))
        except Unanswered as unanswered:
            return unanswered.why
        return "answered"

    slow = asyncio.ensure_future(outcome("slow", 60.0))
    await asyncio.sleep(0)
    assert await outcome("quick", 0.01) == "timeout"  # earlier than the timer set for "slow"
    assert receipts.answer("slow")
    assert await slow == "answered"
    first = asyncio.ensure_future(outcome("first", 0.01))
    second = asyncio.ensure_future(outcome("second", 0.05))  # the timer is set again for it
    assert [await first, await second] == ["timeout", "timeout"]


# -- frames ------------------------------------------------------------------------------------

QUEUE = Destination.parse("queue:q")


def test_send_headers_escapeds_drop_frame_headers_and_add_the_dialects() -> None:
    message = OutgoingMessage(
        body=b"{}",
        headers={"a:b": "1", "receipt": "x", "destination": "y", "content-type": "text/plain"},
    )
    headers = send_headers(message, ActiveMQDialect(), QUEUE)
    assert headers["a\\cb"] == "1"
    assert "receipt" not in headers and "destination" not in headers
    assert headers["persistent"] == "true"
    assert headers["amq-msg-type"] == "text"
    assert "amq-msg-type" not in send_headers(message, RabbitMQDialect(), QUEUE)


# A Java TextMessage and BytesMessage as ActiveMQ 5.17 delivers them over STOMP (measured).
JAVA_TEXT = {"message-id": "ID:1", "priority": "8", "expires": "1795390101926",
             "timestamp": "1795386501926", "type": "Order", "correlation-id": "c-1"}
JAVA_BYTES = {**JAVA_TEXT, "persistent": "true", "content-length": "2"}


def test_an_activemq_copy_keeps_the_jms_type_priority_expiry_and_persistence() -> None:
    dialect = ActiveMQDialect()
    copy = send_headers(OutgoingMessage(b"ab", {"mdb_id": "m"}, copy_of=JAVA_TEXT), dialect,
                        QUEUE)
    assert {k: copy.get(k) for k in ("amq-msg-type", "priority", "expires", "persistent")} == {
        "amq-msg-type": "text", "priority": "8", "expires": "1795390101926",
        "persistent": "false"}
    assert "timestamp" not in copy and "message-id" not in copy
    copy = send_headers(OutgoingMessage(b"ab", copy_of=JAVA_BYTES), dialect, QUEUE)
    assert "amq-msg-type" not in copy and copy["persistent"] == "true"
    # A TextMessage sent over STOMP comes back with both headers, as properties: still text.
    sent_as_text = {**JAVA_BYTES, "amq-msg-type": "text"}
    assert send_headers(OutgoingMessage(b"ab", copy_of=sent_as_text), dialect, QUEUE)[
        "amq-msg-type"] == "text"


def test_an_error_copy_has_no_expiry_and_says_its_originals() -> None:
    """docs/failed-messages.md, "Expiry": the error copy is the failure's evidence."""
    failed = {"mdb_id": "m", "mdb_error_type": "RuntimeError"}
    on_activemq = send_headers(OutgoingMessage(b"ab", failed, copy_of=JAVA_TEXT),
                               ActiveMQDialect(), QUEUE)
    assert "expires" not in on_activemq and on_activemq["priority"] == "8"
    assert on_activemq["mdb_original_expiry"] == "2026-11-22T23:28:21.926+00:00"
    received = {"expiration": "3000", "mdb_expires": "1795390101926", "priority": "8"}
    on_rabbitmq = send_headers(OutgoingMessage(b"ab", failed, copy_of=received),
                               RabbitMQDialect(), QUEUE)
    assert not {"expires", "expiration", "mdb_expires"} & set(on_rabbitmq)
    assert on_rabbitmq["mdb_original_expiry"] == "2026-11-22T23:28:21.926+00:00"
    for never in ({"expires": "0"}, {"priority": "4"}):
        for dialect in (ActiveMQDialect(), RabbitMQDialect()):
            copy = send_headers(OutgoingMessage(b"ab", failed, copy_of=never), dialect, QUEUE)
            assert "mdb_original_expiry" not in copy and copy.get("expires", "0") == "0"


def test_a_rabbitmq_copy_keeps_its_priority_and_is_persistent_as_every_send() -> None:
    received = {"message-id": "T_1", "priority": "8", "persistent": "false"}
    copy = send_headers(OutgoingMessage(b"ab", copy_of=received), RabbitMQDialect(), QUEUE)
    assert (copy["priority"], copy["persistent"]) == ("8", "true")
    assert "message-id" not in copy


def test_a_rabbitmq_queue_type_declares_every_queue_mdb_sends_to() -> None:
    message = OutgoingMessage(b"ab", {"x-queue-type": "quorum", "x-delivery-count": "2"})
    quorum = RabbitMQDialect("quorum")
    # A SEND to /queue/X declares X: it must say the queue's type, or RabbitMQ refuses it.
    assert send_headers(message, quorum, QUEUE)["x-queue-type"] == "quorum"
    assert send_headers(OutgoingMessage(b"ab", {}), quorum, QUEUE)["x-queue-type"] == "quorum"
    copy = OutgoingMessage(b"ab", copy_of={"persistent": "true"})
    assert send_headers(copy, RabbitMQDialect("classic"), QUEUE)["x-queue-type"] == "classic"
    # Topics declare nothing; a reply address is another client's queue, not mdb's to declare.
    for target in (Destination.parse("topic:t"), ReplyAddress("/queue/theirs")):
        assert "x-queue-type" not in send_headers(OutgoingMessage(b"ab", {}), quorum, target)
    assert "x-queue-type" not in send_headers(OutgoingMessage(b"ab", {}), RabbitMQDialect(),
                                              QUEUE)
    # What the broker adds to a quorum queue's deliveries is never copied.
    assert {"x-queue-type", "x-delivery-count"} <= quorum.protocol_headers


def test_rabbitmq_explains_a_queue_declared_with_another_type() -> None:
    refused = ("precondition_failed: PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for "
               "queue 'Consumer.shop-l.t' in vhost '/': received the value 'quorum' of type "
               "'longstr' but current is none")
    explained = RabbitMQDialect("quorum").explain(refused)
    assert explained.startswith(refused)
    assert "queue_type" in explained and "delete" in explained
    assert RabbitMQDialect().explain("access_refused") == "access_refused"


def test_an_empty_activemq_frame_without_content_length_is_an_unsupported_kind() -> None:
    dialect = ActiveMQDialect()
    assert dialect.unsupported(JAVA_TEXT, b"") is not None  # a MapMessage looks like this
    assert dialect.unsupported(JAVA_TEXT, b"x") is None
    assert dialect.unsupported({**JAVA_TEXT, "content-length": "0"}, b"") is None  # bytes
    assert dialect.unsupported({**JAVA_TEXT, "mdb_id": "m"}, b"") is None  # mdb sent it
    assert RabbitMQDialect().unsupported({}, b"") is None


def test_only_a_persistent_activemq_message_is_dead_lettered() -> None:
    # ActiveMQ drops a NACKed non-persistent message unless its broker says otherwise;
    # RabbitMQ drops a NACKed message unless its queue has a dead-letter exchange.
    persistent, plain = (Delivery(QUEUE, b"ab", headers, "ID:1", False, None)
                         for headers in (JAVA_BYTES, JAVA_TEXT))
    activemq, rabbitmq = (capabilities_of(dialect).dead_letters
                          for dialect in (ActiveMQDialect(), RabbitMQDialect()))
    assert activemq(persistent) and not activemq(plain)
    assert not rabbitmq(persistent)


def test_rabbitmq_declares_what_it_cannot_do_that_activemq_can() -> None:
    activemq, rabbitmq = (capabilities_of(dialect) for dialect in (ActiveMQDialect(),
                                                                   RabbitMQDialect()))
    assert activemq.atomic_transactions and not rabbitmq.atomic_transactions
    # RabbitMQ always holds a delayed send back (delay queues); ActiveMQ's scheduler is probed.
    assert rabbitmq.cannot_hold_delays is None and activemq.cannot_hold_delays is not None
    # An UNSUBSCRIBE leaves RabbitMQ's unacked deliveries with the connection.
    wire = WrittenFrames()
    kept = holding(1, wire, RabbitMQDialect(), cumulative=False, releases_unacked=False)
    assert rabbitmq.closing_ends_connection(kept)
    assert not rabbitmq.closing_ends_connection(
        holding(0, wire, RabbitMQDialect(), cumulative=False, releases_unacked=False))
    assert not activemq.closing_ends_connection(
        holding(1, wire, ActiveMQDialect(), cumulative=True, releases_unacked=True))


class Written:
    """stomp.py's transport as far as its frames go: what it would put on the wire."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.listeners: dict[str, object] = {}

    def set_listener(self, name: str, listener: object) -> None:
        self.listeners[name] = listener

    def transmit(self, frame: Any) -> None:
        self.frames.append(b"".join(stomp.utils.convert_frame(frame)))


ODD = "a\\b\nc\rd:e é \x01"  # every character STOMP 1.2 escapes, and some it does not


@pytest.mark.parametrize(("frame", "as_stomp_py"), [
    (("SEND", {"destination": "/queue/q", "persistent": "true", "mdb_id": "m-1",
               "transaction": "t", "receipt": "7", escaped(ODD): ODD}, b"{\"a\": 1}\0\n"),
     lambda c: c.send("/queue/q", b"{\"a\": 1}\0\n", headers={
         "persistent": "true", "mdb_id": "m-1", "transaction": "t", "receipt": "7",
         escaped(ODD): ODD})),
    (("SEND", {"destination": "/queue/q", "x": ""}, b""),
     lambda c: c.send("/queue/q", b"", headers={"x": ""})),
    (("ACK", {"id": "ID:x:1:1:1", "transaction": "t"}, b""),
     lambda c: c.ack("ID:x:1:1:1", transaction="t")),
    (("ACK", {"id": "a", "receipt": "9"}, b""), lambda c: c.ack("a", receipt="9")),
    (("NACK", {"id": "a", "receipt": "9"}, b""), lambda c: c.nack("a", receipt="9")),
    (("BEGIN", {"transaction": "t"}, b""), lambda c: c.begin("t")),
    (("COMMIT", {"transaction": "t", "receipt": "3"}, b""),
     lambda c: c.commit("t", headers={"receipt": "3"})),
    (("ABORT", {"transaction": "t"}, b""), lambda c: c.abort("t")),
    (("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "ack": "client",
                    "selector": "k = 'a:b'", "activemq.prefetchSize": "1", "receipt": "4"}, b""),
     lambda c: c.subscribe("/queue/q", "1", ack="client", headers={
         "selector": "k = 'a:b'", "activemq.prefetchSize": "1", "receipt": "4"})),
    (("UNSUBSCRIBE", {"id": "1", "receipt": "5"}, b""),
     lambda c: c.unsubscribe(id="1", headers={"receipt": "5"})),
])
def test_frames_are_encoded_byte_for_byte_as_stomp_py_would(
    frame: tuple[Any, dict[str, str], bytes], as_stomp_py: Callable[[Any], None],
) -> None:
    """mdb writes its frames itself (``frames.encode``), as stomp.py's STOMP 1.2 protocol did:
    sorted headers, escaped values, ``content-length`` on a SEND with a body."""
    written = Written()
    as_stomp_py(stomp.protocol.Protocol12(written))
    assert encode(*frame) == written.frames[0]


def test_escaped_and_text() -> None:
    assert escaped("plain") == "plain"
    assert escaped("a\\b\nc\rd:e") == "a\\\\b\\nc\\rd\\ce"
    assert text(None) == ""
    assert text("s") == "s"
    assert text(b"\xff ok") == "\ufffd ok"


# -- heart-beats and silences ------------------------------------------------------------------


def plan(heartbeat_ms: int, dialect: Dialect) -> Heartbeats:
    return Heartbeats.plan(heartbeat_ms, dialect.heartbeat_unit_ms, dialect.min_heartbeat_ms)


def test_mdb_promises_the_setting_and_asks_the_broker_for_four_times_as_often() -> None:
    assert plan(4000, ActiveMQDialect()) == Heartbeats(4000, 1000)
    assert plan(1000, ActiveMQDialect()) == Heartbeats(1000, 250)
    # RabbitMQ counts in whole seconds, and needs 4 s for mdb to notice a silence first.
    assert plan(1000, RabbitMQDialect()) == Heartbeats(4000, 1000)
    assert plan(4500, RabbitMQDialect()) == Heartbeats(5000, 1250)
    assert plan(0, ActiveMQDialect()) == plan(0, RabbitMQDialect()) == Heartbeats(0, 0)


def test_the_silence_limit_is_two_and_a_half_of_the_brokers_agreed_intervals() -> None:
    heartbeats = Heartbeats(4000, 1000)
    assert heartbeats.silence_limit("1000,4000") == 2.5
    assert heartbeats.silence_limit("3000,4000") == 7.5  # the broker insists on sending less
    assert heartbeats.silence_limit("0,4000") is None  # it sends none: no limit
    assert heartbeats.silence_limit(None) is None
    assert heartbeats.silence_limit("garbage") is None
    assert Heartbeats(0, 0).silence_limit("1000,0") is None


@pytest.mark.parametrize("dialect", [ActiveMQDialect(), RabbitMQDialect()],
                         ids=["activemq", "rabbitmq"])
def test_mdb_gives_up_on_a_silent_broker_before_the_broker_can_give_up_on_mdb(
        dialect: Dialect) -> None:
    """Both brokers drop a connection after 2 to 3 of mdb's intervals of silence (measured),
    at least one interval after a cut (mdb's last byte may be an interval older); mdb's limit
    must be shorter, with the broker's interval as it answers (RabbitMQ: whole seconds, at
    least one)."""
    for heartbeat_ms in (100, 1000, 1500, 2000, 3999, 4000, 10_000, 60_000):
        heartbeats = plan(heartbeat_ms, dialect)
        unit = dialect.heartbeat_unit_ms
        offered = max(unit, -(-heartbeats.ask_ms // unit) * unit)
        limit = heartbeats.silence_limit(f"{offered},{heartbeats.send_ms}")
        assert limit is not None and limit < heartbeats.send_ms / 1000, heartbeat_ms


def test_a_read_after_too_long_a_silence_breaks_the_connection_for_good() -> None:
    silence = Silence()
    silence.heard(0.0)
    silence.heard(100.0)  # no limit before heart-beats were agreed
    assert silence.broken is None
    silence.limit = 1.0
    for now in (100.5, 101.4, 102.4):
        silence.heard(now)
    assert silence.broken is None
    silence.heard(104.0)
    silence.heard(104.1)
    assert silence.broken == pytest.approx((1.6, 1.0))


class Recorder:
    """The loop-side events of a connection (``callbacks.WireEvents``), recorded."""

    def __init__(self) -> None:
        self.silences: list[tuple[float, float]] = []
        self.messages = 0
        self.damaged: list[tuple[dict[str, str], bytes, str]] = []
        self.awaited = {"mine"}  # the receipts the wire awaits
        self.receipts: list[str | None] = []

    def on_connected(self) -> None: ...

    def on_message(self, headers: dict[str, str], body: bytes | str | None) -> None:
        self.messages += 1

    def on_damaged(self, headers: dict[str, str], body: bytes, why: str) -> None:
        self.damaged.append((headers, body, why))

    def on_receipt(self, receipt: str | None) -> bool:
        self.receipts.append(receipt)
        return receipt in self.awaited

    def on_error(self, headers: Mapping[str, str], body: bytes | str | None) -> None: ...

    def on_silence(self, silence: float, limit: float) -> None:
        self.silences.append((silence, limit))

    def lose(self, reason: str) -> None: ...


def test_no_frame_read_after_too_long_a_silence_goes_further() -> None:
    """A MESSAGE frame the broker wrote before it dropped a silent connection arrives once the
    link heals: it never reaches stomp.py's listeners (nor a handler); the wire is told once."""
    now = [0.0]
    passed: list[str] = []
    events = Recorder()
    heard: list[float] = []
    reader = FrameReader(lambda frame, raw: passed.append(frame.cmd), events,
                         Heartbeats(1000, 250), heard_by=lambda: heard.append(now[0]),
                         clock=lambda: now[0])

    def read(raw: bytes, at: float) -> None:
        now[0] = at
        reader.read(raw)

    message = b"MESSAGE\nsubscription:1\nack:a\nmessage-id:m\n\nbody\x00"
    read(b"CONNECTED\nversion:1.2\nheart-beat:250,1000\n\n\x00", 0.0)  # limit 0.625 s
    read(message, 0.5)
    read(message, 1.1)
    read(message, 1.8)  # 0.7 s of silence before it
    read(b"\n", 1.9)
    assert passed == ["CONNECTED"]  # MESSAGE frames go straight to the wire's events
    assert events.messages == 2
    assert heard == [0.0, 0.5, 1.1, 1.8, 1.9]  # stomp.py's heart-beat timeout hears every read
    assert events.silences == [pytest.approx((0.7, 0.625))]


def test_what_was_read_before_too_long_a_silence_is_judged_again_as_it_is_handed_on() -> None:
    """A delivery read before the process paused, taken when it resumes and before the loop
    reads again: the silence up to the take counts as a read would, and the wire is told once."""
    now = [0.0]
    events = Recorder()
    reader = FrameReader(lambda frame, raw: None, events, Heartbeats(1000, 250),
                         heard_by=lambda: None, clock=lambda: now[0])
    reader.read(b"CONNECTED\nversion:1.2\nheart-beat:250,1000\n\n\x00")  # limit 0.625 s
    now[0] = 0.5
    reader.read(b"MESSAGE\nsubscription:1\nack:a\nmessage-id:m\n\nbody\x00")
    now[0] = 1.0
    reader.check()  # 0.5 s since the last read
    assert events.silences == []
    now[0] = 1.2
    reader.check()
    reader.check()
    reader.read(b"\n")
    assert events.silences == [pytest.approx((0.7, 0.625))]


def test_each_frame_read_goes_where_it_is_handled() -> None:
    """Whole MESSAGE frames to the wire, damaged ones (a NUL in a header, no subscription) to
    the wire as damaged, a RECEIPT the wire awaits to the wire alone, every other frame and
    heart-beat to stomp.py."""
    passed: list[tuple[str, dict[str, str], object]] = []
    events = Recorder()
    reader = FrameReader(lambda frame, raw: passed.append((frame.cmd, frame.headers, raw)),
                         events, Heartbeats(0, 0), heard_by=lambda: None)
    reader.read(b"MESSAGE\nsubscription:1\nack:a\n\nok\x00"
                b"MESSAGE\nsubscription:1\nack:b\nx:y\x00z\n\ncut\x00"
                b"MESSAGE\nack:c\n\nlost\x00\n"
                b"RECEIPT\nreceipt-id:mine\n\n\x00"
                b"RECEIPT\nreceipt-id:r\n\n\x00")
    reader.read(b"\n")
    assert events.messages == 1
    assert events.damaged == [
        ({"subscription": "1", "ack": "b", "x": "y\x00z"}, b"cut", NUL_IN_HEADER),
        ({"ack": "c"}, b"lost", NO_SUBSCRIPTION)]
    assert passed == [("RECEIPT", {"receipt-id": "r"}, b"RECEIPT\nreceipt-id:r\n\n"),
                      ("heartbeat", {}, b"\n")]
    assert events.receipts == ["mine", "r"]


# -- delayed sends -----------------------------------------------------------------------------


def framed(target: ReplyTo, message: OutgoingMessage,
           dialect: Dialect) -> tuple[str, dict[str, str]]:
    """The STOMP destination and the headers ``send_frame`` gives a message it sends."""
    headers = send_frame(target, message, dialect)
    assert headers is not None
    return headers["destination"], headers


def test_a_delayed_send_is_held_as_each_dialect_says_at_least_its_delay() -> None:
    queue, topic = Destination.parse("queue:orders"), Destination.parse("topic:orders")
    held = OutgoingMessage(b"x", {"mdb_id": "1"}, delay=1.0001)
    path, headers = framed(queue, held, ActiveMQDialect())
    assert (path, headers["AMQ_SCHEDULED_DELAY"]) == ("/queue/orders", "1001")
    path, headers = framed(queue, held, RabbitMQDialect())
    assert path == "/queue/mdb.delay.1001.orders"
    assert (headers["x-message-ttl"], headers["x-dead-letter-exchange"],
            headers["x-dead-letter-routing-key"]) == ("1001", "", "orders")
    long_name = Destination.parse("queue:" + "q" * 250)
    path, headers = framed(long_name, held, RabbitMQDialect())
    assert len(path.removeprefix("/queue/")) <= 255 and path.startswith("/queue/mdb.delay.1001.")
    assert headers["x-dead-letter-routing-key"] == long_name.name
    assert framed(queue, OutgoingMessage(b"x", {}), RabbitMQDialect())[0] == "/queue/orders"
    for dialect in (ActiveMQDialect(), RabbitMQDialect()):
        with pytest.raises(EncodeError):
            send_frame(topic, held, dialect)


def test_a_held_activemq_send_with_an_expiry_has_no_timestamp_so_its_expiry_stays() -> None:
    queue = Destination.parse("queue:orders")
    held = OutgoingMessage(b"x", {"mdb_id": "1"}, delay=3.0, copy_of=JAVA_TEXT)
    _, headers = framed(queue, held, ActiveMQDialect())
    assert (headers["expires"], headers["timestamp"]) == ("1795390101926", "0")
    for received in ({**JAVA_TEXT, "expires": "0"}, {"priority": "4"}):
        unexpiring = OutgoingMessage(b"x", delay=3.0, copy_of=received)
        _, headers = framed(queue, unexpiring, ActiveMQDialect())
        assert "timestamp" not in headers


def test_a_rabbitmq_copy_expires_when_its_message_would_have() -> None:
    dialect, now = RabbitMQDialect(), 1_000_000
    sent = OutgoingMessage(b"x", {"expiration": "3000"})
    assert dialect.expiry(sent, now) == {"mdb_expires": "1003000"}
    assert dialect.expiry(OutgoingMessage(b"x", {"expiration": "0"}), now) == {}
    # A copy: the time left, by mdb's expiry when it has one, else counted from now.
    received = {"expiration": "3000", "mdb_expires": "1003000"}
    copy = OutgoingMessage(b"x", copy_of=received)  # the core copies no protocol header
    assert dialect.expiry(copy, now + 1000) == {"mdb_expires": "1003000", "expiration": "2000"}
    assert dialect.expiry(copy, now + 5000) == {"mdb_expires": "1003000", "expiration": "0"}
    out_of_a_delay_queue = {"mdb_expires": "1003000"}  # RabbitMQ removed its expiration
    assert dialect.expiry(OutgoingMessage(b"x", copy_of=out_of_a_delay_queue), now + 1000) == {
        "mdb_expires": "1003000", "expiration": "2000"}
    foreign = {"expiration": "3000"}
    assert dialect.expiry(OutgoingMessage(b"x", copy_of=foreign), now) == {
        "mdb_expires": "1003000", "expiration": "3000"}
    assert dialect.expiry(OutgoingMessage(b"x", copy_of={"priority": "4"}), now) == {}


def test_a_rabbitmq_copy_that_expires_before_it_could_be_delivered_is_not_sent() -> None:
    queue, dialect = Destination.parse("queue:orders"), RabbitMQDialect()
    expires = str(round(time.time() * 1000) + 60_000)
    received = {"expiration": "60000", "mdb_expires": expires}
    copy = OutgoingMessage(b"x", copy_of=received)
    assert send_frame(queue, dataclasses.replace(copy, delay=3600.0), dialect) is None
    assert send_frame(queue, dataclasses.replace(copy, delay=1.0), dialect) is not None
    assert send_frame(queue, copy, dialect) is not None
    expired = {"mdb_expires": "1000"}
    assert send_frame(queue, OutgoingMessage(b"x", copy_of=expired), dialect) is None
    # An error copy, or a replay, has no expiry: sent, whatever its original's.
    for outliving in ({"mdb_error_type": "E"}, {"mdb_replays": "1"}):
        copy = OutgoingMessage(b"x", outliving, copy_of=expired)
        assert send_frame(queue, copy, dialect) is not None
    # Not a copy: sent as the application asks.
    assert send_frame(queue, OutgoingMessage(b"x", {"expiration": "0"}), dialect) is not None


def test_what_held_a_message_is_not_inherited_by_its_copies() -> None:
    assert {"scheduledJobId", "AMQ_SCHEDULED_DELAY"} <= ActiveMQDialect.protocol_headers
    assert {"x-message-ttl", "x-dead-letter-routing-key", "x-first-death-queue"} <= (
        RabbitMQDialect.protocol_headers)
    # Nor the expiry: the dialect writes a copy's (``RabbitMQDialect.expiry``).
    assert {"expiration", "mdb_expires"} <= RabbitMQDialect.protocol_headers


# -- cumulative acks in a transaction -------------------------------------------------------


class WrittenFrames:
    """Stands in for a ``Wire``: records what would be written, answers every receipt."""

    address = "fake:0"
    is_open = True

    def __init__(self) -> None:
        self.frames: list[tuple[str, Mapping[str, str]]] = []

    def check_alive(self) -> None: ...

    def write(self, command: str, headers: Mapping[str, str], body: bytes = b"",
              held: bool = False) -> None:
        self.frames.append((command, headers))

    async def request(self, command: str, headers: Mapping[str, str], body: bytes = b"",
                      **kwargs: object) -> None:
        self.write(command, headers, body)


def holding(count: int, wire: WrittenFrames, dialect: Dialect, *, cumulative: bool,
            releases_unacked: bool) -> StompSubscription:
    """A subscription of queue ``q`` on ``wire`` holding ``count`` deliveries, acks a0, a1…"""
    queue = Destination.parse("queue:q")
    subscription = StompSubscription(
        wire, "1", queue, queue, cumulative=cumulative,  # type: ignore[arg-type]
        releases_unacked=releases_unacked, dialect=dialect)
    for n in range(count):
        subscription.deliver({"ack": f"a{n}", "message-id": f"m{n}", "subscription": "1"}, b"x")
    return subscription


@pytest.mark.parametrize("cumulative", [True, False])
def test_a_transaction_writes_one_ack_per_cumulative_subscription(cumulative: bool) -> None:
    """``ack:client`` settles the earlier deliveries too, and a transaction holds them all:
    a batch costs one ACK frame, the last, written by the commit."""
    wire = WrittenFrames()
    subscription = holding(3, wire, ActiveMQDialect(), cumulative=cumulative,
                           releases_unacked=True)
    deliveries = [subscription.receive_nowait() for _ in range(3)]
    transaction = StompTransaction(wire, ActiveMQDialect(), "t")  # type: ignore[arg-type]

    async def settle() -> None:
        for delivery in deliveries:
            assert delivery is not None
            await transaction.ack(delivery)
        await transaction.commit()

    asyncio.run(settle())
    acks = [headers["id"] for command, headers in wire.frames if command == "ACK"]
    assert acks == (["a2"] if cumulative else ["a0", "a1", "a2"])
    assert wire.frames[-1][0] == "COMMIT"
    assert len(subscription.unsettled) == 0


# -- settling with confirmed sends (RabbitMQ) ---------------------------------------------------


class AwaitedReceipts(WrittenFrames):
    """A ``Wire`` whose receipts come when ``answer`` is set: the SEND to ``refused`` is refused."""

    def __init__(self, refused: str = "") -> None:
        super().__init__()
        self.answer = asyncio.Event()
        self.refused = refused

    async def request(self, command: str, headers: Mapping[str, str], body: bytes = b"",
                      **kwargs: object) -> None:
        self.write(command, headers, body)
        await self.answer.wait()
        if headers.get("destination") == self.refused:
            errors = kwargs["errors"]
            assert isinstance(errors, ReceiptErrors)
            raise errors.error(Unanswered("refused", SEND, "access_refused"))


@pytest.mark.parametrize("refused", ["", "/queue/out1"])
def test_a_confirmed_commit_writes_every_send_before_awaiting_one_and_acks_after_them_all(
        refused: str) -> None:
    """One round trip for all of a settlement's sends, however many; its ACKs only once every
    send was confirmed, none after a refused one (docs/architecture.md, "Delivery contract")."""
    wire = AwaitedReceipts(refused)
    subscription = holding(2, wire, RabbitMQDialect(), cumulative=False, releases_unacked=False)
    transaction = StompTransaction(wire, RabbitMQDialect(), "t")  # type: ignore[arg-type]

    async def settle() -> None:
        for n in range(3):
            await transaction.send(Destination.parse(f"queue:out{n}"),
                                   OutgoingMessage(b"x", {"mdb_id": f"o{n}"}))
        for _ in range(2):
            delivery = subscription.receive_nowait()
            assert delivery is not None
            await transaction.ack(delivery)
        commit = asyncio.ensure_future(transaction.commit())
        await anyio.wait_all_tasks_blocked()
        assert [command for command, _ in wire.frames] == ["SEND"] * 3  # none answered yet
        wire.answer.set()
        await commit

    if refused:
        with pytest.raises(TransactionRolledBack, match="access_refused"):
            asyncio.run(settle())
        assert [command for command, _ in wire.frames] == ["SEND"] * 3
        assert len(subscription.unsettled) == 2
    else:
        asyncio.run(settle())
        assert [command for command, _ in wire.frames] == ["SEND"] * 3 + ["ACK"] * 2
        assert len(subscription.unsettled) == 0


# -- the prefetched deliveries -----------------------------------------------------------------


@pytest.mark.anyio
async def test_receivers_waiting_on_one_inbox_each_take_one_delivery_then_wait_again() -> None:
    prefetched = Prefetched()
    deliveries = [Delivery(Destination.parse("queue:q"), f"{n}".encode(), {}, f"m{n}", False,
                           token=n) for n in range(3)]
    receivers = [asyncio.ensure_future(prefetched.get()) for _ in range(3)]
    await anyio.wait_all_tasks_blocked()
    prefetched.put(deliveries[0])
    prefetched.put(deliveries[1])  # wakes all three: one finds nothing left and waits again
    await anyio.wait_all_tasks_blocked()
    assert sorted(r.result().body for r in receivers if r.done()) == [b"0", b"1"]
    prefetched.put(deliveries[2])
    await asyncio.wait(receivers)
    assert sorted(r.result().body for r in receivers) == [b"0", b"1", b"2"]
    prefetched.fail(ConnectionLost, "gone")
    with pytest.raises(ConnectionLost, match="gone"):
        await prefetched.get()


# -- reading the socket ----------------------------------------------------------------------


class QuickAcks(socket.socket):
    """A client socket that records each ``TCP_QUICKACK`` set on it, and each write."""

    quickacks = 0
    writes: list[bytes]

    def sendall(self, data: Any, *args: Any) -> None:
        self.writes.append(bytes(data))
        super().sendall(data, *args)

    def setsockopt(self, level: int, option: int, value: Any, *args: Any) -> None:
        if (level, option) == (socket.IPPROTO_TCP, getattr(socket, "TCP_QUICKACK", -1)):
            self.quickacks += 1
        super().setsockopt(level, option, value, *args)


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="Linux only")
def test_each_read_asks_the_kernel_to_ack_at_once() -> None:
    """Quick acks, re-armed after each read: a broker with Nagle's algorithm on holds a small
    frame until its previous one is acked, and a delayed ACK would hold it ~40 ms
    (docs/activemq.md)."""
    chunks: list[bytes] = []

    async def read_twice() -> None:
        loop = asyncio.get_running_loop()
        with socket.create_server(("127.0.0.1", 0)) as server:
            plain = socket.create_connection(server.getsockname())
            client = QuickAcks(fileno=plain.detach())
            broker, _ = server.accept()
            got = asyncio.Event()

            class Reader:
                def read(self, data: bytes) -> None:
                    chunks.append(data)
                    got.set()

            # stomp.py's transport, as far as LoopReading uses it: connected is what stomp.py
            # calls once its socket is connected, in place of starting its receiver thread.
            connected: list[Callable[[object], None]] = []
            transport = types.SimpleNamespace(
                socket=client, running=True, blocking=True, disconnect_socket=client.close,
                override_threading=connected.append, send=None)
            LoopReading(loop, transport, Reader())  # type: ignore[arg-type]
            connected[0](None)
            for frame in (b"RECEIPT\n\n\0", b"MESSAGE\n\n\0"):
                got.clear()
                broker.sendall(frame)
                await got.wait()
            assert client.quickacks == 2
            loop.remove_reader(client.fileno())
            broker.close()
            client.close()

    asyncio.run(read_twice())
    assert b"".join(chunks) == b"RECEIPT\n\n\0MESSAGE\n\n\0"


def test_a_held_frame_is_written_with_the_next_one_in_order() -> None:
    """A BEGIN and a transacted ACK are held back (``mdb_stomp.protocol.reading``, "Held frames"):
    one write for BEGIN and SEND, one for ACK and COMMIT."""

    async def write() -> list[bytes]:
        loop = asyncio.get_running_loop()
        with socket.create_server(("127.0.0.1", 0)) as server:
            plain = socket.create_connection(server.getsockname())
            client = QuickAcks(fileno=plain.detach())
            client.writes = []
            broker, _ = server.accept()
            transport = types.SimpleNamespace(
                socket=client, running=True, blocking=True, disconnect_socket=client.close,
                override_threading=lambda connected: None, send=None)
            reading = LoopReading(loop, transport,
                                  types.SimpleNamespace(read=print))  # type: ignore[arg-type]
            for frame, held in ((b"BEGIN", True), (b"SEND", False), (b"ACK", True),
                                (b"COMMIT", False)):
                reading.write(frame, held)
            broker.close()
            client.close()
            return client.writes

    assert asyncio.run(write()) == [b"BEGINSEND", b"ACKCOMMIT"]


class _Told:
    """A subscriber that only records what the wire tells it."""

    settled_on_arrival = False

    def __init__(self) -> None:
        self.lost: list[str] = []

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None:
        raise AssertionError("no MESSAGE frame here")

    def connection_lost(self, why: str) -> None:
        self.lost.append(why)

    def cancelled(self, why: str) -> None:
        raise AssertionError("no subscription named")


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", [RabbitMQDialect(), ActiveMQDialect()],
                         ids=["rabbitmq", "activemq"])
async def test_a_delivery_left_to_a_closed_subscription_closes_the_connection_on_rabbitmq(
    dialect: Dialect,
) -> None:
    """RabbitMQ turns a delivery dispatched while it cancelled a consumer into an ERROR after
    the UNSUBSCRIBE's receipt, and keeps the message unacked with the connection until it
    closes (``mdb_stomp.dialects.rabbitmq``): the wire closes it, so that the broker redelivers it.
    Elsewhere such an ERROR is only logged."""
    wire = Wire(ConnectionOptions("stomp://127.0.0.1:9"), "127.0.0.1", 9, "/",
                asyncio.get_running_loop(),
                Heartbeats.plan(4000), dialect.explain, dialect.orphans_delivery)
    wire.on_connected()
    other = _Told()
    wire.attach("2", other)  # another slot's subscription on the connection
    wire.on_error({"message": "Subscription not found", "content-type": "text/plain"},
                  b"There is no current subscription with tag 'T_1'.")
    closes = isinstance(dialect, RabbitMQDialect)
    assert (wire.is_open, len(other.lost)) == (not closes, int(closes))
    wire.lose("the test ended")  # nothing was connected: nothing to close


async def subscribe_answered_after(dialect: Dialect, headers: dict[str, str], body: bytes,
                                   monkeypatch: pytest.MonkeyPatch) -> tuple[Wire, Unanswered]:
    """A SUBSCRIBE on a wire of ``dialect``'s, answered by an ERROR of ``headers`` and
    ``body`` naming no receipt, then by its receipt: the wire, and how the SUBSCRIBE went
    unanswered."""
    wire = Wire(ConnectionOptions("stomp://127.0.0.1:9"), "127.0.0.1", 9, "/",
                asyncio.get_running_loop(), Heartbeats.plan(4000), dialect.explain,
                dialect.orphans_delivery, dialect.lost_race)
    wire.on_connected()
    # Nothing is connected: nothing is written.
    monkeypatch.setattr(wire._reading, "write", lambda frame, held=False: None)
    outcome: list[Unanswered] = []

    async def subscribe() -> None:
        try:
            await wire.confirm("SUBSCRIBE", {"id": "1", "destination": "/topic/t"})
        except Unanswered as unanswered:
            outcome.append(unanswered)

    async with anyio.create_task_group() as group:
        group.start_soon(subscribe)
        await anyio.wait_all_tasks_blocked()
        wire.on_error(headers, body)
        assert wire.on_receipt("1")
    [unanswered] = outcome
    return wire, unanswered


@pytest.mark.anyio
async def test_a_subscribe_answered_after_an_error_naming_no_receipt_closes_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RabbitMQ refuses a SUBSCRIBE the user may not make with an ERROR naming no receipt,
    then answers its receipt: it is reported refused. The ERROR may have been about something
    else and the consumer made, holding what the broker hands it with nothing here to take it:
    the connection is closed, so that the broker redelivers whatever that was."""
    wire, refused = await subscribe_answered_after(
        RabbitMQDialect(), {"message": "access_refused"}, b"", monkeypatch)
    assert refused.why == "refused"
    assert not wire.is_open


@pytest.mark.anyio
@pytest.mark.parametrize(("dialect", "why"), [(RabbitMQDialect(), "lost"),
                                               (ActiveMQDialect(), "refused")],
                         ids=["rabbitmq", "activemq"])
async def test_a_subscribe_whose_queue_another_connection_was_declaring_is_lost_not_refused(
    dialect: Dialect, why: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a RabbitMQ cluster, SUBSCRIBEs declaring one new queue at once from several nodes
    may race: one is answered ``not_found`` for the queue it declares (``lost_race``). That is
    a lost connection, which the container makes again, not a refusal, which would end a
    container that is starting. Elsewhere ``not_found`` stays a refusal."""
    wire, unanswered = await subscribe_answered_after(
        dialect, {"message": "not_found"},
        b"NOT_FOUND - no queue 'Consumer.shop.t' in vhost '/'\n", monkeypatch)
    assert unanswered.why == why and "no queue 'Consumer.shop.t'" in unanswered.detail
    errors = ReceiptErrors("topic:t", refused=SubscriptionFailed, unconfirmed=SubscriptionFailed)
    assert type(errors.error(unanswered)) is (ConnectionLost if why == "lost"
                                              else SubscriptionFailed)
    assert not wire.is_open
