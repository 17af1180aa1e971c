"""The pool slots of a container: each receives from one subscription, on one of its broker's
connections, and hands what it receives to its ``Processor``.

``Slots`` holds the running slots: it makes them (spread over the connections of
``Brokers.pools``), runs each in a task of the container's task group, reconnects and
resubscribes a slot whose connection was lost, drains and ends the slots of members that left
(``retire``), pauses and resumes a listener's slots (``pause``, ``resume``) and, on shutdown,
stops them receiving (``stop_receiving``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup

from mdb.delivery import Processor, Strikes
from mdb.delivery.invoker import Invoker
from mdb.delivery.runs import Direct, Run, Transacted
from mdb.delivery.timeouts import HandlerThreads
from mdb.errors import BrokerError, ConnectionFailed, ConnectionLost
from mdb.listeners.listener import ListenerSpec
from mdb.messages.topology import Member
from mdb.observability.telemetry import Stats, watch_listener
from mdb.routing.brokers import Brokers
from mdb.routing.links import BrokerLink
from mdb.routing.planning import PlannedSubscription
from mdb.routing.producer import Producer
from mdb.seam.broker import Subscription

if TYPE_CHECKING:
    from mdb.exactly_once.store import Store

log = logging.getLogger("mdb.container")


@dataclass
class Deployed:
    """One listener as deployed in this container: a pool per member of its destination."""

    spec: ListenerSpec
    planned: tuple[PlannedSubscription, ...]
    stats: Stats = field(default_factory=Stats)
    strikes: Strikes = field(default_factory=Strikes)
    store: Store | None = None
    """The database of an ``exactly_once`` listener (``mdb.exactly_once``)."""
    threads: HandlerThreads = field(init=False)
    """The worker threads of a plain ``def`` handler, one per pool slot."""
    paused: bool = field(init=False)
    """Paused (``Slots.pause``): its slots take no new delivery."""

    def __post_init__(self) -> None:
        self.paused = self.spec.options.paused
        self.threads = HandlerThreads(self.spec.name, self.spec.options.pool * len(self.planned))
        watch_listener(self.spec.name, self.stats)


@dataclass(eq=False)
class Slot:
    """One pool slot on one member: a subscription on one connection, one delivery (or batch)
    at a time. ``retired`` once its member left the topology: it finishes what it holds and
    ends. ``receiving`` is set while it waits for a delivery, or for its paused listener's
    resume: cancelling it ends the wait.
    ``holding_since`` is the ``time.monotonic()`` at which it received what it holds, until
    that is settled (or left to the broker); None while it holds nothing."""

    deployed: Deployed
    planned: PlannedSubscription
    link: BrokerLink
    subscription: Subscription | None = None
    retired: bool = False
    receiving: anyio.CancelScope | None = None
    holding_since: float | None = None
    ended: anyio.Event = field(default_factory=anyio.Event)


class Slots:
    """The running pool slots of one container, on the connections of ``brokers``; the sends
    of their handlers to other brokers go through ``producer``. ``work`` is the container's
    task group while it runs."""

    def __init__(self, brokers: Brokers, producer: Producer) -> None:
        self.brokers = brokers
        self.producer = producer
        self.stopping = False
        self.work: TaskGroup | None = None
        self.running: set[Slot] = set()
        self._held: list[Subscription] = []  # stopped slots' subscriptions, closed last

    def new(self, where: Iterable[tuple[Deployed, PlannedSubscription]]) -> list[Slot]:
        """A slot per pool place of each listener on each member, not started; those of one
        broker take its connections in turn."""
        assigned = {name: 0 for name in self.brokers.pools}
        slots = []
        for deployed, planned in where:
            links = self.brokers.pools[planned.broker]
            for _ in range(deployed.spec.options.pool):
                link = links[assigned[planned.broker] % len(links)]
                assigned[planned.broker] += 1
                slots.append(Slot(deployed, planned, link))
        return slots

    def launch(self, slot: Slot) -> None:
        assert self.work is not None
        self.running.add(slot)
        self.work.start_soon(self._slot, slot)

    def subscribed(self) -> dict[int, set[Member]]:
        """The members of each listener that have a subscribed slot, by the ``id`` of its
        ``Deployed`` (absent: none). One walk over the slots for all the listeners: a walk per
        listener made a snapshot of a thousand listeners cost a million steps."""
        members: dict[int, set[Member]] = {}
        for slot in self.running:
            if slot.subscription is not None:
                members.setdefault(id(slot.deployed), set()).add(slot.planned.member)
        return members

    def retire(self, leaving: Collection[tuple[str, Member]]) -> None:
        """End the slots of these (listener, member) pairs once they finish what they hold."""
        for slot in [s for s in self.running
                     if (s.deployed.spec.name, s.planned.member) in leaving]:
            slot.retired = True
            if slot.receiving is not None:
                slot.receiving.cancel()

    def pause(self, deployed: Deployed) -> None:
        """``deployed``'s slots take no new delivery: each finishes and settles what it
        handles, then closes its subscription (the broker takes back what it pushed there and
        no handler began) or, where that would close its connection
        (``Capabilities.closing_keeps_unsettled``), keeps it and what it holds, unbegun; none
        subscribes again until ``resume``, after a lost connection too."""
        deployed.paused = True
        for slot in list(self.running):
            if slot.deployed is deployed and slot.receiving is not None:
                slot.receiving.cancel()

    def resume(self, deployed: Deployed) -> None:
        """``deployed``'s slots subscribe again (or take up the subscription they kept)."""
        if not deployed.paused:
            return
        deployed.paused = False
        for slot in list(self.running):
            if slot.deployed is deployed and slot.receiving is not None:
                slot.receiving.cancel()  # its wait for this

    def stop_receiving(self) -> None:
        """Shutdown: every slot stops receiving and ends once its handler returned; call
        ``close_held`` once all ended."""
        self.stopping = True
        for slot in list(self.running):
            if slot.receiving is not None:
                slot.receiving.cancel()

    async def close_held(self) -> None:
        """Shutdown, once every slot ended: close the subscriptions stopped slots left open;
        what they hold goes back to the broker, flagged."""
        held, self._held = self._held, []
        for subscription in held:
            await subscription.close()

    async def drained(self) -> None:
        """Wait until every slot ended."""
        for slot in list(self.running):
            await slot.ended.wait()

    async def close_when_drained(self, links: list[BrokerLink]) -> None:
        for slot in [s for s in self.running if s.link in links]:
            await slot.ended.wait()
        for link in links:
            await link.close()

    async def _slot(self, slot: Slot) -> None:
        try:
            await self._consume(slot)
        finally:
            self.running.discard(slot)
            slot.ended.set()

    def _ends(self, slot: Slot) -> bool:
        return self.stopping or slot.retired

    def _run(self, slot: Slot, invoker: Invoker) -> Run:
        """How ``slot``'s listener runs a fresh delivery: its guarantee
        (``mdb.delivery.runs``)."""
        deployed, planned = slot.deployed, slot.planned
        spec, broker = deployed.spec, planned.broker
        if deployed.store is not None:
            # Imported by the listeners it runs (the container's start-up, "Layers").
            from mdb.exactly_once.run import ExactlyOnce

            guard = deployed.store.guard(
                listener=spec.name, subscription=planned.logical_name, broker=broker,
                error_destination=spec.error_destination)
            return ExactlyOnce(invoker, guard, stopping=lambda: self._ends(slot))
        if not spec.options.transacted:
            return Direct(invoker, self.producer, broker)
        return Transacted(invoker, self.producer, broker, slot.link.system)

    async def _consume(self, slot: Slot) -> None:
        """Receive and process until the slot ends, subscribing again after a lost
        connection."""
        deployed, link = slot.deployed, slot.link
        spec, planned = deployed.spec, slot.planned
        invoker = Invoker(spec, planned, link.system, deployed.stats, deployed.threads,
                          self.producer.brokers.header_limits)
        processor = Processor(spec, planned, link.system, link.capabilities, self.producer,
                              deployed.stats, deployed.strikes, invoker,
                              self._run(slot, invoker), stopping=lambda: self._ends(slot))
        try:
            while not self._ends(slot):
                kept = False  # the subscription, for the next turn
                try:
                    if deployed.paused:
                        if not link.capabilities.closing_keeps_unsettled:
                            await self._release(slot)
                        await self._resumed(slot)
                        kept = True
                    else:
                        kept = await self._receive(slot, processor) and deployed.paused
                except ConnectionLost as exc:  # the broker's status logs the outage once
                    log.debug("listener %s: connection to broker %s lost (%s); resubscribing",
                              deployed.spec.name, link.name, exc)
                except BrokerError as exc:
                    log.error("listener %s: cannot resubscribe on broker %s: %s",
                              deployed.spec.name, link.name, exc)
                    await anyio.sleep(link.settings.reconnect_max_delay)
                finally:
                    if not kept:
                        await self._release(slot)
        finally:
            await self._release(slot)  # subscribed, and ended before the loop began

    async def _resumed(self, slot: Slot) -> None:
        """Wait until the slot's listener is resumed, or the slot ends."""
        with anyio.CancelScope() as waiting:
            slot.receiving = waiting
            try:
                # A resume (or a stop) that came while the slot closed its subscription found
                # no wait to cancel: it is not waited for again.
                if slot.deployed.paused and not self._ends(slot):
                    await anyio.sleep_forever()
            finally:
                slot.receiving = None

    async def _receive(self, slot: Slot, processor: Processor) -> bool:
        """Hand what the slot's subscription delivers to ``processor`` (a batch of what is
        already here, up to ``max_messages_per_transaction``) until the slot ends, its
        listener is paused (True: what the slot took is settled) or a delivery could not be
        settled (False)."""
        connection = await slot.link.connection()
        if slot.subscription is None:
            async with slot.link.subscribing:
                slot.subscription = await connection.subscribe(slot.planned.request)
        subscription = slot.subscription
        batch_size = slot.deployed.spec.options.max_messages_per_transaction
        # One scope for all the receives of this subscription (one per receive costs some
        # twenty calls a message), cancelled only while the slot waits in one.
        with anyio.CancelScope() as receiving:
            while not self._ends(slot) and not slot.deployed.paused:
                slot.receiving = receiving
                try:
                    delivery = await subscription.receive()
                finally:
                    slot.receiving = None
                if receiving.cancel_called:
                    # It arrived as the slot was stopped or paused: it stays unsettled, as
                    # one still buffered, and goes back to the broker (_release).
                    return False
                batch = [delivery]
                while len(batch) < batch_size and (
                        ready := subscription.receive_nowait()) is not None:
                    batch.append(ready)
                slot.holding_since = time.monotonic()
                try:
                    settled = await processor.process_batch(connection, subscription, batch)
                finally:
                    slot.holding_since = None
                if not settled:
                    # Brokers keep an unsettled delivery with its live subscription; closing
                    # the subscription (_release) hands it back for redelivery, flagged.
                    return False
        return True

    async def _release(self, slot: Slot) -> None:
        """Close the slot's subscription, if it has one: what it holds goes back to the
        broker, flagged. At a stop, one whose closing would end its connection, and with it
        the work other slots are finishing there (``Capabilities.closing_ends_connection``),
        is closed only once every slot ended (``close_held``)."""
        subscription, slot.subscription = slot.subscription, None
        if subscription is None:
            return
        if self.stopping and slot.link.capabilities.closing_ends_connection(subscription):
            self._held.append(subscription)
            return
        with anyio.CancelScope(shield=True):
            await subscription.close()


async def subscribe(slots: Iterable[Slot]) -> None:
    """Subscribe each slot whose link connects, but for those of a paused listener; the others,
    and those whose connection is lost meanwhile, are left to their own loops, which subscribe
    once the link reconnects.
    A subscription the broker refuses raises (``SubscriptionFailed``), once every other
    subscription was answered.

    Together, ``SUBSCRIBES_IN_FLIGHT`` at a time on each connection
    (``mdb.routing.links``): each subscription waits for its broker's answer, a round trip."""
    refused: list[BrokerError] = []

    async def one(slot: Slot) -> None:
        try:
            connection = await slot.link.connect()
            async with slot.link.subscribing:
                slot.subscription = await connection.subscribe(slot.planned.request)
        except ConnectionFailed:
            return
        except ConnectionLost as exc:
            # Not a refusal: RabbitMQ closes a connection whose SUBSCRIBE lost a race of its
            # own (two processes declaring one new durable subscription's queue at once).
            log.warning("listener %s: subscribing to %s lost the connection (%s); it "
                        "subscribes again once broker %s answers", slot.deployed.spec.name,
                        slot.planned.member, exc, slot.link.name)
        except BrokerError as exc:
            refused.append(exc)

    async with anyio.create_task_group() as subscribing:
        for slot in slots:
            if not slot.deployed.paused:
                subscribing.start_soon(one, slot)
    if refused:
        raise refused[0]
