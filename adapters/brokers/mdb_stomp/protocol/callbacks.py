"""``StompCallbacks``: stomp.py's callbacks, handed to the loop's handlers (``WireEvents``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import stomp


class WireEvents(Protocol):
    """The loop-side handlers of one connection's events (``Wire``)."""

    def on_connected(self) -> None: ...

    def on_message(self, headers: dict[str, str], body: bytes | str | None) -> None: ...

    def on_damaged(self, headers: dict[str, str], body: bytes, why: str) -> None: ...

    def on_receipt(self, receipt: str | None) -> bool: ...

    def on_error(self, headers: Mapping[str, str], body: bytes | str | None) -> None: ...

    def on_silence(self, silence: float, limit: float) -> None: ...

    def lose(self, reason: str) -> None: ...


class StompCallbacks(stomp.ConnectionListener):  # type: ignore[misc]
    """Forwards stomp.py's events to the loop's handlers, touches nothing else. The frames stomp.py
    sees (CONNECTED, RECEIPT, ERROR: ``mdb_stomp.protocol.inbound`` hands MESSAGE frames on itself)
    are read on the loop, so their events are handled at once; stomp.py's heart-beat thread reports
    a timeout from its own thread, which is posted to the loop. Made on the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: WireEvents) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._events = events

    def _post(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback`` now if on the loop's thread, else soon on the loop."""
        if threading.get_ident() == self._loop_thread:
            callback(*args)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)

    def on_connected(self, frame: Any) -> None:
        self._post(self._events.on_connected)

    def on_receipt(self, frame: Any) -> None:
        self._post(self._events.on_receipt, frame.headers.get("receipt-id"))

    def on_error(self, frame: Any) -> None:
        self._post(self._events.on_error, frame.headers, frame.body)

    def on_disconnected(self) -> None:
        self._post(self._events.lose, "the connection to the broker closed")

    def on_heartbeat_timeout(self) -> None:
        self._post(self._events.lose, "no heartbeat from the broker in time")
