"""The container: connects, subscribes every pool slot, runs handlers, and stops in order.

Lifecycle (``run``):

1. start: connect to every broker used, then create every subscription (one per pool slot
   and member of the listener's destination, prefetch ``max_messages_per_transaction``, 1 by
   default, so a process never holds more unsettled messages than it can work on), then report
   ready. A failure here is fatal and raised.
2. run: each slot waits for a delivery, adds the ones its subscription already holds (up to
   ``max_messages_per_transaction``; it never waits for a batch to fill) and hands them to its
   ``Processor``. A slot whose connection was lost reconnects (one attempt per broker, with
   backoff) and subscribes again under the same name; the broker redelivers what was in
   flight, flagged.
3. stop (``request_stop``): stop receiving → let in-flight handlers finish within
   ``shutdown_grace_period`` → cancel what is still running, aborting its transaction so the
   broker redelivers it → close subscriptions → delete the subscriptions of listeners with
   ``durable_subscription_deletion`` → close connections.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from mdb.broker import Subscription
from mdb.delivery import Processor, Stats
from mdb.errors import BrokerError, ConfigurationError, ConnectionLost
from mdb.links import BrokerLink
from mdb.listener import ListenerSpec
from mdb.planning import PlannedSubscription, plan
from mdb.producer import Producer
from mdb.settings import Settings

log = logging.getLogger("mdb.container")

# A broker serves each connection on one thread (ActiveMQ: one transport thread per
# connection), so the pool slots on one broker are spread over several connections: one per
# four slots, at most eight. Measured on ActiveMQ 5.17, pool=16: 1 connection 2,300 msg/s,
# 4 connections 3,000 msg/s, 16 connections 2,700 msg/s (docs/performance.md).
SLOTS_PER_CONNECTION = 4
MAX_CONNECTIONS = 8


@dataclass
class Deployed:
    """One listener as deployed in this container: a pool per member of its destination."""

    spec: ListenerSpec
    planned: tuple[PlannedSubscription, ...]
    stats: Stats = field(default_factory=Stats)


@dataclass
class Slot:
    """One pool slot on one member: a subscription on one connection, one delivery (or batch)
    at a time."""

    deployed: Deployed
    planned: PlannedSubscription
    link: BrokerLink
    threads: anyio.CapacityLimiter
    subscription: Subscription | None


class Container:
    """Runs ``listeners`` with ``settings``. Construction applies the settings' overrides and
    plans every subscription (raising ConfigurationError); ``run`` does the rest."""

    def __init__(self, settings: Settings, listeners: Iterable[ListenerSpec]) -> None:
        self.settings = settings
        self.deployed: list[Deployed] = []
        seen: dict[str, ListenerSpec] = {}
        for spec in listeners:
            if spec.name in seen and seen[spec.name].handler is not spec.handler:
                raise ConfigurationError(
                    f"two listeners are named {spec.name!r} ({_where(seen[spec.name])} and "
                    f"{_where(spec)}): give one of them @listener(..., name='...')"
                )
            seen[spec.name] = spec
        unknown = set(settings.listeners) - set(seen)
        if unknown:
            raise ConfigurationError(
                f"setting listeners.{sorted(unknown)[0]}: no such listener; "
                f"listeners are: {', '.join(sorted(seen)) or 'none'}"
            )
        topology = settings.topology()
        for spec in seen.values():
            configured = spec.with_settings(settings.defaults, settings.listeners.get(spec.name))
            planned = plan(configured, topology, app=settings.app, server=settings.server)
            self.deployed.append(Deployed(configured, planned))
        client_id = f"{settings.app}.{settings.server}"
        slots_on: dict[str, int] = {}
        for d in self.deployed:
            for p in d.planned:
                slots_on[p.broker] = slots_on.get(p.broker, 0) + d.spec.options.pool
        self.links: dict[str, list[BrokerLink]] = {
            name: [BrokerLink(name, settings.brokers[name], client_id)
                   for _ in range(min(-(-slots // SLOTS_PER_CONNECTION), MAX_CONNECTIONS))]
            for name, slots in slots_on.items()
        }
        self.producer = Producer(settings, topology=topology, client_id=f"{client_id}.sends")
        self.stopping = False
        self._stop_requested: anyio.Event | None = None
        self._receiving: set[anyio.CancelScope] = set()
        self._live_slots = 0
        self._slots_done: anyio.Event | None = None

    def request_stop(self) -> None:
        """Begin the orderly shutdown; ``run`` returns when it is complete. Call it from the
        container's event loop (a signal handler task, a test)."""
        self.stopping = True
        if self._stop_requested is not None:
            self._stop_requested.set()
        for scope in list(self._receiving):
            scope.cancel()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start, report ready through ``task_status``, process until ``request_stop``, then
        shut down in the documented order. Startup errors (ConfigurationError, BrokerError)
        are raised."""
        self._stop_requested = anyio.Event()
        self._slots_done = anyio.Event()
        try:
            slots = await self._start()
            log.info("container ready: %d listeners, %d subscriptions",
                     len(self.deployed), len(slots))
            task_status.started()
            self._live_slots = len(slots)
            async with anyio.create_task_group() as work:
                for slot in slots:
                    work.start_soon(self._slot, slot)
                if self.stopping:
                    self.request_stop()
                await self._stop_requested.wait()
                with anyio.move_on_after(self.settings.shutdown_grace_period):
                    await self._slots_done.wait()
                work.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await self._undeploy()
        finally:
            with anyio.CancelScope(shield=True):
                for links in self.links.values():
                    for link in links:
                        await link.close()
                await self.producer.close()

    async def _undeploy(self) -> None:
        """Delete the subscriptions of listeners with ``durable_subscription_deletion``; a
        failure is logged: the subscription is then abandoned (``mdb subscriptions --delete``)."""
        for deployed in self.deployed:
            if not deployed.spec.options.durable_subscription_deletion:
                continue
            for planned in deployed.planned:
                assert planned.request.name is not None  # a topic: checked by the listener
                try:
                    connection = await self.links[planned.broker][0].connect()
                    await connection.delete_subscription(planned.request.destination,
                                                         planned.request.name)
                except BrokerError as exc:
                    log.error("listener %s: subscription %s on broker %s not deleted: %s",
                              deployed.spec.name, planned.name, planned.broker, exc)
                else:
                    log.info("listener %s: subscription %s on broker %s deleted",
                             deployed.spec.name, planned.name, planned.broker)

    async def _start(self) -> list[Slot]:
        slots: list[Slot] = []
        assigned = {name: 0 for name in self.links}
        for deployed in self.deployed:
            threads = anyio.CapacityLimiter(deployed.spec.options.pool * len(deployed.planned))
            for planned in deployed.planned:
                links = self.links[planned.broker]
                for _ in range(deployed.spec.options.pool):
                    link = links[assigned[planned.broker] % len(links)]
                    assigned[planned.broker] += 1
                    connection = await link.connect()
                    subscription = await connection.subscribe(planned.request)
                    slots.append(Slot(deployed, planned, link, threads, subscription))
        return slots

    async def _slot(self, slot: Slot) -> None:
        try:
            await self._consume(slot)
        finally:
            self._live_slots -= 1
            if self._live_slots == 0 and self._slots_done is not None:
                self._slots_done.set()

    async def _consume(self, slot: Slot) -> None:
        deployed, planned, link = slot.deployed, slot.planned, slot.link
        subscription = slot.subscription
        batch_size = deployed.spec.options.max_messages_per_transaction
        while not self.stopping:
            try:
                connection = await link.connection()
                if subscription is None:
                    subscription = await connection.subscribe(planned.request)
                processor = Processor(deployed.spec, planned.broker, connection, subscription,
                                      self.producer, deployed.stats, slot.threads,
                                      stopping=lambda: self.stopping)
                while not self.stopping:
                    with anyio.CancelScope() as receiving:
                        self._receiving.add(receiving)
                        if self.stopping:
                            receiving.cancel()
                        try:
                            delivery = await subscription.receive()
                        finally:
                            self._receiving.discard(receiving)
                    if receiving.cancelled_caught:
                        break
                    batch = [delivery]
                    while len(batch) < batch_size:
                        ready = subscription.receive_nowait()
                        if ready is None:
                            break
                        batch.append(ready)
                    if not await processor.process_batch(batch):
                        # Brokers keep an unsettled delivery with its live subscription; closing
                        # the subscription (below) hands it back for redelivery, flagged.
                        break
            except ConnectionLost as exc:
                log.warning("listener %s: connection to broker %s lost (%s); resubscribing",
                            deployed.spec.name, link.name, exc)
            except BrokerError as exc:
                log.error("listener %s: cannot resubscribe on broker %s: %s",
                          deployed.spec.name, link.name, exc)
                await anyio.sleep(link.settings.reconnect_max_delay)
            finally:
                if subscription is not None:
                    with anyio.CancelScope(shield=True):
                        await subscription.close()
                    subscription = None
        if subscription is not None:  # stopped before the loop began
            with anyio.CancelScope(shield=True):
                await subscription.close()


def _where(spec: ListenerSpec) -> str:
    return f"{spec.handler.__module__}.{spec.handler.__qualname__}"
