"""A listener module with dependencies, used by test_wiring."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

from dependency_injector import containers, providers
from dependency_injector.wiring import Provide

from mdb import Producer, Settings, listener
from mdb.config.broker_settings import BrokerSettings

SETTINGS = Settings(app="wired", brokers={"default": BrokerSettings(url="memory://wired")})
EVENTS: list[str] = []
HANDLED = threading.Event()
NEWS = threading.Event()


def journal() -> Iterator[list[str]]:
    EVENTS.append("resource started")
    yield EVENTS
    EVENTS.append("resource stopped")


async def announcer() -> AsyncIterator[None]:
    """A resource that says at start-up, on a topic its own application listens on, that it
    started."""
    async with Producer(SETTINGS) as producer:
        await producer.send("topic:wired_news", "announcer up")
    yield


class Services(containers.DeclarativeContainer):
    journal = providers.Resource(journal)
    announcer = providers.Resource(announcer)
    greeting = providers.Object("hello")


@listener("queue:wired")
async def on_wired(body: str, events: list[str] = Provide[Services.journal],
                   greeting: str = Provide[Services.greeting]) -> None:
    events.append(f"{greeting} {body}")
    HANDLED.set()


@listener("topic:wired_news")
async def on_news(body: str, events: list[str] = Provide[Services.journal]) -> None:
    events.append(f"news: {body}")
    NEWS.set()
