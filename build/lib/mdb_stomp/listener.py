"""``Listener``: stomp.py's callbacks, handed to the event loop's handlers; ``FrameReader``: the
frames read from the broker, checked before stomp.py's callbacks see them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import stomp
import stomp.utils

from mdb_stomp.heartbeats import Heartbeats, Silence
from mdb_stomp.reassembly import CONTENT_LENGTH, HEADERS_END, Joiner


class Events(Protocol):
    """The loop-side handlers of one connection's events (``Wire``)."""

    def on_connected(self) -> None: ...

    def on_message(self, headers: dict[str, str], body: bytes | str | None) -> None: ...

    def on_damaged(self, headers: dict[str, str], body: bytes, why: str) -> None: ...

    def on_receipt(self, receipt: str | None) -> None: ...

    def on_error(self, headers: Mapping[str, str], body: bytes | str | None) -> None: ...

    def on_silence(self, silence: float, limit: float) -> None: ...

    def lose(self, reason: str) -> None: ...


class Listener(stomp.ConnectionListener):  # type: ignore[misc]
    """Forwards every stomp.py event to the loop's handlers, touches nothing else. Frames are
    read on the loop (``mdb_stomp.reading``), so their events are handled at once; stomp.py's
    heart-beat thread reports a timeout from its own thread, which is posted to the loop. Made
    on the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: Events) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._events = events

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback`` now if on the loop's thread, else soon on the loop."""
        if threading.get_ident() == self._loop_thread:
            callback(*args)
            return
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

    def on_silence(self, silence: float, limit: float) -> None:
        """``FrameReader`` read something after ``silence`` seconds, longer than ``limit``."""
        self._post(self._events.on_silence, silence, limit)


class FrameReader:
    """Stands in for stomp.py's ``Transport.process_frame``: called on the loop with each frame
    read, parsed and raw (``mdb_stomp.reading``), and told of every read (``heard``).

    Every read is timed (``heartbeats.Silence``, with the limit the CONNECTED frame's
    ``heart-beat`` header sets through ``heartbeats``): from the first read after too long a
    silence on, no frame goes further, and ``Listener.on_silence`` says so once - what arrives
    then may be what the broker wrote before it dropped the connection and handed the messages
    to another consumer.

    MESSAGE frames cut at a NUL byte are joined again (``mdb_stomp.reassembly``); one that was
    cut, or lacks the ``subscription`` header that routes it, goes to ``Listener.on_damaged``
    instead of stomp.py's listeners (whether one without an ``ack`` header is damaged depends
    on its subscription: ``Wire.on_message``). A whole MESSAGE frame goes straight to
    ``Listener.on_message``: stomp.py's dispatch would only add its locks and its own listener,
    whose one use of a MESSAGE, keeping its heart-beat timeout away, ``heard`` does for every
    read (``heard_by``: the stomp.py connection's ``on_heartbeat``). Every other frame goes on
    to stomp.py's ``process_frame``."""

    def __init__(self, process_frame: Callable[[Any, bytes], None], listener: Listener,
                 heartbeats: Heartbeats, heard_by: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._process_frame = process_frame
        self._heard_by = heard_by
        self._clock = clock
        self._listener = listener
        self._heartbeats = heartbeats
        self._silence = Silence()
        self._told = False  # on_silence was called
        self._joiner = Joiner()

    def heard(self) -> None:
        """Bytes were read from the socket just now."""
        self._silence.heard(self._clock())
        self._heard_by()

    def __call__(self, frame: Any, raw: bytes) -> None:
        if self._silence.broken is not None:
            if not self._told:
                self._told = True
                self._listener.on_silence(*self._silence.broken)
            return
        if frame.cmd == "CONNECTED":
            self._silence.limit = self._heartbeats.silence_limit(frame.headers.get("heart-beat"))
        whole = self._joiner.feed(raw)
        if whole is None:
            return
        if not whole.cut:
            if frame.cmd != "MESSAGE":
                self._process_frame(frame, raw)
            elif "subscription" in frame.headers:
                self._listener.on_message(frame)
            else:
                self._listener.on_damaged(frame.headers, bytes(frame.body or b""),
                                          "a MESSAGE frame without a subscription header")
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
