"""A listener module with dependencies, used by test_wiring."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from dependency_injector import containers, providers
from dependency_injector.wiring import Provide

from mdb import listener

EVENTS: list[str] = []
HANDLED = threading.Event()


def journal() -> Iterator[list[str]]:
    EVENTS.append("resource started")
    yield EVENTS
    EVENTS.append("resource stopped")


class Services(containers.DeclarativeContainer):
    journal = providers.Resource(journal)
    greeting = providers.Object("hello")


@listener("queue:wired")
async def on_wired(body: str, events: list[str] = Provide[Services.journal],
                   greeting: str = Provide[Services.greeting]) -> None:
    events.append(f"{greeting} {body}")
    HANDLED.set()
