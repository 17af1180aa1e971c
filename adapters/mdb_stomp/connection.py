"""The broker seam on STOMP 1.2, implemented with stomp.py and bridged into anyio.

Threads. stomp.py reads frames on its own receiver thread and sends heartbeats on another. The
receiver's callbacks (``_Listener``) never touch adapter state: each hands its frame to the event
loop captured at connect time with ``loop.call_soon_threadsafe``, and all state below lives on
that loop (anyio's asyncio backend is assumed). Writes (SEND, ACK, BEGIN, COMMIT, ...) are made
directly from the loop: they are short socket writes, and one blocked by a hung broker is
released by the heartbeat timeout, which shuts the socket down.

Outcomes. SUBSCRIBE, COMMIT and a non-transacted SEND carry a receipt and wait for it at most
``ConnectionOptions.receipt_timeout``; an ERROR frame naming the receipt answers it negatively.
Everything else (ACK, BEGIN, ABORT, transacted SEND) is fire-and-forget: a failure there shows up
at the COMMIT. stomp.py exceptions never leave this module; they become ``mdb.errors``.

Cumulative acks. ActiveMQ subscriptions use ``ack:client`` (see ``mdb_stomp.dialect``), where an ACK
settles every earlier delivery of the subscription too. ActiveMQ dispatches the next message as
soon as it sees a transacted ACK, before the COMMIT, and an ABORT leaves the acked message
unsettled on the live subscription: a later ACK of the next message would then silently settle
the aborted one, which is never redelivered (measured on 5.17.2). Each subscription therefore
tracks its unsettled deliveries in dispatch order and refuses, with ``BrokerError`` and before
anything is written, an ack that would settle an earlier delivery not settled in the same
transaction. The caller settles (or requeues) the earlier one first, or closes the subscription
so the broker redelivers it. Subscriptions with individual acks (``client-individual``, used on
RabbitMQ) skip that ordering check; the other checks (already settled, held by another open
transaction) stay.

Closing a subscription. Where an UNSUBSCRIBE leaves the unacked deliveries with the connection
(RabbitMQ, ``Dialect.unsubscribe_releases_unacked``), closing a subscription that still holds
any closes the whole connection, the only way to have them redelivered; see
``StompSubscription.close``.

Staleness. A connection is one generation: once it is lost (socket closed, heartbeat timeout,
failed write, ``close``) every pending receipt fails, every subscription's ``receive`` raises
``ConnectionLost`` and prefetched deliveries are dropped (the broker redelivers them, flagged).
A delivery's token names its subscription and through it its connection, so an ack of a
delivery from another generation, or from a closed subscription, is recognised and never
written to any broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket as _socket
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import stomp

from mdb.broker import (
    Connection,
    ConnectionOptions,
    Delivery,
    Subscription,
    SubscriptionRequest,
    Transaction,
)
from mdb.destinations import Destination
from mdb.errors import (
    BrokerError,
    ConfigurationError,
    ConnectionFailed,
    ConnectionLost,
    SendOutcomeUnknown,
    SubscriptionFailed,
    TransactionRolledBack,
)
from mdb.message import OutgoingMessage
from mdb_stomp.dialect import DIALECTS, PROTOCOL_HEADERS, Dialect

log = logging.getLogger("mdb_stomp")

DEFAULT_PORT = 61613
# ActiveMQ was measured leaving gaps of ~1.75x the agreed heartbeat interval; stomp.py's default
# tolerance (1.5x) would drop healthy connections.
HEARTBEAT_RECEIVE_SCALE = 2.5
# close() waits at most this long (and at most receipt_timeout) for the DISCONNECT receipt.
_CLOSE_GRACE = 2.0
# Headers that structure a frame or describe one received delivery; the adapter sets its own.
_FRAME_HEADERS = frozenset(
    {
        "destination",
        "content-length",
        "receipt",
        "transaction",
        "message-id",
        "subscription",
        "ack",
        "redelivered",
    }
)


class StompBroker:
    """``Broker`` for ``stomp+<dialect>://host[:port]`` URLs (``stomp+activemq``,
    ``stomp+rabbitmq``).

    Construction validates the URL (``ConfigurationError``); ``connect`` opens one STOMP 1.2
    connection with heartbeats of ``heartbeat_ms`` both ways. No ``client-id`` is sent: ActiveMQ
    refuses a second connection with the same one, and the container opens several.
    """

    def __init__(self, options: ConnectionOptions) -> None:
        parts = urlsplit(options.url)
        dialect = DIALECTS.get(parts.scheme)
        if dialect is None:
            raise ConfigurationError(
                f"broker url {options.url!r}: mdb_stomp serves {', '.join(sorted(DIALECTS))}"
            )
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ConfigurationError(f"broker url {options.url!r}: invalid port") from None
        if not parts.hostname:
            raise ConfigurationError(
                f"broker url {options.url!r} must be written '{parts.scheme}://HOST:PORT'"
            )
        self._options = options
        self._dialect = dialect()
        self.system = dialect.broker.lower()  # messaging.system: activemq, rabbitmq
        self._host: str = parts.hostname
        self._port: int = port
        self._username = options.username if options.username is not None else parts.username
        self._password = options.password if options.password is not None else parts.password

    async def connect(self) -> StompConnection:
        """Open a connection; raises ``ConnectionFailed`` (refused, bad credentials, or no
        CONNECTED frame within ``connect_timeout``)."""
        connection = StompConnection(
            self._options, self._dialect, self._host, self._port, asyncio.get_running_loop()
        )
        await connection._open(self._username, self._password)
        return connection


@dataclass(frozen=True, slots=True, eq=False)
class AckToken:
    """``Delivery.token``: the MESSAGE frame's ``ack`` header and the subscription (hence the
    connection generation) it came from."""

    ack_id: str
    subscription: StompSubscription


class _Refused(Exception):
    """An ERROR frame answered the request."""


class _Lost(Exception):
    """The connection went away before the answer came."""


class _NoReceipt(Exception):
    """No answer within the receipt timeout."""


class _Listener(stomp.ConnectionListener):  # type: ignore[misc]
    """Runs on stomp.py's threads: forwards every event to the loop, touches nothing else."""

    def __init__(self, connection: StompConnection) -> None:
        self._connection = connection

    def on_connected(self, frame: Any) -> None:
        self._connection._post(self._connection._on_connected)

    def on_message(self, frame: Any) -> None:
        self._connection._post(self._connection._on_message, frame.headers, frame.body)

    def on_receipt(self, frame: Any) -> None:
        self._connection._post(self._connection._on_receipt, frame.headers.get("receipt-id"))

    def on_error(self, frame: Any) -> None:
        self._connection._post(self._connection._on_error, frame.headers, frame.body)

    def on_disconnected(self) -> None:
        self._connection._post(self._connection._on_lost, "the connection to the broker closed")

    def on_heartbeat_timeout(self) -> None:
        self._connection._post(self._connection._on_lost, "no heartbeat from the broker in time")


class _Inbox:
    """Deliveries pushed by the loop's frame handler, awaited by ``receive``; loop thread only."""

    def __init__(self) -> None:
        self._items: deque[Delivery] = deque()
        self._ready = asyncio.Event()
        self._failure: tuple[type[BrokerError], str] | None = None

    def put(self, delivery: Delivery) -> None:
        if self._failure is None:
            self._items.append(delivery)
            self._ready.set()

    def fail(self, error: type[BrokerError], message: str) -> None:
        """From now on ``get`` raises; buffered deliveries are dropped, not drained."""
        if self._failure is None:
            self._failure = (error, message)
            self._items.clear()
            self._ready.set()

    def get_nowait(self) -> Delivery | None:
        """A buffered delivery, or None (also once failed); never waits."""
        if self._failure is None and self._items:
            return self._items.popleft()
        return None

    async def get(self) -> Delivery:
        while True:
            if self._failure is not None:
                error, message = self._failure
                raise error(message)
            if self._items:
                return self._items.popleft()
            # Several receivers may wait on one event; only replace it once it has fired.
            if self._ready.is_set():
                self._ready = asyncio.Event()
            await self._ready.wait()


class StompConnection(Connection):
    """One STOMP 1.2 connection (one generation). Made by ``StompBroker.connect``."""

    def __init__(
        self,
        options: ConnectionOptions,
        dialect: Dialect,
        host: str,
        port: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._options = options
        self._dialect = dialect
        self._address = f"{host}:{port}"
        self._loop = loop
        heartbeat = max(0, options.heartbeat_ms)
        self._stomp: Any = stomp.Connection12(
            host_and_ports=[(host, port)],
            try_loopback_connect=False,
            reconnect_attempts_max=1,  # reconnecting is the container's job, not stomp.py's
            timeout=options.connect_timeout,
            heartbeats=(heartbeat, heartbeat),
            heart_beat_receive_scale=HEARTBEAT_RECEIVE_SCALE,
            vhost=dialect.vhost,
            auto_decode=False,  # bodies stay bytes
        )
        self._stomp.set_listener("mdb", _Listener(self))
        self._connected: asyncio.Future[None] = loop.create_future()
        self._receipts: dict[str, asyncio.Future[None]] = {}
        self._subscriptions: dict[str, StompSubscription] = {}
        self._ids = itertools.count(1)
        self._lost_reason: str | None = None
        self._gone = asyncio.Event()
        self._closed = False

    # -- the seam ---------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._lost_reason is None and not self._closed

    async def subscribe(self, request: SubscriptionRequest) -> StompSubscription:
        """SUBSCRIBE and wait for its receipt. ``SubscriptionFailed`` when the dialect or the
        broker refuses it (an invalid selector, ...) or no receipt comes in time;
        ``ConnectionLost`` when the connection is or goes down meanwhile."""
        spec = self._dialect.subscribe_spec(request)
        self._check_alive()
        sub_id = str(next(self._ids))
        subscription = StompSubscription(
            self, sub_id, request.destination, spec.requeue_destination,
            cumulative=spec.ack_mode == "client",
        )
        # Registered before the SUBSCRIBE: MESSAGE frames may overtake the receipt.
        self._subscriptions[sub_id] = subscription
        receipt = uuid.uuid4().hex
        headers = dict(spec.headers, receipt=receipt)
        try:
            self._write(
                self._stomp.subscribe, spec.path, sub_id, ack=spec.ack_mode, headers=headers
            )
            await self._wait_receipt(receipt)
        except _Refused as refused:
            self._forget(subscription)
            raise SubscriptionFailed(
                f"{request.destination}: the broker refused the subscription: {refused}"
            ) from None
        except _NoReceipt:
            self._forget(subscription, unsubscribe=True)
            raise SubscriptionFailed(
                f"{request.destination}: no receipt for SUBSCRIBE from {self._address} within "
                f"{self._options.receipt_timeout}s"
            ) from None
        except _Lost as lost:
            self._forget(subscription)
            raise ConnectionLost(f"{self._address}: {lost}") from None
        except BaseException:
            self._forget(subscription, unsubscribe=True)
            raise
        return subscription

    async def delete_subscription(self, topic: Destination, name: str) -> None:
        """SUBSCRIBE to the subscription, then UNSUBSCRIBE with the dialect's deleting headers,
        each with a receipt. The SUBSCRIBE is not registered: what the broker pushes meanwhile
        is dropped unacked and deleted with the queue."""
        spec = self._dialect.subscribe_spec(
            SubscriptionRequest(topic, name, durable=True, selector=None, prefetch=1))
        deleting = self._dialect.delete_headers(spec)
        sub_id = str(next(self._ids))
        what = f"subscription {name!r} of {topic}"
        await self._confirmed(what, self._stomp.subscribe, spec.path, sub_id, ack=spec.ack_mode,
                              headers=spec.headers)
        await self._confirmed(what, self._stomp.unsubscribe, id=sub_id, headers=deleting)

    async def _confirmed(self, what: str, method: Callable[..., Any], *args: Any,
                         headers: dict[str, str], **kwargs: Any) -> None:
        """Write a frame with a receipt and wait for it; ``SubscriptionFailed`` if refused or
        unanswered, ``ConnectionLost`` if the connection is down."""
        receipt = uuid.uuid4().hex
        self._write(method, *args, headers=dict(headers, receipt=receipt), **kwargs)
        try:
            await self._wait_receipt(receipt)
        except _Refused as refused:
            raise SubscriptionFailed(f"{what}: the broker refused: {refused}") from None
        except _NoReceipt:
            raise SubscriptionFailed(
                f"{what}: no receipt from {self._address} within "
                f"{self._options.receipt_timeout}s; the outcome is unknown"
            ) from None
        except _Lost as lost:
            raise ConnectionLost(f"{self._address}: {lost}") from None

    async def begin(self) -> StompTransaction:
        """BEGIN (no receipt: a refused BEGIN fails the COMMIT). ``ConnectionLost`` when down."""
        transaction = StompTransaction(self, uuid.uuid4().hex)
        self._write(self._stomp.begin, transaction=transaction.id)
        return transaction

    async def ack(self, delivery: Delivery) -> None:
        """ACK outside a transaction, without a receipt.

        Raises, writing nothing: ``ConnectionLost`` when the delivery is stale (from another
        connection or a closed subscription) or the connection is down, and the broker
        redelivers it, flagged; ``BrokerError`` when the delivery was already settled or
        acked in an open transaction, or an earlier delivery of its subscription is still
        unsettled (the cumulative ACK would settle that one too, see the module docstring).
        """
        token = self._own_token(delivery)
        token.subscription._settle_alone(token.ack_id)
        self._write(self._stomp.ack, id=token.ack_id)

    async def send(self, destination: Destination, message: OutgoingMessage) -> None:
        """SEND with a receipt. ``ConnectionLost`` when it surely was not sent (down before or
        during the write); ``SendOutcomeUnknown`` when no receipt came (timeout, or the
        connection dropped after the write); ``BrokerError`` when the broker refused it."""
        receipt = uuid.uuid4().hex
        headers = self._send_headers(message)
        headers["receipt"] = receipt
        self._write(
            self._stomp.send, self._dialect.send_path(destination), message.body, headers=headers
        )
        try:
            await self._wait_receipt(receipt)
        except _Refused as refused:
            raise BrokerError(f"{destination}: the broker refused the message: {refused}") from None
        except _NoReceipt:
            raise SendOutcomeUnknown(
                f"{destination}: no receipt from {self._address} within "
                f"{self._options.receipt_timeout}s; the message may have been stored"
            ) from None
        except _Lost as lost:
            raise SendOutcomeUnknown(
                f"{destination}: {lost} before the receipt; the message may have been stored"
            ) from None

    async def close(self) -> None:
        """DISCONNECT, wait briefly for its receipt, then close the socket. Never raises and
        returns within about min(receipt_timeout, 2 s) even on a hung broker."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._lost_reason is None:
                try:
                    # Without a receipt argument stomp.py does not block joining its thread;
                    # the receiver closes the socket when the DISCONNECT receipt arrives.
                    self._stomp.disconnect()
                except Exception:
                    log.debug("DISCONNECT to %s failed", self._address, exc_info=True)
                with anyio.move_on_after(min(self._options.receipt_timeout, _CLOSE_GRACE)):
                    await self._gone.wait()
        finally:
            self._on_lost("the connection was closed")
            self._shutdown_transport()

    # -- used by subscriptions and transactions --------------------------------------------

    def _check_alive(self) -> None:
        if self._lost_reason is not None:
            raise ConnectionLost(f"{self._address}: {self._lost_reason}")

    def _check_lost(self) -> None:
        if self._lost_reason is not None:
            raise _Lost(self._lost_reason)

    def _write(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call a stomp.py write; raise ``ConnectionLost`` if down before or during it."""
        self._check_alive()
        try:
            method(*args, **kwargs)
        except Exception as error:
            reason = f"a write failed ({type(error).__name__}: {error})"
            self._on_lost(reason)
            self._shutdown_transport()
            raise ConnectionLost(f"{self._address}: {reason}") from error

    async def _wait_receipt(self, receipt: str) -> None:
        """Wait for the answer to a frame just written with header ``receipt:<receipt>``.
        Raises ``_Refused``, ``_Lost`` or ``_NoReceipt``.

        Registering after the write cannot miss the answer: answers are handled on this loop,
        which does not run them before this coroutine first suspends.
        """
        self._check_lost()
        answered: asyncio.Future[None] = self._loop.create_future()
        self._receipts[receipt] = answered
        try:
            with anyio.fail_after(self._options.receipt_timeout):
                await answered
        except TimeoutError:
            raise _NoReceipt() from None
        finally:
            self._receipts.pop(receipt, None)

    def _own_token(self, delivery: Delivery) -> AckToken:
        """The delivery's token if acking it on this connection is meaningful, else raise
        ``ConnectionLost`` saying why nothing will be written."""
        token = delivery.token
        if not isinstance(token, AckToken) or token.subscription._connection is not self:
            raise ConnectionLost(
                f"{self._address}: the delivery of {delivery.broker_message_id} came from another "
                "connection; the broker that sent it redelivers it"
            )
        if token.subscription._closed:
            raise ConnectionLost(
                f"{self._address}: the subscription of {delivery.broker_message_id} was closed; "
                "the broker redelivers it"
            )
        self._check_alive()
        return token

    def _send_headers(self, message: OutgoingMessage) -> dict[str, str]:
        headers = {
            _escape_name(name): str(value)
            for name, value in message.headers.items()
            if name not in _FRAME_HEADERS
        }
        headers.update(self._dialect.send_headers(message))
        return headers

    def _forget(self, subscription: StompSubscription, unsubscribe: bool = False) -> None:
        subscription._closed = True
        subscription._inbox.fail(ConnectionLost, "the subscription was not created")
        self._subscriptions.pop(subscription._id, None)
        if unsubscribe and self._lost_reason is None:
            try:
                self._stomp.unsubscribe(id=subscription._id)
            except Exception:
                log.debug("UNSUBSCRIBE %s failed", subscription._id, exc_info=True)

    def _shutdown_transport(self) -> None:
        """Close the socket so stomp.py's threads end; idempotent, never raises."""
        transport = self._stomp.transport
        transport.running = False
        try:
            if transport.socket is not None:
                transport.disconnect_socket()
        except Exception:
            log.debug("closing the socket to %s failed", self._address, exc_info=True)

    # -- opening ------------------------------------------------------------------------------

    async def _open(self, username: str | None, password: str | None) -> None:
        timeout = self._options.connect_timeout
        failure: str | None = None
        # stomp.py's own wait never returns from a hung broker, and its TCP connect blocks: do
        # the TCP part in a worker thread and put our own deadline on the CONNECTED frame.
        with anyio.move_on_after(timeout) as deadline:
            try:
                await anyio.to_thread.run_sync(
                    self._connect_blocking, username, password, abandon_on_cancel=True
                )
                await self._connected
            except (_Refused, _Lost) as error:
                failure = str(error)
            except Exception as error:  # stomp.py and socket errors from the TCP connect
                failure = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if deadline.cancelled_caught:
            failure = f"no CONNECTED frame within {timeout}s"
        if failure is not None:
            if not self._connected.done():
                self._connected.cancel()  # nobody awaits it any more
            self._on_lost(failure)
            self._shutdown_transport()
            raise ConnectionFailed(f"could not connect to {self._address}: {failure}")
        socket = self._stomp.transport.socket
        if socket is not None:
            # The connect timeout also applies to reads on this socket; from now on liveness is
            # the heartbeats' job (a read timeout would drop an idle connection without them).
            socket.settimeout(None)
            socket.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        log.debug("connected to %s, heartbeats %s", self._address, self._stomp.heartbeats)

    def _connect_blocking(self, username: str | None, password: str | None) -> None:
        """Worker thread: TCP connect, start stomp.py's threads, write CONNECT."""
        # A plain read of a flag set on the loop: if _open already gave up, do not connect.
        if self._lost_reason is not None:
            return
        self._stomp.connect(username=username, passcode=password, wait=False)
        if self._lost_reason is not None:
            self._shutdown_transport()

    # -- events, on the loop thread -------------------------------------------------------

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        """Called on stomp.py's threads: run ``callback`` on the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)

    def _on_connected(self) -> None:
        if not self._connected.done():
            self._connected.set_result(None)

    def _on_message(self, headers: dict[str, str], body: bytes | str | None) -> None:
        subscription = self._subscriptions.get(headers.get("subscription", ""))
        if subscription is None:
            return  # unsubscribed meanwhile; the broker redelivers what it had dispatched
        subscription._deliver(headers, body)

    def _on_receipt(self, receipt: str | None) -> None:
        answered = self._receipts.get(receipt or "")
        if answered is not None and not answered.done():
            answered.set_result(None)

    def _on_error(self, headers: Mapping[str, str], body: bytes | str | None) -> None:
        message = headers.get("message") or _text(body).split("\n", 1)[0] or "ERROR frame"
        answered = self._receipts.get(headers.get("receipt-id", ""))
        if answered is not None:
            if not answered.done():
                answered.set_exception(_Refused(message))
            return
        if not self._connected.done():
            self._connected.set_exception(_Refused(message))
            return
        log.warning("broker %s reported an error: %s", self._address, message)

    def _on_lost(self, reason: str) -> None:
        if self._lost_reason is not None:
            return
        self._lost_reason = reason
        if not self._connected.done():
            self._connected.set_exception(_Lost(reason))
        for answered in self._receipts.values():
            if not answered.done():
                answered.set_exception(_Lost(reason))
        self._receipts.clear()
        for subscription in self._subscriptions.values():
            subscription._inbox.fail(ConnectionLost, f"{self._address}: {reason}")
        self._gone.set()


class StompSubscription(Subscription):
    """One SUBSCRIBE on one connection; deliveries are buffered up to the prefetch."""

    def __init__(
        self,
        connection: StompConnection,
        sub_id: str,
        destination: Destination,
        requeue: Destination,
        cumulative: bool = True,
    ) -> None:
        self._connection = connection
        # ``ack:client`` (cumulative) needs the guard of ``_check_ackable``; individual acks not.
        self._cumulative = cumulative
        self._id = sub_id
        self._destination = destination
        self._requeue = requeue
        self._inbox = _Inbox()
        self._closed = False
        # Deliveries not yet settled, in dispatch order: ack id -> the open transaction that
        # acked it, or None. Settled ones leave from the front.
        self._unsettled: dict[str, StompTransaction | None] = {}

    @property
    def requeue_destination(self) -> Destination:
        return self._requeue

    async def receive(self) -> Delivery:
        """The next delivery. Raises ``ConnectionLost`` once the connection is lost (buffered
        deliveries are dropped, not drained) or the subscription was closed."""
        return await self._inbox.get()

    def receive_nowait(self) -> Delivery | None:
        """A delivery already received from the broker and not yet taken, or None (also on a
        lost connection or a closed subscription, whose buffered deliveries are dropped)."""
        return self._inbox.get_nowait()

    async def close(self) -> None:
        """UNSUBSCRIBE and wait briefly for its receipt; the broker then redelivers what was
        dispatched and not acked, flagged. Acks of this subscription's deliveries after this
        raise ``ConnectionLost``. Never raises.

        Where the broker keeps unacked deliveries with the connection after an UNSUBSCRIBE
        (``Dialect.unsubscribe_releases_unacked`` false: RabbitMQ), the subscription stays
        registered until the UNSUBSCRIBE receipt, so that deliveries still on the way are
        counted too; if any delivery is then unsettled (or the receipt did not come), the
        connection is closed so that the broker redelivers them. Everything else on that
        connection becomes stale, as after a lost connection."""
        if self._closed:
            return
        connection = self._connection
        self._closed = True
        self._inbox.fail(ConnectionLost, "the subscription was closed")
        releases = connection._dialect.unsubscribe_releases_unacked
        if releases:
            connection._subscriptions.pop(self._id, None)
        confirmed = False
        try:
            if not connection.is_open:
                return
            receipt = uuid.uuid4().hex
            connection._write(
                connection._stomp.unsubscribe, id=self._id, headers={"receipt": receipt}
            )
            with anyio.move_on_after(min(connection._options.receipt_timeout, _CLOSE_GRACE)):
                await connection._wait_receipt(receipt)
                confirmed = True
        except (BrokerError, _Refused, _Lost, _NoReceipt):
            log.debug("UNSUBSCRIBE %s on %s unconfirmed", self._id, connection._address)
        finally:
            connection._subscriptions.pop(self._id, None)
        if not releases and connection.is_open and (self._unsettled or not confirmed):
            log.info(
                "closing the connection to %s: %d unsettled deliveries of a closed "
                "subscription return to the broker only when it closes",
                connection._address,
                len(self._unsettled),
            )
            await connection.close()

    def _claim(self, ack_id: str, transaction: StompTransaction) -> None:
        """Record that ``transaction`` acks ``ack_id``; refuse if that ACK, being cumulative,
        would also settle an earlier delivery the transaction does not hold."""
        self._check_ackable(ack_id, transaction)
        self._unsettled[ack_id] = transaction

    def _settle_alone(self, ack_id: str) -> None:
        """Record a non-transacted ACK of ``ack_id``: only the oldest unsettled, unheld one."""
        self._check_ackable(ack_id, None)
        del self._unsettled[ack_id]

    def _end_claims(self, transaction: StompTransaction, settled: bool) -> None:
        for ack_id, holder in list(self._unsettled.items()):
            if holder is transaction:
                if settled:
                    del self._unsettled[ack_id]
                else:
                    self._unsettled[ack_id] = None

    def _check_ackable(self, ack_id: str, transaction: StompTransaction | None) -> None:
        if ack_id not in self._unsettled:
            raise BrokerError(f"delivery {ack_id} was already settled")
        for earlier, holder in self._unsettled.items() if self._cumulative else ():
            if earlier == ack_id:
                break
            if transaction is None or holder is not transaction:
                raise BrokerError(
                    f"acking delivery {ack_id} would also settle the earlier delivery {earlier} "
                    "of the same subscription (client acks are cumulative); settle that one "
                    "first, or close the subscription so the broker redelivers it"
                )
        holder = self._unsettled[ack_id]
        if holder is not None and holder is not transaction:
            raise BrokerError(f"delivery {ack_id} is already acked in an open transaction")

    def _deliver(self, headers: dict[str, str], body: bytes | str | None) -> None:
        ack_id = headers.get("ack")
        if ack_id is None:
            log.warning("MESSAGE without an ack header on subscription %s dropped", self._id)
            return
        self._unsettled[ack_id] = None
        self._inbox.put(
            Delivery(
                destination=self._destination,
                body=body if isinstance(body, bytes) else _text(body).encode(),
                headers=headers,
                broker_message_id=headers.get("message-id", ""),
                broker_redelivered=headers.get("redelivered") == "true",
                token=AckToken(ack_id, self),
                protocol_headers=PROTOCOL_HEADERS,
            )
        )


class StompTransaction(Transaction):
    """A STOMP transaction: ACKs and SENDs carry its id; COMMIT waits for a receipt."""

    def __init__(self, connection: StompConnection, transaction_id: str) -> None:
        self._connection = connection
        self.id = transaction_id
        self._finished = False
        self._doomed: str | None = None
        self._claimed: set[StompSubscription] = set()

    async def ack(self, delivery: Delivery) -> None:
        """Transacted ACK. A stale delivery raises ``ConnectionLost`` and dooms the
        transaction: its commit raises ``TransactionRolledBack``. ``BrokerError``, writing
        nothing, when the delivery is already settled or held by another transaction, or an
        earlier delivery of its subscription is neither settled nor acked in this transaction
        (see the module docstring)."""
        connection = self._connection
        try:
            token = connection._own_token(delivery)
            self._check_usable()
            token.subscription._claim(token.ack_id, self)
            self._claimed.add(token.subscription)
            connection._write(connection._stomp.ack, id=token.ack_id, transaction=self.id)
        except ConnectionLost as error:
            self._doomed = self._doomed or str(error)
            raise

    async def send(self, destination: Destination, message: OutgoingMessage) -> None:
        """Transacted SEND, no receipt (the COMMIT's receipt covers it). ``ConnectionLost``
        when the connection is down: nothing was sent."""
        connection = self._connection
        headers = connection._send_headers(message)
        headers["transaction"] = self.id
        try:
            self._check_usable()
            connection._write(
                connection._stomp.send,
                connection._dialect.send_path(destination),
                message.body,
                headers=headers,
            )
        except ConnectionLost as error:
            self._doomed = self._doomed or str(error)
            raise

    async def commit(self) -> None:
        """COMMIT and wait for its receipt; ``TransactionRolledBack`` if the broker refused
        it, no receipt came in time, the connection is or went down, or the transaction was
        doomed or already finished. Only a confirmed commit counts its acks as settled."""
        connection = self._connection
        if self._finished:
            raise TransactionRolledBack(f"transaction {self.id} was already finished")
        self._finished = True
        if self._doomed is not None:
            self._abort_quietly()
            self._end_claims(settled=False)
            raise TransactionRolledBack(f"transaction {self.id} rolled back: {self._doomed}")
        committed = False
        try:
            receipt = uuid.uuid4().hex
            connection._write(
                connection._stomp.commit, transaction=self.id, headers={"receipt": receipt}
            )
            await connection._wait_receipt(receipt)
            committed = True
        except ConnectionLost as lost:
            raise TransactionRolledBack(f"transaction {self.id} not committed: {lost}") from None
        except _Refused as refused:
            raise TransactionRolledBack(
                f"transaction {self.id}: the broker refused the commit: {refused}"
            ) from None
        except _NoReceipt:
            raise TransactionRolledBack(
                f"transaction {self.id}: no receipt for COMMIT from {connection._address} within "
                f"{connection._options.receipt_timeout}s; none of it may be relied upon"
            ) from None
        except _Lost as lost:
            raise TransactionRolledBack(
                f"transaction {self.id}: {lost} before the COMMIT receipt"
            ) from None
        finally:
            # Without a confirmed commit the acks count as not done: at worst a later ack is
            # refused (the caller then closes the subscription), never a delivery lost.
            self._end_claims(settled=committed)

    async def abort(self) -> None:
        """ABORT without a receipt; the sends are discarded, acked deliveries stay unsettled
        (ActiveMQ redelivers them only after the subscription or connection closes). Never
        raises."""
        if self._finished:
            return
        self._finished = True
        self._abort_quietly()
        self._end_claims(settled=False)

    def _end_claims(self, settled: bool) -> None:
        for subscription in self._claimed:
            subscription._end_claims(self, settled)
        self._claimed.clear()

    def _check_usable(self) -> None:
        if self._finished:
            raise TransactionRolledBack(f"transaction {self.id} was already finished")

    def _abort_quietly(self) -> None:
        connection = self._connection
        if connection.is_open:
            with contextlib.suppress(ConnectionLost):
                connection._write(connection._stomp.abort, self.id)


def _escape_name(name: str) -> str:
    # stomp.py escapes header values only; STOMP 1.2 escapes names the same way.
    if any(c in name for c in "\\\n\r:"):
        return (
            name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace(":", "\\c")
        )
    return name


def _text(body: bytes | str | None) -> str:
    if body is None:
        return ""
    return body if isinstance(body, str) else body.decode("utf-8", "replace")
