"""The container: connects, subscribes every pool slot, runs handlers, and stops in order.

Lifecycle (``run``):

1. start: connect to every broker used and create every subscription (one per pool slot and
   member of the listener's destination, prefetch ``max_messages_per_transaction``, 1 by
   default, so a process never holds more unsettled messages than it can work on), then report
   ready. A broker that cannot be reached is left to its slots, which keep reconnecting in the
   background; only when no broker at all can be reached is startup a failure
   (``ConnectionFailed``). A subscription the broker refuses is a failure too.
2. run: each slot waits for a delivery, adds the ones its subscription already holds (up to
   ``max_messages_per_transaction``; it never waits for a batch to fill) and hands them to its
   ``Processor``. A slot whose connection was lost reconnects (with backoff and jitter; the
   slots of one connection share the attempts) and subscribes again under the same name; the
   broker redelivers what was in flight, flagged. Slots on other brokers go on meanwhile.
   ``apply`` changes the topology live: slots of members that left (or whose broker moved)
   drain and close, slots of new members start.
3. stop (``request_stop``): stop receiving → let in-flight handlers finish within
   ``shutdown_grace_period`` → cancel what is still running, aborting its transaction so the
   broker redelivers it → close subscriptions → delete the subscriptions of listeners with
   ``durable_subscription_deletion`` → close connections.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial

import anyio
from anyio.abc import TaskGroup, TaskStatus

from mdb import tracing
from mdb.broker import Subscription
from mdb.delivery import Processor, Stats
from mdb.errors import BrokerError, ConfigurationError, ConnectionFailed, ConnectionLost
from mdb.events import BrokerEvent, Callback, EventKind, Events
from mdb.health import BrokerHealth, Health, ListenerHealth
from mdb.links import BrokerLink, BrokerStatus
from mdb.listener import ListenerSpec
from mdb.planning import PlannedSubscription, plan
from mdb.producer import Producer
from mdb.settings import Settings
from mdb.topology import Member

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


@dataclass(eq=False)
class Slot:
    """One pool slot on one member: a subscription on one connection, one delivery (or batch)
    at a time. ``retired`` once its member left the topology: it finishes what it holds and
    ends."""

    deployed: Deployed
    planned: PlannedSubscription
    link: BrokerLink
    threads: anyio.CapacityLimiter
    subscription: Subscription | None = None
    retired: bool = False
    receiving: anyio.CancelScope | None = None
    ended: anyio.Event = field(default_factory=anyio.Event)


class Container:
    """Runs ``listeners`` with ``settings``. Construction applies the settings' overrides and
    plans every subscription (raising ConfigurationError); ``run`` does the rest.

    ``on_event`` callbacks receive every ``BrokerEvent`` (see ``mdb.events``).
    """

    def __init__(self, settings: Settings, listeners: Iterable[ListenerSpec],
                 on_event: Iterable[Callback] = ()) -> None:
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
        self.events = Events(list(on_event))
        self.statuses: dict[str, BrokerStatus] = {}
        self.links: dict[str, list[BrokerLink]] = self._links_for(
            settings, _slot_counts((d, p) for d in self.deployed for p in d.planned), set())
        self.producer = Producer(settings, topology=topology, client_id=f"{self._client_id}.sends",
                                 statuses=self.statuses)
        self.stopping = False
        self._stop_requested: anyio.Event | None = None
        self._slots: set[Slot] = set()
        self._work: TaskGroup | None = None
        self._threads: dict[str, anyio.CapacityLimiter] = {}
        tracing.watch_brokers(self)

    @property
    def _client_id(self) -> str:
        return f"{self.settings.app}.{self.settings.server}"

    def request_stop(self) -> None:
        """Begin the orderly shutdown; ``run`` returns when it is complete. Call it from the
        container's event loop (a signal handler task, a test)."""
        self.stopping = True
        if self._stop_requested is not None:
            self._stop_requested.set()
        for slot in list(self._slots):
            if slot.receiving is not None:
                slot.receiving.cancel()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start, report ready through ``task_status``, process until ``request_stop``, then
        shut down in the documented order. Startup errors (ConfigurationError, BrokerError)
        are raised."""
        self._stop_requested = anyio.Event()
        try:
            slots = await self._start()
            log.info("container ready: %d listeners, %d subscriptions",
                     len(self.deployed), sum(s.subscription is not None for s in slots))
            task_status.started()
            async with anyio.create_task_group() as work:
                self._work = work
                for slot in slots:
                    self._launch(slot)
                if self.stopping:
                    self.request_stop()
                await self._stop_requested.wait()
                with anyio.move_on_after(self.settings.shutdown_grace_period):
                    for slot in list(self._slots):
                        await slot.ended.wait()
                work.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await self._undeploy()
        finally:
            self._work = None
            with anyio.CancelScope(shield=True):
                for links in self.links.values():
                    for link in links:
                        await link.close()
                await self.producer.close()

    async def apply(self, settings: Settings) -> None:
        """Change the topology (``brokers`` and ``destinations``) while running: slots of
        members that left, or whose broker's settings changed (moved), drain — they finish
        what they hold — and close; slots of new members subscribe before ``apply`` returns
        (and before their ``member-available`` event), where their broker answers. Other settings
        need a restart and are ignored here (logged). A topology the listeners cannot be
        planned on raises ConfigurationError and changes nothing."""
        settings.check()
        topology = settings.topology()
        plans = {d.spec.name: plan(d.spec, topology, app=self.settings.app,
                                   server=self.settings.server) for d in self.deployed}
        ignored = [name for name in Settings.model_fields
                   if name not in ("brokers", "destinations")
                   and getattr(settings, name) != getattr(self.settings, name)]
        if ignored:
            log.warning("settings %s changed: they take effect at the next start",
                        ", ".join(ignored))
        moved = {name for name, broker in self.settings.brokers.items()
                 if settings.brokers.get(name) != broker}
        old = {(d.spec.name, p.member) for d in self.deployed for p in d.planned}
        new = {(name, p.member) for name, planned in plans.items() for p in planned}
        leaving = {key for key in old if key not in new or key[1].broker in moved}
        joining = {key for key in new if key not in old or key[1].broker in moved}
        joined = [(d, p) for d in self.deployed for p in plans[d.spec.name]
                  if (d.spec.name, p.member) in joining]
        counts = _slot_counts(joined)
        links = self._links_for(settings, counts,
                                {b for b in counts if b in self.links and b not in moved})
        # Nothing above changed the running container; from here on nothing can fail.
        self.settings = self.settings.model_copy(
            update={"brokers": settings.brokers, "destinations": settings.destinations})
        self.producer.update(self.settings, topology)
        retired_links = [link for name in moved for link in self.links.pop(name, [])]
        for name in set(self.statuses) - set(settings.brokers):
            del self.statuses[name]
        for name, extra in links.items():
            self.links.setdefault(name, []).extend(extra)
        for slot in [s for s in self._slots if (s.deployed.spec.name, s.planned.member)
                     in leaving]:
            slot.retired = True
            if slot.receiving is not None:
                slot.receiving.cancel()
        for deployed in self.deployed:
            deployed.planned = plans[deployed.spec.name]
        for listener, member in sorted(leaving - joining, key=str):
            self.events.emit(BrokerEvent(EventKind.MEMBER_UNAVAILABLE, member.broker, member,
                                         f"left the topology (listener {listener})"))
        slots = self._new_slots(joined)
        # As at startup, a new member is subscribed before it is announced, so that nothing a
        # producer sends to it after the event is missed.
        try:
            await _subscribe(slots)
        except BrokerError as exc:
            log.error("a new member's subscription failed (%s); its slots keep trying", exc)
        for slot in slots:
            self._launch(slot)
        subscribed = {(s.deployed.spec.name, s.planned.member) for s in slots
                      if s.subscription is not None}
        for listener, member in sorted(joining - leaving, key=str):
            if (listener, member) in subscribed:
                self.events.emit(BrokerEvent(EventKind.MEMBER_AVAILABLE, member.broker, member,
                                             f"joined the topology (listener {listener})"))
            else:
                log.warning("member %s (listener %s) joined the topology; it is consumed once "
                            "broker %s answers", member, listener, member.broker)
        if retired_links and self._work is not None:
            self._work.start_soon(self._close_when_drained, retired_links)
        log.info("topology applied: %d subscriptions leave, %d join",
                 len(leaving), len(joining))

    def broker_states(self) -> list[tuple[str, str, bool]]:
        """Each broker in use: its name, ``messaging.system`` and whether it is up."""
        return [(name, tracing.system_of(status.settings.url), status.state == "up")
                for name, status in self.statuses.items()]

    def health(self) -> Health:
        """A snapshot for the health endpoint; call it on the container's event loop. Live
        whenever it is called (the loop answered: a slow start is not a dead process); ready
        when running, not stopping, every broker up and every member subscribed."""
        listeners = tuple(
            ListenerHealth(
                d.spec.name, len(d.planned),
                len({s.planned.member for s in self._slots
                     if s.deployed is d and s.subscription is not None}),
                d.stats.in_flight, d.stats.processed)
            for d in self.deployed)
        brokers = tuple(BrokerHealth(name, status.state, status.since)
                        for name, status in self.statuses.items())
        running = self._work is not None and not self.stopping
        events = {str(kind): count for kind, count in self.events.counts.items()}
        snapshot = Health(live=True, ready=running, brokers=brokers, listeners=listeners,
                          events=events)
        if running and any(snapshot.unready().values()):
            snapshot = replace(snapshot, ready=False)
        return snapshot

    # -- starting ------------------------------------------------------------------------------

    def _links_for(self, settings: Settings, counts: dict[str, int],
                   existing: set[str]) -> dict[str, list[BrokerLink]]:
        """New links for the brokers in ``counts`` not in ``existing``: one per four slots,
        at most eight, each broker with a fresh status. Raises ConfigurationError for a URL
        no adapter serves, before anything changed."""
        links: dict[str, list[BrokerLink]] = {}
        statuses: dict[str, BrokerStatus] = {}
        for name, slots in counts.items():
            if name in existing:
                continue
            statuses[name] = BrokerStatus(name, settings.brokers[name], self.events,
                                          members=partial(self._members_on, name))
            count = min(-(-slots // SLOTS_PER_CONNECTION), MAX_CONNECTIONS)
            links[name] = [BrokerLink(statuses[name], self._client_id) for _ in range(count)]
        self.statuses.update(statuses)
        return links

    def _members_on(self, broker: str) -> list[Member]:
        return list(dict.fromkeys(p.member for d in self.deployed for p in d.planned
                                  if p.broker == broker))

    def _new_slots(self, where: list[tuple[Deployed, PlannedSubscription]]) -> list[Slot]:
        assigned = {name: 0 for name in self.links}
        slots = []
        for deployed, planned in where:
            threads = self._threads.setdefault(
                deployed.spec.name,
                anyio.CapacityLimiter(deployed.spec.options.pool * len(deployed.planned)))
            links = self.links[planned.broker]
            for _ in range(deployed.spec.options.pool):
                link = links[assigned[planned.broker] % len(links)]
                assigned[planned.broker] += 1
                slots.append(Slot(deployed, planned, link, threads))
        return slots

    async def _start(self) -> list[Slot]:
        """Subscribe every slot whose broker answers; raise the first failure when none
        does."""
        unreachable: dict[str, ConnectionFailed] = {}
        for name, links in self.links.items():
            try:
                await links[0].connect()
            except ConnectionFailed as exc:
                unreachable[name] = exc
                log.warning("broker %s unreachable at startup (%s); its listeners start "
                            "when it answers", name, exc)
        if self.links and len(unreachable) == len(self.links):
            raise next(iter(unreachable.values()))
        slots = self._new_slots([(d, p) for d in self.deployed for p in d.planned])
        await _subscribe([s for s in slots if s.planned.broker not in unreachable])
        return slots

    # -- running -------------------------------------------------------------------------------

    def _launch(self, slot: Slot) -> None:
        assert self._work is not None
        self._slots.add(slot)
        self._work.start_soon(self._slot, slot)

    async def _slot(self, slot: Slot) -> None:
        try:
            await self._consume(slot)
        finally:
            self._slots.discard(slot)
            slot.ended.set()

    async def _close_when_drained(self, links: list[BrokerLink]) -> None:
        for slot in [s for s in self._slots if s.link in links]:
            await slot.ended.wait()
        for link in links:
            await link.close()

    def _ends(self, slot: Slot) -> bool:
        return self.stopping or slot.retired

    async def _consume(self, slot: Slot) -> None:
        deployed, planned, link = slot.deployed, slot.planned, slot.link
        batch_size = deployed.spec.options.max_messages_per_transaction
        processor = Processor(deployed.spec, planned, link.system, self.producer, deployed.stats,
                              slot.threads, stopping=lambda: self._ends(slot))
        while not self._ends(slot):
            try:
                connection = await link.connection()
                if slot.subscription is None:
                    slot.subscription = await connection.subscribe(planned.request)
                subscription = slot.subscription
                while not self._ends(slot):
                    with anyio.CancelScope() as receiving:
                        slot.receiving = receiving
                        try:
                            delivery = await subscription.receive()
                        finally:
                            slot.receiving = None
                    if receiving.cancelled_caught:
                        break
                    batch = [delivery]
                    while len(batch) < batch_size:
                        ready = subscription.receive_nowait()
                        if ready is None:
                            break
                        batch.append(ready)
                    if not await processor.process_batch(connection, subscription, batch):
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
                if slot.subscription is not None:
                    with anyio.CancelScope(shield=True):
                        await slot.subscription.close()
                    slot.subscription = None
        if slot.subscription is not None:  # ended before the loop began
            with anyio.CancelScope(shield=True):
                await slot.subscription.close()
            slot.subscription = None

    # -- stopping ------------------------------------------------------------------------------

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


async def _subscribe(slots: Iterable[Slot]) -> None:
    """Subscribe each slot whose link connects; the others are left to their own loops.
    A subscription the broker refuses raises (``SubscriptionFailed``)."""
    for slot in slots:
        try:
            connection = await slot.link.connect()
        except ConnectionFailed:
            continue
        slot.subscription = await connection.subscribe(slot.planned.request)


def _slot_counts(where: Iterable[tuple[Deployed, PlannedSubscription]]) -> dict[str, int]:
    """Pool slots per broker."""
    counts: dict[str, int] = {}
    for deployed, planned in where:
        counts[planned.broker] = counts.get(planned.broker, 0) + deployed.spec.options.pool
    return counts


def _where(spec: ListenerSpec) -> str:
    return f"{spec.handler.__module__}.{spec.handler.__qualname__}"
