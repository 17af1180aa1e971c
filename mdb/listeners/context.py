"""``Context``: what a handler may know and do about the delivery it is processing."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import Any

import anyio.from_thread

from mdb.errors import NoReplyTo
from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID, MAYBE_REPEAT
from mdb.messages.message import Message, OutgoingMessage, ReplyTo, addressed, derived_id
from mdb.seam.broker import HeaderLimits

SendFunction = Callable[[ReplyTo, OutgoingMessage, str | None], Coroutine[Any, Any, None]]
"""Sends ``message`` to a destination (with an optional member ``key``) or to a delivery's
reply address, as part of the delivery being processed."""


class Context:
    """Handed to a handler that declares a parameter annotated ``Context``; its sends keep to
    ``limits`` (``Brokers.header_limits``)."""

    def __init__(self, message: Message, listener: str, send: SendFunction,
                 subscription: str, limits: HeaderLimits) -> None:
        self.message = message
        self.listener = listener
        self._send = send
        self._subscription = subscription
        self._limits = limits
        self._sent = 0
        self._loop_thread = threading.get_ident()

    @property
    def id(self) -> str:
        return self.message.id

    @property
    def headers(self) -> Mapping[str, str]:
        return self.message.headers

    @property
    def destination(self) -> Destination:
        return self.message.destination

    @property
    def redelivered(self) -> bool:
        """True when this message may have been processed before (the flag of JMS)."""
        return self.message.redelivered

    @property
    def delivery_count(self) -> int:
        """1 on the first delivery, one more on each redelivery."""
        return self.message.delivery_count

    def send(
        self, destination: str | Destination, body: object,
        headers: Mapping[str, str] | None = None, *, key: str | None = None,
        reply_to: str | Destination | None = None, correlation_id: str | None = None,
    ) -> Awaitable[None]:
        """Send ``body`` as part of this delivery: in a transacted listener it is sent only if
        the handler succeeds, together with the acknowledgement.

        A distributed destination's member is chosen by ``key`` when given (one key, one
        member, so messages with the same key keep their order), else round robin among the
        members on this delivery's broker first. A member on another broker cannot join the
        transaction: such a send is made once the handler returned, just before the commit
        (see docs/distribution.md).

        ``reply_to`` (``queue:NAME`` or ``topic:NAME``, on the same broker) and
        ``correlation_id`` become the message's JMSReplyTo and JMSCorrelationID.

        In an ``async def`` handler, await it. In a plain ``def`` handler the call itself sends
        (blocking until done) and its result need not be awaited.
        """
        message = addressed(codec.outgoing(body, headers, self._own(), limits=self._limits),
                            reply_to, correlation_id)
        return self._sending(Destination.parse(destination), message, key)

    def reply(self, body: object, headers: Mapping[str, str] | None = None) -> Awaitable[None]:
        """Send ``body`` to where this message asked for its reply (its reply-to, as the broker
        gave it: a JMS temporary queue, a RabbitMQ reply queue, a queue), with its correlation
        id: the request's own when it had one, else the request's message id (``ctx.id``; for
        a Java requester, its JMSMessageID). It joins the transaction like ``send``.

        Raises ``NoReplyTo`` when the message has no reply-to: the handler fails, and the
        message takes the usual redelivery and error-destination path.
        """
        reply_to = self.message.reply_to
        if reply_to is None:
            raise NoReplyTo(
                f"listener {self.listener}: message {self.id} from {self.destination} has no "
                "reply-to, so there is nowhere to send a reply")
        correlation_id = self.message.correlation_id or self.id
        message = dataclasses.replace(
            codec.outgoing(body, headers, self._own(), limits=self._limits),
            correlation_id=correlation_id)
        return self._sending(reply_to, message, None)

    def _own(self) -> dict[str, str]:
        """mdb's headers on the handler's next send: an ``mdb_id`` derived from this message's,
        the listener's and the send's place among this processing's sends, so that a
        processing after a redelivery sends what it sends again under the same ids; and,
        when this message may have been processed before, ``mdb_maybe_repeat``."""
        own = {ID: derived_id(self.message.id, self._subscription, self.listener, self._sent)}
        self._sent += 1
        if self.message.redelivered:
            own[MAYBE_REPEAT] = "true"
        return own

    def _sending(self, target: ReplyTo, message: OutgoingMessage,
                 key: str | None) -> Awaitable[None]:
        if threading.get_ident() != self._loop_thread:
            anyio.from_thread.run(self._send, target, message, key)
            return _ALREADY_SENT
        return self._send(target, message, key)


class _AlreadySent:
    """An awaitable that is already done: a plain handler may ignore it without a warning."""

    def __await__(self) -> Generator[Any, Any, None]:
        yield from ()


_ALREADY_SENT = _AlreadySent()
