"""Containers run in the test's own process: settings for a broker URL (or three, holding the
members of partitioned destinations), running handlers until a block ends, watching what
handlers saw (``Calls``), and names no other test uses (``unique``). Sending and reading
messages: ``tests.harness.traffic.messages``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from mdb import Container, Settings
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import DestinationSettings, MemberSettings
from mdb.container.slots import Slot
from mdb.listeners.listener import ListenerSpec, spec_of
from mdb.messages.destinations import Destination
from mdb_memory.state import BrokerState, broker_state

WAIT = 30.0  # seconds a test waits for something that should happen, before failing


async def until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (``WAIT`` at most): for what says nothing when it
    changes (a container's counts and health are known only when asked)."""
    with anyio.fail_after(WAIT):
        while not condition():
            await anyio.sleep(0.02)


def unsettled(slot: Slot) -> int:
    """What the broker dispatched to ``slot``'s subscription and it has not settled (both
    adapters count it: ``unsettled_count``)."""
    count: int = getattr(slot.subscription, "unsettled_count", 0)
    return count


async def dispatched(container: Container, count: int) -> None:
    """Wait until the broker dispatched ``count`` deliveries to ``container``'s running slots
    that they hold unsettled: a batch takes only what reached its slot, and a broker
    dispatches on its own time, not when a send's receipt comes."""
    await until(lambda: sum(unsettled(slot) for slot in container.slots.running) >= count)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def memory_broker(prefix: str) -> tuple[str, BrokerState]:
    """A memory broker of the test's own: its URL, and its state, whose hooks drop
    connections, lose acks or wait until a condition holds (``mdb_memory.state``)."""
    name = unique(prefix)
    return f"memory://{name}", broker_state(name)


def settings_for(url: str, **values: object) -> Settings:
    values.setdefault("app", unique("app"))
    values.setdefault("server", "s1")
    values.setdefault("shutdown_grace_period", 5.0)
    return Settings(brokers={"default": BrokerSettings(url=url, heartbeat_ms=2000)},
                    **values)  # type: ignore[arg-type]


MEMBER_BROKERS = ("a", "b", "c")


def partitioned_settings(urls: Sequence[str], destinations: Iterable[str], *,
                         named: bool = False, **values: object) -> Settings:
    """Settings with brokers ``a``, ``b``, ``c`` at ``urls``, each holding one member of every
    destination in ``destinations``: of the same name, or (``named``) of a name of its own,
    the logical one and the broker's (``queue:orders`` is queue ``orders.a`` on ``a``)."""
    values.setdefault("app", unique("app"))
    values.setdefault("server", "s1")
    values.setdefault("shutdown_grace_period", 5.0)
    return Settings(
        brokers={name: BrokerSettings(url=url, heartbeat_ms=2000)
                 for name, url in zip(MEMBER_BROKERS, urls, strict=True)},
        destinations={d: DestinationSettings(members=[
            MemberSettings(broker=b, name=f"{Destination.parse(d).name}.{b}" if named else None)
            for b in MEMBER_BROKERS]) for d in destinations},
        **values)  # type: ignore[arg-type]


def record_spans(exporter: SpanExporter) -> None:
    """Send every span finished from now on to ``exporter`` too. The global tracer provider can
    be set once per process: the first caller sets an SDK one and later callers add to it, so
    test modules that read spans pass in any order."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))


def specs(*handlers: Callable[..., object]) -> list[ListenerSpec]:
    found = [spec_of(h) for h in handlers]
    assert all(found)
    return [s for s in found if s is not None]


@asynccontextmanager
async def running(settings: Settings, *handlers: Callable[..., object]) -> AsyncIterator[Container]:
    """A container running ``handlers`` until the block exits, then stopped in order."""
    container = Container(settings, specs(*handlers))
    async with anyio.create_task_group() as tg:
        await tg.start(container.run)
        try:
            yield container
        finally:
            container.request_stop()


@dataclass
class Calls:
    """What handlers saw, with a way to wait until enough was seen."""

    seen: list[tuple[str, object]] = field(default_factory=list)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def add(self, key: str, value: object) -> None:
        self.seen.append((key, value))
        self._changed.set()
        self._changed = anyio.Event()

    def of(self, key: str) -> list[object]:
        return [v for k, v in self.seen if k == key]

    async def wait(self, predicate: Callable[[Calls], bool], timeout: float = WAIT) -> None:
        with anyio.fail_after(timeout):
            while not predicate(self):
                await self._changed.wait()
