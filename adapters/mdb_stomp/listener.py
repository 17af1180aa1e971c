"""``Listener``: stomp.py's callbacks, which run on its threads, handed over to the event loop;
``FrameReader``: the frames stomp.py read, checked before its callbacks see them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import stomp
import stomp.utils

from mdb_stomp.reassembly import CONTENT_LENGTH, HEADERS_END, Joiner


class Events(Protocol):
    """The loop-side handlers of one connection's events (``Wire``)."""

    def on_connected(self) -> None: ...

    def on_message(self, headers: dict[str, str], body: bytes | str | None) -> None: ...

    def on_damaged(self, headers: dict[str, str], body: bytes, why: str) -> None: ...

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

    def on_damaged(self, headers: dict[str, str], body: bytes, why: str) -> None:
        """A MESSAGE frame ``FrameReader`` found damaged."""
        self._post(self._events.on_damaged, headers, body, why)


class FrameReader:
    """Stands in for stomp.py's ``Transport.process_frame`` (called on its receiver thread with
    each frame read, parsed and raw). MESSAGE frames cut at a NUL byte are joined again
    (``mdb_stomp.reassembly``); one that was cut, or lacks the ``subscription`` header that
    routes it, goes to ``Listener.on_damaged`` instead of stomp.py's listeners (whether one
    without an ``ack`` header is damaged depends on its subscription: ``Wire.on_message``).
    Every other frame goes on to stomp.py's ``process_frame``."""

    def __init__(self, process_frame: Callable[[Any, bytes], None], listener: Listener) -> None:
        self._process_frame = process_frame
        self._listener = listener
        self._joiner = Joiner()

    def __call__(self, frame: Any, raw: bytes) -> None:
        whole = self._joiner.feed(raw)
        if whole is None:
            return
        if not whole.cut:
            if frame.cmd == "MESSAGE" and "subscription" not in frame.headers:
                self._listener.on_damaged(frame.headers, bytes(frame.body or b""),
                                          "a MESSAGE frame without a subscription header")
            else:
                self._process_frame(frame, raw)
            return
        joined = stomp.utils.parse_frame(whole.raw)
        why = ("a MESSAGE frame cut at a NUL byte in a header" if whole.complete
               else "a MESSAGE frame cut at a NUL byte, never completed")
        self._listener.on_damaged(joined.headers, body_of(whole.raw), why)


def body_of(raw: bytes) -> bytes:
    """The body of a joined frame: what follows its headers, cut at its content-length."""
    end = HEADERS_END.search(raw)
    if end is None:
        return b""
    body = raw[end.end():]
    length = CONTENT_LENGTH.search(raw, 0, end.start())
    return body[: int(length.group(1))] if length else body
