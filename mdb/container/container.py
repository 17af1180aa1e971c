"""The container: connects, subscribes every pool slot, runs handlers, and stops in order.

Lifecycle (``run``):

1. start: connect to every broker used and create every subscription (one per pool slot and
   member of the listener's destination, with the listener's ``prefetch``, 1 by default, so a
   process never holds more unsettled messages than it can work on), start the application's
   resources (``before_handlers``: a message one sends at start-up finds the subscriptions
   made), then report ready. A
   broker that cannot be reached is left to its slots, which keep reconnecting in the
   background; only when no broker at all can be reached is startup a failure
   (``ConnectionFailed``). A subscription the broker refuses is a failure too. A broker that
   cannot hold a redelivery's delay back (see ``Processor``) is named in one line.
2. run: each slot waits for a delivery, adds the ones its subscription already holds (up to
   ``max_messages_per_transaction``; it never waits for a batch to fill) and hands them to its
   ``Processor``. A slot whose connection was lost reconnects (with backoff and jitter; the
   slots of one connection share the attempts) and subscribes again under the same name; the
   broker redelivers what was in flight, flagged. Slots on other brokers go on meanwhile.
   ``apply`` changes the topology live: slots of members that left (or whose broker moved)
   drain and close, slots of new members start.
3. stop (``request_stop``): stop receiving → let in-flight handlers finish within
   ``shutdown_grace_period`` → cancel what is still running, aborting its transaction so the
   broker redelivers it → close subscriptions (one whose closing would end its connection
   is left to this step: see ``Slots.close_held``) → delete the
   subscriptions of listeners with ``durable_subscription_deletion`` → close connections.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from mdb.config.settings import Settings
from mdb.container.slots import Deployed, Slot, Slots, subscribe
from mdb.errors import BrokerError, ConnectionFailed, UnknownListener
from mdb.listeners.events import BrokerEvent, Callback, EventKind, Events
from mdb.listeners.listener import ListenerSpec
from mdb.messages.destinations import Kind
from mdb.messages.topology import Member
from mdb.observability import telemetry
from mdb.observability.health import (
    RUNNING,
    STARTING,
    STOPPING,
    BrokerHealth,
    ContainerIdentity,
    Health,
    ListenerHealth,
    MemberHealth,
    StuckHandler,
)
from mdb.routing.brokers import Brokers
from mdb.routing.planning import plan, plan_listeners, slots_per_broker
from mdb.routing.producer import Producer
from mdb.seam.broker import Connection

if TYPE_CHECKING:
    from mdb.exactly_once.store import Store

log = logging.getLogger("mdb.container")

# How many pool slots start in one turn of the event loop.
LAUNCHED_TOGETHER = 100


class Container:
    """Runs ``listeners`` with ``settings``. Construction applies the settings' overrides and
    plans every subscription (raising ConfigurationError); ``run`` does the rest.

    ``on_event`` callbacks receive every ``BrokerEvent`` (see ``mdb.listeners.events``). ``brokers``
    holds each broker's status and the connections to it; ``producer`` (the sends of handlers
    to other brokers) shares it.
    """

    def __init__(self, settings: Settings, listeners: Iterable[ListenerSpec],
                 on_event: Iterable[Callback] = ()) -> None:
        self.settings = settings
        self.deployed = [Deployed(spec, planned)
                         for spec, planned in plan_listeners(settings, listeners)]
        self.events = Events(list(on_event))
        self.brokers = Brokers(settings, self.events)
        self.brokers.apply(settings, self.brokers.prepare(
            settings, slots_per_broker((d.spec, p) for d in self.deployed for p in d.planned),
            self._client_id, self._members_on))
        self.producer = Producer(self.brokers, client_id=f"{self._client_id}.sends")
        self.stores: dict[str, Store] = {}
        if any(d.spec.options.exactly_once is not None or d.spec.session_parameter is not None
               for d in self.deployed):
            # Imported for exactly-once listeners alone (and to refuse a session elsewhere):
            # the database's modules and SQLAlchemy are the largest part of a start-up.
            from mdb.exactly_once.store import stores_for

            self.stores = stores_for(
                settings, ((d.spec, d.spec.options.pool * len(d.planned))
                           for d in self.deployed),
                self.producer, owner=f"{self._client_id}.{os.getpid()}")
        for deployed in self.deployed:
            if deployed.spec.options.exactly_once is not None:
                deployed.store = self.stores[deployed.spec.options.exactly_once]
        self.slots = Slots(self.brokers, self.producer)
        self._stop_requested: anyio.Event | None = None
        self.identity = ContainerIdentity.here(settings.app, settings.server)
        telemetry.watch_brokers(self.brokers)

    @property
    def stopping(self) -> bool:
        """True once ``request_stop`` was called."""
        return self.slots.stopping

    @property
    def _client_id(self) -> str:
        return f"{self.settings.app}.{self.settings.server}"

    def request_stop(self) -> None:
        """Begin the orderly shutdown; ``run`` returns when it is complete. Call it from the
        container's event loop (a signal handler task, a test)."""
        self.slots.stop_receiving()
        if self._stop_requested is not None:
            self._stop_requested.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  before_handlers: Callable[[], Awaitable[object]] | None = None) -> None:
        """Start, report ready through ``task_status``, process until ``request_stop``, then
        shut down in the documented order. ``before_handlers`` is awaited once every
        subscription is made and before any handler runs (the application's resources start
        there). Startup errors (ConfigurationError, BrokerError, and what ``before_handlers``
        raised) are raised."""
        self._stop_requested = anyio.Event()
        self.identity = ContainerIdentity.here(self.settings.app, self.settings.server)
        try:
            for store in self.stores.values():
                await store.check()
            # Only a container with exactly-once listeners needs its database to start.
            if self.stores:
                from mdb.exactly_once.store import database_seal

                seal = await database_seal(self.settings, self.stores)
                if seal is not None:  # before any message is received or sent
                    self.brokers.seal = seal
            slots = await self._start()
            if before_handlers is not None:
                await before_handlers()
            log.debug("container ready: %d listeners, %d subscriptions",
                     len(self.deployed), sum(s.subscription is not None for s in slots))
            task_status.started()
            async with anyio.create_task_group() as work:
                self.slots.work = work
                for store in self.stores.values():
                    work.start_soon(store.upkeep)
                for count, slot in enumerate(slots, 1):
                    self.slots.launch(slot)
                    if count % LAUNCHED_TOGETHER == 0:
                        # The loop reads the brokers between two batches: 3,000 slots started
                        # in one turn of it, each with the message it already holds, kept it
                        # from reading for seconds, longer than the heart-beats allow.
                        await anyio.lowlevel.checkpoint()
                if self.stopping:
                    self.request_stop()
                await self._stop_requested.wait()
                # The stop, in order. No slot takes a new delivery (request_stop); those in
                # flight get the grace period to settle, so that a stop repeats no work.
                with anyio.move_on_after(self.settings.shutdown_grace_period):
                    await self.slots.drained()
                # What is still running is cancelled: its transaction aborted, its delivery
                # redelivered by the broker, flagged, once its slot closes its subscription.
                work.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                # Only now, with every slot ended, the subscriptions whose closing would end
                # their connection and with it the other slots' work there.
                await self.slots.close_held()
                # Deleted while the connections are still open: the broker drops them with the
                # messages they hold.
                await self._undeploy()
        finally:
            self.slots.work = None
            with anyio.CancelScope(shield=True):
                # Connections last: every subscription and transaction on them is done.
                await self.brokers.close()
                await self.producer.close()
                for store in self.stores.values():
                    await store.close()

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
        moved = self.brokers.moved(settings)
        old = {(d.spec.name, p.member) for d in self.deployed for p in d.planned}
        new = {(name, p.member) for name, planned in plans.items() for p in planned}
        leaving = {key for key in old if key not in new or key[1].broker in moved}
        joining = {key for key in new if key not in old or key[1].broker in moved}
        joined = [(d, p) for d in self.deployed for p in plans[d.spec.name]
                  if (d.spec.name, p.member) in joining]
        pools = self.brokers.prepare(settings, slots_per_broker((d.spec, p) for d, p in joined),
                                     self._client_id, self._members_on)
        # Nothing above changed the running container; from here on nothing can fail.
        self.settings = self.settings.model_copy(
            update={"brokers": settings.brokers, "destinations": settings.destinations})
        retired_links = self.brokers.apply(self.settings, pools)
        self.slots.retire(leaving)
        for deployed in self.deployed:
            deployed.planned = plans[deployed.spec.name]
        for listener, member in sorted(leaving - joining, key=str):
            self.events.emit(BrokerEvent(EventKind.MEMBER_UNAVAILABLE, member.broker, member,
                                         f"left the topology (listener {listener})"))
        slots = self.slots.new(joined)
        # As at startup, a new member is subscribed before it is announced, so that nothing a
        # producer sends to it after the event is missed.
        try:
            await subscribe(slots)
        except BrokerError as exc:
            log.error("a new member's subscription failed (%s); its slots keep trying", exc)
        for slot in slots:
            self.slots.launch(slot)
        subscribed = {(s.deployed.spec.name, s.planned.member) for s in slots
                      if s.subscription is not None}
        for listener, member in sorted(joining - leaving, key=str):
            if (listener, member) in subscribed:
                self.events.emit(BrokerEvent(EventKind.MEMBER_AVAILABLE, member.broker, member,
                                             f"joined the topology (listener {listener})"))
            else:
                log.warning("member %s (listener %s) joined the topology; it is consumed once "
                            "broker %s answers", member, listener, member.broker)
        if retired_links and self.slots.work is not None:
            self.slots.work.start_soon(self.slots.close_when_drained, retired_links)
        log.info("topology applied: %d subscriptions leave, %d join",
                 len(leaving), len(joining))

    def pause(self, name: str) -> None:
        """Pause listener ``name``: it takes no new delivery. What its handlers run finishes
        and settles; each pool slot then ends its subscription, and the broker takes back what
        it had pushed there that no handler began (a broker that keeps those with the
        connection until it closes, RabbitMQ, keeps the subscription instead, holding them
        unbegun: ``Capabilities.closing_keeps_unsettled``). Connections stay open; a lost one
        is not subscribed again until ``resume``. A paused listener does not make the
        container unready. Call it on the container's event loop; ``UnknownListener`` names
        the listeners it runs."""
        deployed = self._deployed(name)
        if not deployed.paused:
            self.slots.pause(deployed)
            log.info("listener %s paused: it takes no new message", name)

    def resume(self, name: str) -> None:
        """Resume listener ``name`` (``pause``): its pool slots subscribe again."""
        deployed = self._deployed(name)
        if deployed.paused:
            self.slots.resume(deployed)
            log.info("listener %s resumed", name)

    def _deployed(self, name: str) -> Deployed:
        for deployed in self.deployed:
            if deployed.spec.name == name:
                return deployed
        known = ", ".join(sorted(d.spec.name for d in self.deployed)) or "none"
        raise UnknownListener(f"no listener {name!r} in this container; its listeners: {known}")

    def health(self) -> Health:
        """A snapshot for the health endpoint; call it on the container's event loop. Live
        whenever it is called (the loop answered: a slow start is not a dead process); its
        stage starting until its slots run, stopping once it was asked to stop; ready when
        running, every broker and database up, every member subscribed and every listener
        with a pool slot not stuck (``mdb.delivery.timeouts``): when ``Health.unready`` has
        no reason."""
        now = time.monotonic()
        subscribed = self.slots.subscribed()
        listeners = tuple(
            ListenerHealth(d.spec.name, len(d.planned),
                           len(members := subscribed.get(id(d), set())),
                           d.stats.in_flight, d.stats.processed,
                           d.spec.options.pool * len(d.planned),
                           tuple(StuckHandler(call.message_id, now - call.started)
                                 for call in d.threads.stuck()),
                           d.paused, d.stats.redelivered, d.stats.to_error_destination,
                           str(d.spec.destination), _mode(d),
                           tuple(MemberHealth(p.broker, str(p.member.destination),
                                              p.member in members,
                                              (p.request.durable and p.request.name) or "")
                                 for p in d.planned),
                           d.stats.latencies.percentile(0.5), d.stats.latencies.percentile(0.99),
                           d.stats.already_processed)
            for d in self.deployed)
        brokers = tuple(BrokerHealth(status.name, status.state, status.since, status.address)
                        for status in self.brokers.watched())
        stage = (STOPPING if self.stopping else STARTING if self.slots.work is None
                 else RUNNING)
        events = {str(kind): count for kind, count in self.events.counts.items()}
        snapshot = Health(live=True, ready=False, brokers=brokers, listeners=listeners,
                          events=events, databases=tuple(
                              store.health(time.time()) for store in self.stores.values()),
                          stage=stage, identity=self.identity)
        return replace(snapshot, ready=not any(snapshot.unready().values()))

    def _members_on(self, broker: str) -> list[Member]:
        return list(dict.fromkeys(p.member for d in self.deployed for p in d.planned
                                  if p.broker == broker))

    async def _start(self) -> list[Slot]:
        """Subscribe every slot whose broker answers; raise the first failure when none
        does."""
        unreachable: dict[str, ConnectionFailed] = {}
        for name, links in self.brokers.pools.items():
            try:
                connection = await links[0].connect()
            except ConnectionFailed as exc:
                unreachable[name] = exc
                continue
            await self._say_where_delays_wait(name, connection)
        if self.brokers.pools and len(unreachable) == len(self.brokers.pools):
            raise next(iter(unreachable.values()))
        for name, why in unreachable.items():
            log.warning("broker %s unreachable at startup (%s); its listeners start when it "
                        "answers", name, why)
        slots = self.slots.new([(d, p) for d in self.deployed for p in d.planned])
        await subscribe([s for s in slots if s.planned.broker not in unreachable])
        return slots

    async def _say_where_delays_wait(self, name: str, connection: Connection) -> None:
        """One line for a broker that cannot hold a redelivery's delay back, when a listener
        on it has one: there each delay is waited out in the process, holding a pool slot."""
        if not any(d.spec.options.redelivery.delay_before(1) > 0
                   for d in self.deployed for p in d.planned if p.broker == name):
            return
        why = (await connection.capabilities()).cannot_hold_delays
        if why is not None:
            log.warning("broker %s cannot hold a redelivery delay back (%s): each delay is "
                        "waited out in this process, holding a pool slot", name, why)

    async def _undeploy(self) -> None:
        """Delete the subscriptions of listeners with ``durable_subscription_deletion``; a
        failure is logged: the subscription is then abandoned (``mdb subscriptions --delete``)."""
        for deployed in self.deployed:
            if not deployed.spec.options.durable_subscription_deletion:
                continue
            for planned in deployed.planned:
                assert planned.request.name is not None  # a topic: checked by the listener
                try:
                    connection = await self.brokers.pools[planned.broker][0].connect()
                    await connection.delete_subscription(planned.request.destination,
                                                         planned.request.name)
                except BrokerError as exc:
                    log.error("listener %s: subscription %s on broker %s not deleted: %s",
                              deployed.spec.name, planned.name, planned.broker, exc)
                else:
                    log.info("listener %s: subscription %s on broker %s deleted",
                             deployed.spec.name, planned.name, planned.broker)


def _mode(deployed: Deployed) -> str:
    """How ``deployed``'s messages are spread over the application's processes."""
    spec = deployed.spec
    return ("queue" if spec.destination.kind is Kind.QUEUE
            else str(spec.options.distribution))
