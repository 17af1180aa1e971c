"""``Listener``: stomp.py's callbacks, which run on its threads, handed over to the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import stomp


class Events(Protocol):
    """The loop-side handlers of one connection's events (``Wire``)."""

    def on_connected(self) -> None: ...

    def on_message(self, headers: dict[str, str], body: bytes | str | None) -> None: ...

    def on_receipt(self, receipt: str | None) -> None: ...

    def on_error(self, headers: Mapping[str, str], body: bytes | str | None) -> None: ...

    def lose(self, reason: str) -> None: ...


class Listener(stomp.ConnectionListener):  # type: ignore[misc]
    """Runs on stomp.py's threads: forwards every event to the loop, touches nothing else."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: Events) -> None:
        self._loop = loop
        self._events = events

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback`` on the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)

    def on_connected(self, frame: Any) -> None:
        self._post(self._events.on_connected)

    def on_message(self, frame: Any) -> None:
        self._post(self._events.on_message, frame.headers, frame.body)

    def on_receipt(self, frame: Any) -> None:
        self._post(self._events.on_receipt, frame.headers.get("receipt-id"))

    def on_error(self, frame: Any) -> None:
        self._post(self._events.on_error, frame.headers, frame.body)

    def on_disconnected(self) -> None:
        self._post(self._events.lose, "the connection to the broker closed")

    def on_heartbeat_timeout(self) -> None:
        self._post(self._events.lose, "no heartbeat from the broker in time")
