"""The kit for plain ``def`` tests: ``SyncRunner.start`` runs the listeners on an event loop in
a thread of its own (an anyio blocking portal) and ``SyncApp`` calls the runner there."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from functools import partial
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from mdb.testing.loading import Listeners
from mdb.testing.received import Received
from mdb.testing.runner import WAIT, Runner, RunningApp
from mdb.testing.tracker import Attempt


class SyncApp:
    """A ``RunningApp`` for a plain ``def`` test: the same methods, blocking."""

    def __init__(self, app: RunningApp, portal: BlockingPortal) -> None:
        self.app = app
        self._portal = portal

    @property
    def services(self) -> Any:
        return self.app.services

    def send(self, destination: str, body: object, headers: Mapping[str, str] | None = None,
             *, key: str | None = None) -> str:
        return self._portal.call(partial(self.app.send, destination, body, headers, key=key))

    def send_again(self, message_id: str) -> None:
        self._portal.call(self.app.send_again, message_id)

    def settled(self, message_id: str, *, timeout: float = WAIT) -> list[Attempt]:
        return self._portal.call(partial(self.app.settled, message_id, timeout=timeout))

    def idle(self, *, timeout: float = WAIT, fail_fast: bool = True) -> None:
        self._portal.call(partial(self.app.idle, timeout=timeout, fail_fast=fail_fast))

    def take(self, destination: str, count: int = 1, *, timeout: float = WAIT) -> list[Received]:
        return self._portal.call(partial(self.app.take, destination, count, timeout=timeout))

    def attempts(self, message_id: str) -> list[Attempt]:
        return self._portal.call(self.app.runner.attempts, message_id)

    def advance(self, seconds: float) -> None:
        """Move the runner's manual clock on (in the loop's thread, where its timers live)."""
        self._portal.call(self.app.runner.clock.advance, seconds)


class SyncRunner(Runner):
    """A ``Runner`` that also serves plain ``def`` tests: ``start`` returns a ``SyncApp``
    running until ``close`` (the pytest fixture ``mdb_runner`` closes it)."""

    def __init__(self, url: str | None = None, **options: Any) -> None:
        super().__init__(url, **options)
        self._sync = ExitStack()
        self._portal: BlockingPortal | None = None

    def start(self, *listeners: Listeners, **options: Any) -> SyncApp:
        """``run(*listeners, **options)`` in the runner's own event loop thread, until
        ``close``."""
        if self._portal is None:
            self._portal = self._sync.enter_context(start_blocking_portal("asyncio"))
        app = self._sync.enter_context(
            self._portal.wrap_async_context_manager(self.run(*listeners, **options)))
        return SyncApp(app, self._portal)

    def close(self) -> None:
        """Stop what ``start`` started, last first, then the loop's thread."""
        self._sync.close()
        self._portal = None
