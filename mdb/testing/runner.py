"""``Runner``: run an application's listeners in a container inside a test, send to them, and
wait until what was sent is settled.

One runner is one test's broker (``url``) and clock. ``run`` starts a container of listeners
(as ``mdb run`` would, with the application's dependency-injector container, overrides
applied); several may run at once (two applications on one topic). The runner follows every
message through the container's spans (``mdb.testing.tracker``), so ``settled`` and ``idle``
work the same on the memory broker and on a real one. With a ``ManualClock`` a wait that finds
the listeners doing nothing but waiting for the clock moves it on to the next timer, so a
redelivery delay passes at once.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import anyio
import anyio.lowlevel
from dependency_injector import containers

from mdb import clock as clocks
from mdb.commands.dlq.failed import ErrorDestination
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from mdb.container.container import Container
from mdb.container.wiring import find_container, find_event_callbacks, resources, wired
from mdb.errors import ConfigurationError, sole
from mdb.listeners.listener import ListenerSpec
from mdb.messages import codec
from mdb.messages.destinations import Destination, Kind
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage
from mdb.routing.producer import Producer
from mdb.seam.broker import ConnectionOptions, SubscriptionRequest
from mdb.seam.registry import broker_for
from mdb.testing.environment import broker_url, made_tables
from mdb.testing.loading import Listeners, listeners_of, override
from mdb.testing.manual_clock import ManualClock
from mdb.testing.progress import describe, expected_subscriptions, is_done
from mdb.testing.received import Received
from mdb.testing.tracker import MOVED, Attempt, Tracker, install

WAIT = 30.0
"""Seconds a wait of the kit lasts before it fails (a guard against hanging, not a timing)."""


class NotSettled(AssertionError):
    """A wait of the kit timed out; the message says where each unsettled message is."""


class HandlerFailed(AssertionError):
    """A message moved to an error destination for a failure that was not a handler's
    exception (a body that does not decode, ...), seen by a fail-fast wait."""


@dataclass
class RunningApp:
    """One running container of the runner: its ``settings``, the ``container`` and the
    application's dependency-injector container ``services`` (None when it has none)."""

    runner: Runner
    settings: Settings
    container: Container
    services: containers.Container | None

    @property
    def in_flight(self) -> int:
        """Deliveries its handlers hold now."""
        return sum(d.stats.in_flight for d in self.container.deployed)

    # The runner's waits, here too: a test with one application talks to it only.
    async def send(self, destination: str, body: object, headers: Mapping[str, str] | None = None,
                   *, key: str | None = None) -> str:
        return await self.runner.send(destination, body, headers, key=key)

    async def send_again(self, message_id: str) -> None:
        await self.runner.send_again(message_id)

    async def settled(self, message_id: str, *, timeout: float = WAIT) -> list[Attempt]:
        return await self.runner.settled(message_id, timeout=timeout)

    async def idle(self, *, timeout: float = WAIT, fail_fast: bool = True) -> None:
        await self.runner.idle(timeout=timeout, fail_fast=fail_fast)

    async def take(self, destination: str, count: int = 1, *,
                   timeout: float = WAIT) -> list[Received]:
        return await self.runner.take(destination, count, timeout=timeout)

    def error_destination(self, destination: str) -> ErrorDestination:
        return self.runner.error_destination(destination)


class Runner:
    """A test's broker ``url`` (default: ``broker_url()``) and ``clock`` (default: a
    ``ManualClock``, installed with ``mdb.clock.use`` while containers run).

    Everything is used from one event loop: ``async with runner.run(...)`` in an ``async def``
    test; ``mdb.testing.SyncRunner`` for a plain ``def`` one."""

    def __init__(self, url: str | None = None, *, clock: ManualClock | None = None) -> None:
        self.url = url or broker_url()
        self.clock = clock or ManualClock()
        self.apps: list[RunningApp] = []
        self._tracker: Tracker | None = None
        self._change: anyio.Event | None = None  # made in the event loop (``_start``)
        self._reported: set[int] = set()  # failures a fail-fast wait raised already
        self._stack: AsyncExitStack | None = None
        self._producer: Producer | None = None
        self._sent: dict[str, tuple[Destination, OutgoingMessage, str | None]] = {}

    # --- running ---------------------------------------------------------------------------

    @asynccontextmanager
    async def run(
        self, *listeners: Listeners, settings: Settings | None = None,
        services: str | containers.Container | None = None,
        overrides: Mapping[str, object] | None = None, app: str | None = None,
        server: str = "s1",
    ) -> AsyncIterator[RunningApp]:
        """Run ``listeners`` until the block exits, then stop the container in order.

        ``listeners``: module names (as ``mdb run`` takes them), modules, ``@listener``
        functions, or lists of them. ``settings`` are the application's (e.g.
        ``load_settings("mdb.toml")``): every broker in them is replaced by the runner's
        (distinct memory brokers for several, on a memory URL). ``services`` is the
        dependency-injector container (``module:Attribute`` or an instance; by default the
        one the listener modules import, as ``mdb run`` finds it); ``overrides`` replace its
        providers by name for this run (a value, or a provider). ``app`` defaults to a new
        name per run, so two runs are two applications."""
        modules, specs = listeners_of(listeners)
        di = find_container(services, modules) if isinstance(services, str | None) else services
        settings = self._settings(settings, app or f"app_{uuid.uuid4().hex[:8]}", server)
        try:
            async with AsyncExitStack() as stack:
                await self._start(stack)
                await made_tables(settings)
                if overrides:
                    override(di, overrides, stack)
                handlers = await stack.enter_async_context(wired(di, modules, specs))
                container = Container(settings, [self._recording(s) for s in handlers],
                                      on_event=find_event_callbacks(modules))
                # Resources start once subscribed, and stop after the container (as mdb run).
                started = await stack.enter_async_context(AsyncExitStack())
                tasks = await stack.enter_async_context(anyio.create_task_group())
                await tasks.start(functools.partial(
                    container.run,
                    before_handlers=lambda: started.enter_async_context(resources(di))))
                running = RunningApp(self, settings, container, di)
                self.apps.append(running)
                try:
                    yield running
                finally:
                    self.apps.remove(running)
                    container.request_stop()
        except BaseExceptionGroup as group:  # a failed assert of the test's block, as itself
            raise sole(group) from None

    async def _start(self, stack: AsyncExitStack) -> None:
        """The first run of this runner installs its tracker and clock, until the last ends."""
        if self._stack is not None:
            return
        self._stack = stack
        self._change = anyio.Event()
        self._tracker = Tracker(self._changed)
        stack.callback(install(self._tracker))
        stack.enter_context(clocks.use(self.clock))
        self.clock.on_change = self._changed

        def forget() -> None:
            self._stack = None
        stack.callback(forget)

        async def close_producer() -> None:
            if self._producer is not None:
                await self._producer.close()
                self._producer = None
        stack.push_async_callback(close_producer)

    def _settings(self, given: Settings | None, app: str, server: str) -> Settings:
        names = list(given.brokers) if given is not None and given.brokers else ["default"]
        memory = self.url.startswith("memory:")
        brokers = {}
        for name in names:
            old = given.brokers.get(name) if given is not None else None
            url = f"{self.url}-{name}" if memory and len(names) > 1 else self.url
            brokers[name] = (old.model_copy(update={"url": url}) if old is not None
                             else BrokerSettings(url=url))
        values: dict[str, Any] = {"brokers": brokers, "app": app, "server": server,
                                  "shutdown_grace_period": 5.0, "health_port": None}
        if given is None:
            return Settings(**values)
        return given.model_copy(update=values)

    def _recording(self, spec: ListenerSpec) -> ListenerSpec:
        """``spec`` whose handler tells the tracker what it raised (for a fail-fast wait)."""
        handler, tracker = spec.handler, self._tracker
        assert tracker is not None
        if spec.is_async:
            @functools.wraps(handler)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await handler(*args, **kwargs)
                except Exception as exc:
                    tracker.raised(exc)
                    raise
            return replace(spec, handler=run_async)

        @functools.wraps(handler)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return handler(*args, **kwargs)
            except Exception as exc:
                tracker.raised(exc)
                raise
        return replace(spec, handler=run)

    # --- sending and reading -----------------------------------------------------------------

    async def send(self, destination: str, body: object, headers: Mapping[str, str] | None = None,
                   *, key: str | None = None) -> str:
        """Send ``body`` (as ``Producer.send`` would) and return its ``mdb_id``."""
        tracker = self._running_tracker()
        producer = self._producer_of_the_test()
        target = Destination.parse(destination)
        message = codec.outgoing(body, headers, limits=producer.brokers.header_limits)
        await producer.send_message(target, message, key=key)
        message_id = message.headers[ID]
        self._sent[message_id] = (target, message, key)
        tracker.expect(message_id, str(target))
        return message_id

    async def send_again(self, message_id: str) -> None:
        """Send the message ``send`` sent as ``message_id`` once more, as it was (body,
        headers, ``mdb_id``): the copy a broker redelivers when an acknowledgement was lost,
        or a producer sends again after ``SendOutcomeUnknown``. The waits then wait for each
        copy; an exactly-once listener settles the copy without running
        (``Attempt.outcome == "already processed"``)."""
        tracker = self._running_tracker()
        if message_id not in self._sent:
            raise ConfigurationError(f"send_again: message {message_id} was not sent by this "
                                     "runner's send")
        target, message, key = self._sent[message_id]
        tracker.again(message_id)
        await self._producer_of_the_test().send_message(target, message, key=key)

    def _producer_of_the_test(self) -> Producer:
        if self._producer is None:
            settings = self.apps[0].settings if self.apps else self._settings(None, "test", "s1")
            self._producer = Producer(settings, client_id=f"mdb-testing-{uuid.uuid4().hex[:8]}")
        if self.apps:  # it sends as the application does, proven with its secret
            self._producer.brokers.seal = self.apps[0].container.brokers.seal
        return self._producer

    async def take(self, destination: str, count: int = 1, *,
                   timeout: float = WAIT) -> list[Received]:
        """Take ``count`` messages from queue ``destination`` (what handlers sent, an error
        destination's copies), waiting for them; each is consumed. On a real broker a queue
        outlives the test: messages this runner never saw sent are left-overs of earlier
        tests, and are consumed and dropped."""
        target = Destination.parse(destination)
        if target.kind is not Kind.QUEUE:
            raise ConfigurationError(
                f"take reads a queue, not {target}: to see a topic's messages, run a listener "
                "of it in the test")
        tracker = self._running_tracker()
        options = ConnectionOptions(url=self.url, client_id=f"mdb-testing-{uuid.uuid4().hex[:8]}")
        connection = await broker_for(options).connect()
        taken: list[Received] = []
        try:
            subscription = await connection.subscribe(SubscriptionRequest(
                target, name=None, durable=True, selector=None, prefetch=1))
            try:
                with anyio.fail_after(timeout):
                    while len(taken) < count:
                        delivery = await subscription.receive()
                        await connection.ack(delivery)
                        received = Received.of(delivery)
                        if received.id in tracker.expected or received.id in tracker.attempts:
                            taken.append(received)
            except TimeoutError:
                raise NotSettled(f"took {len(taken)} of {count} messages from {target} within "
                                 f"{timeout} s") from None
            finally:
                await subscription.close()
        finally:
            await connection.close()
        return taken

    def error_destination(self, destination: str) -> ErrorDestination:
        """Error destination ``destination`` (``queue:NAME.DLQ``) on the runner's broker: what
        reached it (``list``, ``show``), and ``replay`` or ``purge`` as ``mdb dlq`` does
        (``mdb.commands.dlq.failed``): a replay sends a message back where a running listener
        consumes. The waits wait for a replayed message to be ended once more, as for
        ``send_again``."""
        tracker = self._running_tracker()

        def replayed(message_id: str, target: Destination) -> None:
            sent_before = message_id in tracker.expected  # else a producer's of its own
            tracker.expect(message_id, str(target))
            if sent_before:
                tracker.again(message_id)

        consumed = [d.spec.destination for app in self.apps for d in app.container.deployed]
        return ErrorDestination(self._producer_of_the_test().brokers, destination,
                                f"mdb-testing-{uuid.uuid4().hex[:8]}", replayed, consumed)

    # --- waiting ------------------------------------------------------------------------------

    def attempts(self, message_id: str) -> list[Attempt]:
        """Every delivery of the message seen so far, in order."""
        return list(self._running_tracker().attempts.get(message_id, []))

    async def settled(self, message_id: str, *, timeout: float = WAIT) -> list[Attempt]:
        """Wait until every listener the message was sent to is done with it (processed,
        moved to an error destination, given up), moving a manual clock through redelivery
        delays; return its attempts. Raises ``NotSettled`` saying where it is (at once when
        no running listener serves any destination it was sent to)."""
        destinations = self._running_tracker().expected.get(message_id, [])
        if not any(expected_subscriptions(self._containers(), d) for d in destinations):
            raise NotSettled(self._describe([message_id], 0.0))
        await self._wait(lambda: self._done(message_id), timeout, lambda: [message_id],
                         fail_fast=False)
        return self.attempts(message_id)

    async def idle(self, *, timeout: float = WAIT, fail_fast: bool = True) -> None:
        """Wait until every message sent (by the test, by handlers whose delivery succeeded,
        to an error destination) is done with by every running listener of its destination,
        no handler runs and no clock timer is left, moving a manual clock on as needed. With
        ``fail_fast`` a message moved to an error destination raises at once what its
        handler raised (``HandlerFailed`` when no handler raised, e.g. a body that did not
        decode); each such failure is raised once."""
        tracker = self._running_tracker()
        await self._wait(
            lambda: (all(self._done(i) for i in tracker.expected)
                     and not any(a.in_flight for a in self.apps)
                     and self.clock.next_due is None),
            timeout, lambda: [i for i in tracker.expected if not self._done(i)],
            fail_fast=fail_fast)

    async def _wait(self, done: Callable[[], bool], timeout: float,
                    pending: Callable[[], Iterable[str]], *, fail_fast: bool) -> None:
        try:
            with anyio.fail_after(timeout):
                while True:
                    if fail_fast:
                        self._raise_failure()
                    if done():
                        return
                    if self._waiting_for_the_clock():
                        self.clock.advance_to_next()
                        await anyio.lowlevel.checkpoint()
                        continue
                    assert self._change is not None
                    await self._change.wait()
        except TimeoutError:
            raise NotSettled(self._describe(list(pending()), timeout)) from None

    def _waiting_for_the_clock(self) -> bool:
        """Every handler that holds a delivery sleeps on the clock, and a timer is set."""
        return (self.clock.next_due is not None
                and sum(a.in_flight for a in self.apps) <= self.clock.sleepers)

    def _changed(self) -> None:
        if self._change is not None:
            self._change.set()
            self._change = anyio.Event()

    def _raise_failure(self) -> None:
        for attempts in self._running_tracker().attempts.values():
            for attempt in attempts:
                if attempt.outcome != MOVED or id(attempt) in self._reported:
                    continue
                self._reported.add(id(attempt))
                if attempt.exception is not None:
                    attempt.exception.add_note(f"mdb.testing: {attempt}")
                    raise attempt.exception
                raise HandlerFailed(str(attempt))

    def _done(self, message_id: str) -> bool:
        return is_done(self._running_tracker(), self._containers(), message_id)

    def _describe(self, pending: list[str], timeout: float) -> str:
        return describe(self._running_tracker(), self._containers(), self.clock, pending, timeout)

    def _containers(self) -> list[Container]:
        return [running.container for running in self.apps]

    def _running_tracker(self) -> Tracker:
        if self._tracker is None:
            raise ConfigurationError("nothing ran yet: call this inside `async with "
                                     "runner.run(...)`")
        return self._tracker
