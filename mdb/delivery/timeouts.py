"""Handler timeouts (the listener option ``handler_timeout``, docs/concepts.md#handler-timeouts)
and the worker threads of plain ``def`` handlers, which a timeout cannot stop.

Past its timeout an ``async def`` handler is cancelled (``cancelled_past``). A plain ``def``
runs on a worker thread, which nothing can stop: past its timeout it is reported once, at
WARNING, and counted stuck (``HandlerThreads.stuck``, which the health endpoint shows) until it
returns. Either way the delivery fails with ``HandlerTimeout`` once the handler is done, as
WebLogic's transaction timeout marks the transaction rollback-only. The timeout is measured on
the event loop's own clock, not ``mdb.clock``: a test's clock that jumps ahead must not time
out a handler that is merely waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import anyio.to_thread

from mdb.errors import HandlerTimeout

log = logging.getLogger("mdb.delivery")

T = TypeVar("T")


async def cancelled_past(timeout: float, handler: Awaitable[None]) -> None:
    """Await ``handler``, cancelling it once ``timeout`` seconds passed; then raise
    ``HandlerTimeout`` whatever it did after (returned, or raised once cancelled). The
    container's own cancellation (a stop) is not caught: it comes from an outer scope."""
    with anyio.move_on_after(timeout) as limit:
        try:
            await handler
        except Exception:
            if not limit.cancel_called:
                raise
    if limit.cancel_called:
        raise HandlerTimeout(f"the handler ran past its handler_timeout of {timeout:g} s and "
                             "was cancelled")


@dataclass(eq=False)
class HandlerCall:
    """A plain ``def`` handler running on a worker thread, on message ``message_id``, since
    ``started`` (``time.monotonic()``); ``stuck`` once past its timeout."""

    message_id: str
    started: float = field(default_factory=time.monotonic)
    stuck: bool = False


class HandlerThreads:
    """The worker threads of listener ``listener``'s plain ``def`` handlers: at most ``limit``
    at once (one per pool slot), and those running now. A call stays ``running`` until its
    handler returns, even once the container gave up waiting for it (a stop cancels the wait,
    not the thread)."""

    def __init__(self, listener: str, limit: int) -> None:
        self.listener = listener
        self._limiter = anyio.CapacityLimiter(limit)
        self._running: set[HandlerCall] = set()
        self._lock = threading.Lock()  # the set changes on worker threads; health reads it

    def running(self) -> list[HandlerCall]:
        with self._lock:
            return list(self._running)

    def stuck(self) -> list[HandlerCall]:
        """The calls running past their timeout."""
        return [call for call in self.running() if call.stuck]

    async def run(self, handler: Callable[[], T], message_id: str, timeout: float) -> T:
        """``handler()`` on a worker thread, for message ``message_id``; past ``timeout``
        seconds (0: none) reported, counted stuck, and, once it returns, ``HandlerTimeout``.
        Cancelling the caller abandons the thread."""
        call = HandlerCall(message_id)

        def on_thread() -> T:
            try:
                return handler()
            finally:
                with self._lock:
                    self._running.discard(call)

        with self._lock:
            self._running.add(call)
        if not timeout:
            return await anyio.to_thread.run_sync(on_thread, limiter=self._limiter,
                                                  abandon_on_cancel=True)
        failed: Exception | None = None
        async with anyio.create_task_group() as watch:
            watch.start_soon(self._watch, call, timeout)
            try:
                result = await anyio.to_thread.run_sync(on_thread, limiter=self._limiter,
                                                        abandon_on_cancel=True)
            except Exception as exc:  # the handler's: raised below, unwrapped by the group
                failed = exc
            watch.cancel_scope.cancel()
        if call.stuck:
            raise HandlerTimeout(
                f"the handler ran {time.monotonic() - call.started:.1f} s, past its "
                f"handler_timeout of {timeout:g} s; a plain def cannot be cancelled, so it "
                "was let finish")
        if failed is not None:
            raise failed
        return result

    async def _watch(self, call: HandlerCall, timeout: float) -> None:
        await anyio.sleep(timeout)
        call.stuck = True
        log.warning("listener %s: the handler has run past its handler_timeout of %g s on "
                    "message %s; a plain def cannot be cancelled: its pool slot is stuck until "
                    "it returns", self.listener, timeout, call.message_id)
