"""Dependency injection: the app's container is found, wired, and its resources live exactly
as long as the handlers may run."""

from __future__ import annotations

from contextlib import AsyncExitStack
from functools import partial

import anyio
import anyio.to_thread
import pytest

from mdb import Container, Producer
from mdb.container.wiring import find_container, find_listeners, import_modules, resources, wired
from mdb.errors import ConfigurationError
from tests.unit import wired_app

pytestmark = pytest.mark.anyio


async def test_resources_start_before_consuming_and_stop_after_the_last_handler() -> None:
    wired_app.EVENTS.clear()
    wired_app.HANDLED.clear()
    wired_app.NEWS.clear()
    settings = wired_app.SETTINGS
    modules = import_modules(["tests.unit.wired_app"])
    async with Producer(settings) as producer:
        await producer.send("queue:wired", "world")
    di = find_container(None, modules)
    assert di is not None and di.greeting() == "hello"
    async with wired(di, modules, find_listeners(modules)) as handlers, \
            AsyncExitStack() as started:
        container = Container(settings, handlers)
        async with anyio.create_task_group() as tg:
            await tg.start(partial(
                container.run, before_handlers=lambda: started.enter_async_context(resources(di))))
            assert await anyio.to_thread.run_sync(wired_app.HANDLED.wait, 30)
            # The subscriptions were made before the resources started: what one sent then to
            # the application's own topic is there.
            assert await anyio.to_thread.run_sync(wired_app.NEWS.wait, 30)
            container.request_stop()
        assert wired_app.EVENTS[0] == "resource started"
        assert sorted(wired_app.EVENTS[1:]) == ["hello world", "news: announcer up"]
    assert wired_app.EVENTS[-1] == "resource stopped"


def test_a_named_container_that_does_not_load_is_named() -> None:
    with pytest.raises(ConfigurationError, match="setting container: cannot load"):
        find_container("tests.unit.wired_app:Nope", [])


def test_without_a_container_there_is_nothing_to_wire() -> None:
    # A listener module that declares no dependency-injector container.
    assert find_container(None, import_modules(["tests.harness.apps.queue_ledger_app"])) is None
