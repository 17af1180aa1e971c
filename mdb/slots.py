"""The pool slots of a container: each receives from one subscription, on one of its broker's
connections, and hands what it receives to its ``Processor``.

``Slots`` holds the running slots: it makes them (spread over the connections of
``Brokers.pools``), runs each in a task of the container's task group, reconnects and
resubscribes a slot whose connection was lost, drains and ends the slots of members that left
(``retire``) and, on shutdown, stops them receiving (``stop_receiving``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from mdb.broker import Subscription
from mdb.brokers import Brokers
from mdb.delivery import Processor, Stats, Strikes
from mdb.errors import BrokerError, ConnectionFailed, ConnectionLost
from mdb.links import BrokerLink
from mdb.listener import ListenerSpec
from mdb.planning import PlannedSubscription
from mdb.producer import Producer
from mdb.topology import Member

log = logging.getLogger("mdb.container")


@dataclass
class Deployed:
    """One listener as deployed in this container: a pool per member of its destination."""

    spec: ListenerSpec
    planned: tuple[PlannedSubscription, ...]
    stats: Stats = field(default_factory=Stats)
    strikes: Strikes = field(default_factory=Strikes)


@dataclass(eq=False)
class Slot:
    """One pool slot on one member: a subscription on one connection, one delivery (or batch)
    at a time. ``retired`` once its member left the topology: it finishes what it holds and
    ends. ``receiving`` is set while it waits for a delivery: cancelling it ends the wait.
    ``holding_since`` is the ``time.monotonic()`` at which it received what it holds, until
    that is settled (or left to the broker); None while it holds nothing."""

    deployed: Deployed
    planned: PlannedSubscription
    link: BrokerLink
    threads: anyio.CapacityLimiter
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
        self._threads: dict[str, anyio.CapacityLimiter] = {}
        self._held: list[Subscription] = []  # stopped slots' subscriptions, closed last

    def new(self, where: Iterable[tuple[Deployed, PlannedSubscription]]) -> list[Slot]:
        """A slot per pool place of each listener on each member, not started; those of one
        broker take its connections in turn."""
        assigned = {name: 0 for name in self.brokers.pools}
        slots = []
        for deployed, planned in where:
            threads = self._threads.setdefault(
                deployed.spec.name,
                anyio.CapacityLimiter(deployed.spec.options.pool * len(deployed.planned)))
            links = self.brokers.pools[planned.broker]
            for _ in range(deployed.spec.options.pool):
                link = links[assigned[planned.broker] % len(links)]
                assigned[planned.broker] += 1
                slots.append(Slot(deployed, planned, link, threads))
        return slots

    def launch(self, slot: Slot) -> None:
        assert self.work is not None
        self.running.add(slot)
        self.work.start_soon(self._slot, slot)

    def subscribed(self, deployed: Deployed) -> int:
        """How many of ``deployed``'s members have a subscribed slot."""
        return len({s.planned.member for s in self.running
                    if s.deployed is deployed and s.subscription is not None})

    def retire(self, leaving: Collection[tuple[str, Member]]) -> None:
        """End the slots of these (listener, member) pairs once they finish what they hold."""
        for slot in [s for s in self.running
                     if (s.deployed.spec.name, s.planned.member) in leaving]:
            slot.retired = True
            if slot.receiving is not None:
                slot.receiving.cancel()

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

    async def _consume(self, slot: Slot) -> None:
        deployed, planned, link = slot.deployed, slot.planned, slot.link
        batch_size = deployed.spec.options.max_messages_per_transaction
        processor = Processor(deployed.spec, planned, link.system, self.producer, deployed.stats,
                              deployed.strikes, slot.threads, stopping=lambda: self._ends(slot))
        while not self._ends(slot):
            holding = False  # may hold prefetched deliveries: none once a receive waited
            try:
                connection = await link.connection()
                if slot.subscription is None:
                    slot.subscription = await connection.subscribe(planned.request)
                subscription = slot.subscription
                # One scope for all the receives of this subscription (one per receive costs
                # some twenty calls a message), cancelled only while the slot waits in one.
                with anyio.CancelScope() as receiving:
                    while not self._ends(slot):
                        slot.receiving = receiving
                        try:
                            delivery = await subscription.receive()
                        finally:
                            slot.receiving = None
                        holding = True
                        if receiving.cancel_called:
                            # It arrived as the slot was stopped: it stays unsettled, as one
                            # still buffered, and goes back to the broker (below).
                            break
                        batch = [delivery]
                        while len(batch) < batch_size:
                            ready = subscription.receive_nowait()
                            if ready is None:
                                break
                            batch.append(ready)
                        slot.holding_since = time.monotonic()
                        try:
                            settled = await processor.process_batch(connection, subscription,
                                                                    batch)
                        finally:
                            slot.holding_since = None
                        if not settled:
                            # Brokers keep an unsettled delivery with its live subscription;
                            # closing the subscription (below) hands it back for redelivery,
                            # flagged.
                            break
                if receiving.cancelled_caught:  # cancelled while waiting: nothing buffered
                    holding = False
            except ConnectionLost as exc:  # the broker's status logs the outage once
                log.debug("listener %s: connection to broker %s lost (%s); resubscribing",
                          deployed.spec.name, link.name, exc)
            except BrokerError as exc:
                log.error("listener %s: cannot resubscribe on broker %s: %s",
                          deployed.spec.name, link.name, exc)
                await anyio.sleep(link.settings.reconnect_max_delay)
            finally:
                if slot.subscription is not None:
                    if self.stopping and holding and planned.request.prefetch > 1:
                        # It may hold prefetched deliveries, and closing a subscription that
                        # holds any closes its connection on RabbitMQ, rolling back the other
                        # slots' handlers still finishing on it: closed once all ended.
                        self._held.append(slot.subscription)
                    else:
                        with anyio.CancelScope(shield=True):
                            await slot.subscription.close()
                    slot.subscription = None
        if slot.subscription is not None:  # ended before the loop began
            with anyio.CancelScope(shield=True):
                await slot.subscription.close()
            slot.subscription = None


async def subscribe(slots: Iterable[Slot]) -> None:
    """Subscribe each slot whose link connects; the others are left to their own loops.
    A subscription the broker refuses raises (``SubscriptionFailed``)."""
    for slot in slots:
        try:
            connection = await slot.link.connect()
        except ConnectionFailed:
            continue
        slot.subscription = await connection.subscribe(slot.planned.request)
