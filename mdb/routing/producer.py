"""Sending to a logical destination: pick a member, skip brokers that are down.

``Producer`` is the standalone API (scripts, web requests, ``mdb send``); the container uses
one too, for the sends of handlers that go to another broker than the delivery's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import TracebackType

import anyio

from mdb.config.settings import Settings
from mdb.errors import ReplyTimeout, UnsupportedMessageKind
from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.identity import identity
from mdb.messages.message import Message, OutgoingMessage, ReplyAddress, addressed
from mdb.messages.topology import Member, Topology
from mdb.observability import telemetry
from mdb.routing.brokers import Brokers
from mdb.routing.links import BrokerLink
from mdb.seam.broker import Delivery, ProblemKind


class Producer:
    """``async with Producer(settings) as p: await p.send("queue:orders", {...})``.

    Each send waits for the broker's receipt. A send to a distributed destination goes to one
    member (``Topology.candidates``: round robin, or by ``key``); when a member's broker cannot
    be reached the next member is tried, and that broker goes to the back of the line for a
    while (its reconnect delay, doubling up to its maximum). When no member can take the
    message the send waits for one to come back, up to the members' longest
    ``send_wait_for_reconnect``, then raises ``ConnectionFailed`` or ``ConnectionLost``: it
    surely was not sent (``Brokers.failover``). It raises ``SendOutcomeUnknown`` when no
    receipt came (the message may still arrive: it is not tried elsewhere, which could make a
    duplicate).

    Given ``Brokers`` instead of settings (a container's), it shares their view of each broker:
    statuses, events, and the topology as ``Brokers.apply`` changes it.
    """

    def __init__(self, settings: Settings | Brokers, *, client_id: str | None = None) -> None:
        self.brokers = settings if isinstance(settings, Brokers) else Brokers(settings)
        app, server = self.brokers.settings.app, self.brokers.settings.server
        self._client_id = client_id or f"{app}.{server}.producer"
        self._links: dict[str, BrokerLink] = {}
        self._retired: list[BrokerLink] = []

    @property
    def topology(self) -> Topology:
        return self.brokers.topology

    async def send(
        self, destination: str | Destination, body: object,
        headers: Mapping[str, str] | None = None, *, key: str | None = None,
        reply_to: str | Destination | None = None, correlation_id: str | None = None,
    ) -> str:
        """Send ``body``; return its ``mdb_id``. ``reply_to`` (``queue:NAME`` or
        ``topic:NAME``, on the same broker) and ``correlation_id`` become the message's
        JMSReplyTo and JMSCorrelationID: a handler's ``ctx.reply`` answers there, with this
        correlation id or else the returned ``mdb_id``."""
        message = addressed(codec.outgoing(body, headers, limits=self.brokers.header_limits),
                            reply_to, correlation_id)
        await self.send_message(Destination.parse(destination), message, key=key)
        return message.headers[ID]

    async def request(
        self, destination: str | Destination, body: object,
        headers: Mapping[str, str] | None = None, *, timeout: float, key: str | None = None,
        correlation_id: str | None = None,
    ) -> Message:
        """Send ``body`` as a request and return the reply: JMS request/reply, with Python as
        the requester.

        The request goes to the first member of ``destination`` (``member_for``; no failover,
        as the reply can only come back on that broker) with a temporary queue of that
        connection as its reply-to and ``correlation_id`` (else the request's ``mdb_id``) as
        its correlation id; the reply is the first message on that queue with the same
        correlation id (an mdb handler's ``ctx.reply`` sets it; a Java replier copies the
        request's JMSCorrelationID). Raises ``ReplyTimeout`` when none came within
        ``timeout`` seconds (the request was sent), ``UnsupportedMessageKind`` when the reply
        is of a kind the broker could not carry to mdb (a JMS MapMessage over STOMP: its
        content never arrived), and as ``send`` when the request could not be sent. The
        temporary queue is deleted before it returns."""
        target = Destination.parse(destination)
        member = self.member_for(target, key=key)
        link = self._link(member.broker)
        connection = await link.connect()
        replies = await connection.temporary_queue()
        try:
            message = codec.outgoing(body, headers, limits=self.brokers.header_limits)
            expected = correlation_id or message.headers[ID]
            message = self.brokers.seal.sealed(dataclasses.replace(
                message, reply_to=replies.reply_to, correlation_id=expected))
            with telemetry.sending(link.system, target, message) as traced:
                await connection.send(member.destination, traced)
            with anyio.move_on_after(timeout):
                while True:
                    delivery = await replies.receive()
                    if delivery.correlation_id == expected:
                        return self._reply(delivery, message.headers[ID], link)
            raise ReplyTimeout(f"no reply to request {message.headers[ID]} sent to {target} "
                               f"within {timeout} s")
        finally:
            with anyio.CancelScope(shield=True):
                await replies.close()

    def member_for(self, destination: Destination, *, key: str | None = None,
                   prefer: str | None = None) -> Member:
        """The member of ``destination`` a send tries first (``Topology.candidates``, whether
        its broker is up or not); without a ``key`` it takes a turn of the round robin."""
        return self.topology.candidates(destination, key=key, prefer=prefer)[0]

    async def send_message(self, destination: Destination, message: OutgoingMessage, *,
                           key: str | None = None, prefer: str | None = None) -> Member:
        """Send ``message`` to a member of ``destination`` (see the class docstring), with its
        proof (``mdb.messages.identity``); return the member that confirmed it."""
        message = self.brokers.seal.sealed(message)

        async def attempt(member: Member) -> None:
            link = self._link(member.broker)
            with telemetry.sending(link.system, destination, message) as traced:
                connection = await link.connect()
                await connection.send(member.destination, traced)

        return await self.brokers.failover(destination, attempt, key=key, prefer=prefer)

    async def send_reply(self, broker: str, address: ReplyAddress,
                         message: OutgoingMessage) -> None:
        """Send ``message`` to ``address``, the reply-to of a message delivered by ``broker``
        (no failover: the address exists only there), with its proof. Raises as
        ``Connection.send``."""
        message = self.brokers.seal.sealed(message)
        link = self._link(broker)
        with telemetry.sending(link.system, address, message) as traced:
            connection = await link.connect()
            await connection.send(address, traced)

    def _link(self, broker: str) -> BrokerLink:
        """The link sends to ``broker`` share; one whose broker's settings changed since it
        was made is replaced (and closed with the producer: a send may still be using it)."""
        link = self._links.get(broker)
        if link is not None and link.settings != self.brokers.settings.brokers[broker]:
            self._retired.append(link)
            link = None
        if link is None:
            link = self._links[broker] = self.brokers.link(broker, self._client_id)
        return link

    def _reply(self, delivery: Delivery, request_id: str, link: BrokerLink) -> Message:
        """A reply to request ``request_id``, delivered through ``link``, as ``request``
        returns it; ``UnsupportedMessageKind`` for one whose content the broker could not
        carry."""
        if delivery.problem is not None and delivery.problem.kind is ProblemKind.UNSUPPORTED:
            raise UnsupportedMessageKind(
                f"the reply to request {request_id} is a message mdb cannot read: "
                f"{delivery.problem.text}")
        known = identity(delivery, self.brokers.seal,
                         assigned=link.capabilities.assigned_ids)
        return Message(id=known.key, destination=delivery.destination, body=delivery.body,
                       headers=delivery.headers, redelivered=delivery.broker_redelivered,
                       delivery_count=1, reply_to=delivery.reply_to,
                       correlation_id=delivery.correlation_id, by_content=known.by_content)

    async def close(self) -> None:
        for link in [*self._links.values(), *self._retired]:
            await link.close()
        self._retired.clear()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
