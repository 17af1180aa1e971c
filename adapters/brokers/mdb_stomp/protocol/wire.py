"""``Wire``: one stomp.py connection bridged into anyio, shared by a ``StompConnection`` and
the subscriptions and transactions made from it.

Threads. The event loop captured at connect time (anyio's asyncio backend is assumed) reads the
socket (``mdb_stomp.protocol.reading``: stomp.py's receiver thread is never started), and all state
lives on it. stomp.py sends heart-beats from a thread of its own, handed to the loop. Writes (SEND,
ACK, BEGIN, COMMIT, ...) are made directly from the loop: they are short socket writes, and one
blocked by a hung broker is released by the heart-beat timeout, which shuts the socket down.
mdb encodes them itself (``frames.encode``, the bytes stomp.py would write); stomp.py writes only
CONNECT, DISCONNECT and heart-beats. Its heart-beat thread is no longer told of mdb's frames, so
it writes a heart-beat every interval whatever else was written (one line feed per 4 s by
default); a broker takes one between any two frames.

Outcomes. Frames that carry a receipt are written with ``request`` (see
``mdb_stomp.protocol.receipts``). Everything else (ACK, BEGIN, ABORT, transacted SEND) is
fire-and-forget: a failure there shows up at the COMMIT. stomp.py exceptions never leave the wire;
they become ``mdb.errors``.

Staleness. A wire is one generation: once it is lost (socket closed, heartbeat timeout, a read
after too long a silence, failed write, ``close``) every pending receipt fails and every
attached ``Subscriber`` is told, once. Heart-beats (``mdb_stomp.protocol.heartbeats``) are planned
so that mdb notices a silent link before the broker does; what is read after a longer silence
never reaches a subscriber (``mdb_stomp.protocol.inbound.FrameReader``): the broker may have handed
it to another consumer already; nor does a delivery read earlier and taken after such a silence
(``check_heard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket as _socket
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio
import anyio.to_thread
import stomp

from mdb.errors import ConnectionLost
from mdb.seam.broker import ConnectionOptions
from mdb_stomp.protocol import connect_failure, tls
from mdb_stomp.protocol.callbacks import StompCallbacks
from mdb_stomp.protocol.frame_logs import STOMP_LOG, log_sent
from mdb_stomp.protocol.frames import Command, encode, text
from mdb_stomp.protocol.heartbeats import RECEIVE_SCALE, Heartbeats
from mdb_stomp.protocol.inbound import FrameReader
from mdb_stomp.protocol.reading import LoopReading
from mdb_stomp.protocol.receipts import ReceiptErrors, Receipts, Request, Unanswered

log = logging.getLogger("mdb_stomp")

# close() waits at most this long (and at most receipt_timeout) for the DISCONNECT receipt.
CLOSE_GRACE = 2.0

class OpenWire(Protocol):
    """Opens one more connection to the same broker (``StompBroker.open_wire``), with
    ``headers`` added to its CONNECT frame; ``hears_broker`` False asks the broker for no
    heart-beats, for a connection that is never read from (a lock's): it cannot fall silent,
    and is lost only when its socket is (the broker still hears mdb's)."""

    async def __call__(self, headers: Mapping[str, str] | None = None, *,
                       hears_broker: bool = True) -> Wire: ...


class Subscriber(Protocol):
    """What the wire needs from a subscription: where its MESSAGE frames go, and being told
    once that the connection is lost, or that the broker ended the subscription alone. All are
    called on the loop."""

    #: True when its MESSAGE frames are settled as they arrive (``ack:auto``: they carry no
    #: ``ack`` header); False when each must carry one to be settled.
    settled_on_arrival: bool

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None: ...

    def connection_lost(self, why: str) -> None: ...

    def cancelled(self, why: str) -> None: ...


class Wire:
    """One STOMP 1.2 connection: the stomp.py object, its events, its receipts and whether it
    is open. Loop thread only: ``StompCallbacks`` posts stomp.py's events to the ``on_*`` handlers
    and ``lose``. ``explain`` (``Dialect.explain``) rewrites the text of each ERROR frame;
    ``orphans_delivery`` (``Dialect.orphans_delivery``) tells one that leaves a delivery with
    the connection for a subscription already closed; ``lost_race`` (``Dialect.lost_race``)
    one that made a SUBSCRIBE fail only because another connection declared its queue at
    the same moment."""

    def __init__(
        self,
        options: ConnectionOptions,
        host: str,
        port: int,
        vhost: str | None,
        loop: asyncio.AbstractEventLoop,
        heartbeats: Heartbeats,
        explain: Callable[[str], str] = str,
        orphans_delivery: Callable[[str], bool] = lambda error: False,
        lost_race: Callable[[str], bool] = lambda error: False,
    ) -> None:
        self.options = options
        self._explain = explain
        self._orphans_delivery = orphans_delivery
        self._lost_race = lost_race
        self.address = f"{host}:{port}"
        self._stomp: Any = stomp.Connection12(
            host_and_ports=[(host, port)],
            try_loopback_connect=False,
            reconnect_attempts_max=1,  # reconnecting is the container's job, not stomp.py's
            timeout=options.connect_timeout,
            heartbeats=(heartbeats.send_ms, heartbeats.ask_ms),
            heart_beat_receive_scale=RECEIVE_SCALE,
            vhost=vhost,
            auto_decode=False,  # bodies stay bytes
        )
        self._host, self._port = host, port
        if options.tls is not None:
            tls.enable(self._stomp, host, port, options.tls)
        listener = StompCallbacks(loop, self)
        self._stomp.set_listener("mdb", listener)
        # Every read is timed and every frame cut and checked by mdb: see ``FrameReader`` (a
        # read after too long a silence is in doubt; stomp.py would cut a MESSAGE frame in two
        # at a NUL byte in a header, and drop or misread both pieces).
        transport = self._stomp.transport
        self._frames = FrameReader(transport.process_frame, self, heartbeats,
                                   heard_by=self._stomp.on_heartbeat)
        self._reading = LoopReading(loop, transport, self._frames)
        self._connected: asyncio.Future[None] = loop.create_future()
        self._connecting = Request("CONNECT", self.address, options.connect_timeout)
        self._receipts = Receipts(loop)
        self._subscribers: dict[str, Subscriber] = {}
        self._ids = itertools.count(1)
        self._receipt_ids = map(str, itertools.count(1))  # unique on this connection
        self._lost_reason: str | None = None
        self._stray_errors = 0  # ERROR frames that named no receipt, and the last one's text
        self._last_stray_error = ""
        self._gone = asyncio.Event()
        self._closed = False

    @property
    def is_open(self) -> bool:
        """False once closed or lost (also while ``close`` waits for the DISCONNECT receipt)."""
        return self._lost_reason is None and not self._closed

    def check_alive(self) -> None:
        """``ConnectionLost`` once the connection is lost."""
        if self._lost_reason is not None:
            raise ConnectionLost(f"{self.address}: {self._lost_reason}")

    def check_heard(self) -> None:
        """``check_alive`` for a delivery read earlier and about to be handed on: the
        connection is also lost when nothing has been read on it for longer than the
        heart-beats allow (``FrameReader.check``)."""
        self._frames.check()
        self.check_alive()

    def next_id(self) -> str:
        """A fresh id for a subscription or a transaction: STOMP scopes both to the
        connection, so a count is enough (a uuid per BEGIN cost a system call)."""
        return str(next(self._ids))

    # -- subscribers ----------------------------------------------------------------------------

    def attach(self, sub_id: str, subscriber: Subscriber) -> None:
        """Route the MESSAGE frames of subscription ``sub_id`` to ``subscriber``."""
        self._subscribers[sub_id] = subscriber

    def detach(self, sub_id: str) -> None:
        """Stop routing ``sub_id``; its later MESSAGE frames are dropped (the broker redelivers
        what it had dispatched)."""
        self._subscribers.pop(sub_id, None)

    # -- writing --------------------------------------------------------------------------------

    def write(self, command: Command, headers: Mapping[str, str], body: bytes = b"",
              held: bool = False) -> None:
        """Write a frame (``frames.encode``: ``headers`` are all of its headers);
        ``ConnectionLost`` if the connection is down before or during the write. ``held``: the
        caller surely writes another frame right behind this one, which takes this one along
        (``mdb_stomp.protocol.reading``, "Held frames")."""
        self.check_alive()
        frame = encode(command, headers, body)
        if STOMP_LOG.isEnabledFor(logging.DEBUG):
            log_sent(frame)
        try:
            self._reading.write(frame, held)
        except Exception as error:
            reason = f"a write failed ({type(error).__name__}: {error})"
            self.lose(reason)
            self._shutdown_transport()
            raise ConnectionLost(f"{self.address}: {reason}") from error

    async def request(self, command: Command, headers: Mapping[str, str], body: bytes = b"", *,
                      errors: ReceiptErrors, timeout: float | None = None) -> None:
        """Write a frame as ``write`` does, with a fresh receipt, and return once the broker
        answered it. ``ConnectionLost`` when the write failed; when the answer is a refusal,
        the connection is lost first or no answer comes within ``timeout`` (by default the
        receipt timeout), what ``errors`` says."""
        try:
            await self.confirm(command, headers, body, timeout=timeout)
        except Unanswered as unanswered:
            raise errors.error(unanswered) from None

    async def confirm(self, command: Command, headers: Mapping[str, str], body: bytes = b"",
                      *, timeout: float | None = None) -> None:
        """``request`` for a caller that needs to know how it went unanswered: it raises
        ``Unanswered`` instead of an ``mdb.errors`` exception.

        Registering after the write cannot miss the answer: answers are handled on this loop,
        which does not run them before this coroutine first suspends.
        """
        receipt = next(self._receipt_ids)
        self.write(command, {**headers, "receipt": receipt}, body)
        request = Request(command, self.address,
                          self.options.receipt_timeout if timeout is None else timeout)
        if self._lost_reason is not None:
            raise Unanswered("lost", request, self._lost_reason)
        strays = self._stray_errors
        await self._receipts.wait(receipt, request)
        if command == "SUBSCRIBE" and self._stray_errors > strays:
            # RabbitMQ refuses a SUBSCRIBE the user may not make (access_refused) with an ERROR
            # frame naming no receipt, then answers the receipt and closes the connection. But
            # the ERROR may have been about something else, and the SUBSCRIBE made: its
            # consumer, attached to nothing here, would hold what the broker hands it, unacked,
            # for as long as the connection lives. Closing it first rules that out.
            error = self._last_stray_error
            self.lose("a SUBSCRIBE was answered")  # which adds the error
            self._shutdown_transport()
            if self._lost_race(error):  # nothing refused: subscribing again succeeds
                raise Unanswered("lost", request, self._lost_reason or error)
            raise Unanswered("refused", request, error)

    def unsubscribe_quietly(self, sub_id: str) -> None:
        """UNSUBSCRIBE without a receipt if still connected; never raises."""
        with contextlib.suppress(ConnectionLost):  # lost: nothing left to unsubscribe from
            self.write("UNSUBSCRIBE", {"id": sub_id})

    # -- opening and closing ----------------------------------------------------------------

    async def open(self, username: str | None, password: str | None,
                   headers: Mapping[str, str] | None = None) -> None:
        """Connect, with ``headers`` added to the CONNECT frame, and wait for the CONNECTED
        frame; ``ConnectionFailed`` (refused, a TLS failure, or no CONNECTED frame within
        ``connect_timeout``), ``CredentialsRefused`` for a refused login
        (``mdb_stomp.protocol.connect_failure``)."""
        timeout = self.options.connect_timeout
        failure: str | None = None
        refused = False
        # stomp.py's own wait never returns from a hung broker, and its TCP connect blocks: do
        # the TCP part in a worker thread and put our own deadline on the CONNECTED frame.
        with anyio.move_on_after(timeout) as deadline:
            try:
                await anyio.to_thread.run_sync(
                    self._connect_blocking, username, password, dict(headers or {}),
                    abandon_on_cancel=True
                )
                await self._connected
            except Unanswered as error:
                failure, refused = str(error), error.why == "refused"
            except Exception as error:  # stomp.py and socket errors from the TCP connect
                failure = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if deadline.cancelled_caught:
            failure = f"no CONNECTED frame within {timeout}s"
        if failure is not None:
            if not self._connected.done():
                self._connected.cancel()  # nobody awaits it any more
            elif not self._connected.cancelled():
                # A loss seen while the TCP connect ran (the broker closed the socket at once)
                # failed it before anyone awaited it: taken here, or asyncio logs "Future
                # exception was never retrieved" when it is collected.
                self._connected.exception()
            self.lose(failure)
            self._shutdown_transport()
            raise await connect_failure.explain(
                self.options, self._host, self._port, failure, refused, username)
        socket = self._stomp.transport.socket
        if socket is not None:
            # The connect timeout also applies to this socket; from now on liveness is the
            # heart-beats' job (a timeout would drop an idle connection without them).
            socket.settimeout(None)
            socket.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        log.debug("connected to %s, heartbeats %s", self.address, self._stomp.heartbeats)

    def _connect_blocking(self, username: str | None, password: str | None,
                          headers: dict[str, str]) -> None:
        """Worker thread: TCP connect, start stomp.py's threads, write CONNECT."""
        # A plain read of a flag set on the loop: if open() already gave up, do not connect.
        if self._lost_reason is not None:
            return
        self._stomp.connect(username=username, passcode=password, wait=False, headers=headers)
        if self._lost_reason is not None:
            self._shutdown_transport()

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
                    log.debug("DISCONNECT to %s failed", self.address, exc_info=True)
                with anyio.move_on_after(min(self.options.receipt_timeout, CLOSE_GRACE)):
                    await self._gone.wait()
        finally:
            self.lose("the connection was closed")
            self._shutdown_transport()

    def _shutdown_transport(self) -> None:
        """Close the socket so stomp.py's threads end; idempotent, never raises."""
        transport = self._stomp.transport
        transport.running = False
        try:
            if transport.socket is not None:
                transport.disconnect_socket()
        except Exception:
            log.debug("closing the socket to %s failed", self.address, exc_info=True)

    # -- events, on the loop thread -------------------------------------------------------

    def on_connected(self) -> None:
        """The CONNECTED frame came."""
        if not self._connected.done():
            self._connected.set_result(None)

    def on_message(self, headers: dict[str, str], body: bytes | str | None) -> None:
        """A MESSAGE frame: to its subscriber, or dropped when it is detached meanwhile; one
        its subscriber cannot settle (no ``ack`` header) is damaged."""
        subscriber = self._subscribers.get(headers.get("subscription", ""))
        if subscriber is None:
            return
        if "ack" not in headers and not subscriber.settled_on_arrival:
            data = body if isinstance(body, bytes) else (body or "").encode()
            self.on_damaged(headers, data, "a MESSAGE frame without an ack header")
            return
        subscriber.deliver(headers, body)

    def on_damaged(self, headers: dict[str, str], body: bytes, why: str) -> None:
        """A damaged MESSAGE frame (``FrameReader``): to its subscriber, marked damaged, with
        NUL bytes in its headers replaced by U+FFFD (a copy of it can then be sent). One that
        names no subscription of this connection is NACKed (the broker dead-letters it, see
        docs/security.md) if it names its ``ack``, else the connection is dropped, so that the
        broker redelivers it rather than a slot waiting for ever."""
        clean = {k.replace("\0", "\ufffd"): v.replace("\0", "\ufffd")
                 for k, v in headers.items()}
        subscriber = self._subscribers.get(clean.get("subscription", ""))
        ack_id = clean.get("ack")
        if subscriber is not None and (ack_id is not None or subscriber.settled_on_arrival):
            subscriber.deliver(clean, body, damage=why)
            return
        if ack_id is not None:
            log.error("broker %s: %s, of no subscription here, NACKed (to the broker's "
                      "dead-letter queue): message-id %s", self.address, why,
                      clean.get("message-id"))
            with contextlib.suppress(ConnectionLost):  # lost: the broker redelivers it
                self.write("NACK", {"id": ack_id})
            return
        log.error("broker %s: %s, with no ack header; closing the connection so that the "
                  "broker redelivers it", self.address, why)
        self.lose(f"{why}, with no ack header")
        self._shutdown_transport()

    def on_silence(self, silence: float, limit: float) -> None:
        """Something was read after ``silence`` seconds of nothing, longer than the ``limit``
        the heart-beats allow: the connection is lost, and what was read is dropped unread
        (``FrameReader``)."""
        reason = (f"nothing heard for {silence:.1f} s (the heart-beats allow {limit:.1f} s); "
                  "what came after is dropped unread: the broker may have redelivered it")
        log.warning("broker %s: %s", self.address, reason)
        self.lose(reason)
        self._shutdown_transport()

    def on_receipt(self, receipt: str | None) -> bool:
        """A RECEIPT frame; False when it answers none of mdb's requests (stomp.py's
        DISCONNECT, or one no longer awaited)."""
        return self._receipts.answer(receipt)

    def on_error(self, headers: Mapping[str, str], body: bytes | str | None) -> None:
        """An ERROR frame: it refuses the receipt it names, else ends the subscription it names,
        else refuses the CONNECT, else is logged."""
        first_line = text(body).strip().split("\n", 1)[0]
        message = self._explain(headers.get("message") or first_line or "ERROR frame")
        if self._receipts.refuse(headers.get("receipt-id", ""), message):
            return
        cancelled = self._subscribers.pop(headers.get("subscription") or "", None)
        if cancelled is not None:
            # RabbitMQ's consumer cancel: the queue went (deleted, or its node is down). The
            # connection stays open, and without this the subscription would wait forever.
            log.warning("broker %s ended subscription %s: %s", self.address,
                        headers["subscription"], message)
            cancelled.cancelled(f"{self.address}: the broker ended the subscription: {message}")
            return
        # RabbitMQ says why in the body ("Bad CONNECT" / "Access refused for user 'x'", or
        # a queue declaration it refused, explained).
        if first_line and first_line != message:
            message = self._explain(f"{message}: {first_line}")
        if not self._connected.done():
            self._connected.set_exception(Unanswered("refused", self._connecting, message))
            return
        if self._orphans_delivery(headers.get("message") or ""):
            # The broker keeps that delivery unacked with this connection, redelivering it
            # only once the connection closes: held there, it would wait for ever.
            log.warning("broker %s: %s; closing the connection so that the broker redelivers "
                        "the delivery it holds for a closed subscription", self.address, message)
            self.lose(f"the broker holds a delivery for a closed subscription ({message})")
            self._shutdown_transport()
            return
        self._stray_errors += 1
        self._last_stray_error = message
        # While a SUBSCRIBE awaits its receipt, ``confirm`` raises this as its refusal.
        log.log(logging.DEBUG if self._receipts.awaits("SUBSCRIBE") else logging.WARNING,
                "broker %s reported an error: %s", self.address, message)

    def lose(self, reason: str) -> None:
        """The connection is gone (idempotent): fail what waits on it, tell the subscribers."""
        if self._lost_reason is not None:
            return
        if self._last_stray_error:  # RabbitMQ closes the connection after most of them
            reason = f"{reason}, after the broker's error {self._last_stray_error!r}"
        self._lost_reason = reason
        if not self._connected.done():
            self._connected.set_exception(Unanswered("lost", self._connecting, reason))
        self._receipts.fail_all(reason)
        for subscriber in self._subscribers.values():
            subscriber.connection_lost(f"{self.address}: {reason}")
        self._gone.set()
