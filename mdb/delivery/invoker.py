"""Running one listener's handler on one message: its arguments, its thread, its span."""

from __future__ import annotations

import inspect
import math
import time
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread

from mdb.delivery.timeouts import HandlerThreads, cancelled_past
from mdb.errors import HandlerInterrupted, ListenerDefinitionError, error_type
from mdb.listeners.context import Context, SendFunction
from mdb.listeners.listener import ListenerSpec
from mdb.messages import codec
from mdb.messages.message import Message
from mdb.observability import telemetry
from mdb.observability.telemetry import Stats
from mdb.routing.planning import PlannedSubscription
from mdb.seam.broker import Delivery, HeaderLimits


class Invoker:
    """Calls ``spec``'s handler for deliveries of the subscription ``planned``: an ``async def``
    one on the event loop, a plain one on a worker thread of ``threads``; either within the
    listener's ``handler_timeout`` (``mdb.delivery.timeouts``). The handler's sends keep to
    ``limits``."""

    def __init__(self, spec: ListenerSpec, planned: PlannedSubscription, system: str,
                 stats: Stats, threads: HandlerThreads, limits: HeaderLimits) -> None:
        self._spec = spec
        self._limits = limits
        self._stats = stats
        self._threads = threads
        self._is_async = spec.is_async  # asked once: inspect's answer costs several calls
        self._telemetry = telemetry.Consumer(system, spec.destination, planned.request.name,
                                             planned.shared)
        self._subscription = planned.logical_name
        self.decode = codec.decoder_for(spec.body_type)
        """The body as the handler's annotation asks; raises ``DecodeError``."""

    def handling(self, delivery: Delivery, message: Message) -> Handling:
        """While a message is being handled: counted in flight and inside its ``process`` span
        (``mdb.observability.telemetry``), which entering returns to report the outcome on."""
        return Handling(self._stats, self._telemetry.processing(
            delivery.headers, message.id, message.body, message.delivery_count,
            message.redelivered))

    async def invoke(self, message: Message, body: Any, send: SendFunction,
                     session: object = None) -> None:
        """Call the handler with ``body``, a ``Context`` whose sends go to ``send`` and, for
        an exactly-once listener, the ``session`` of its database transaction; what
        it raises is raised, a ``BaseException`` other than the container's cancellation as
        ``HandlerInterrupted``: it fails this delivery, never the container."""
        spec = self._spec
        kwargs: dict[str, Any] = {}
        if spec.body_parameter:
            kwargs[spec.body_parameter] = body
        if spec.context_parameter:
            kwargs[spec.context_parameter] = Context(message, spec.name, send,
                                                     self._subscription, self._limits)
        if spec.session_parameter:
            kwargs[spec.session_parameter] = session
        started = time.perf_counter()  # the handler's own time, whatever becomes of the message
        try:
            if self._is_async:  # on the event loop: one coroutine less per message than a helper
                timeout = spec.options.handler_timeout
                if timeout:
                    await cancelled_past(timeout, spec.handler(**kwargs))
                else:
                    await spec.handler(**kwargs)
            else:
                await self._in_thread(message, kwargs)
        except Exception:
            raise
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()) and _cancelled():
                raise
            said = codec.describe(exc)
            raise HandlerInterrupted(f"the handler raised {error_type(exc)}"
                                     f"{f' ({said})' if said else ''}, not a stop of the "
                                     "container: it fails this delivery") from exc
        finally:
            self._stats.latencies.record(time.perf_counter() - started)

    async def _in_thread(self, message: Message, kwargs: dict[str, Any]) -> None:
        spec = self._spec
        result = await self._threads.run(partial(spec.handler, **kwargs), message.id,
                                         spec.options.handler_timeout)
        if inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
            # A plain def that hands back work instead of doing it (a sync decorator around an
            # async def, say): settling the message as processed would lose it unprocessed.
            if inspect.iscoroutine(result) or inspect.isgenerator(result):
                result.close()
            raise ListenerDefinitionError(
                f"listener {spec.name!r}: the handler returned {type(result).__name__} "
                "instead of running: the work it stands for never ran. Decorate a function "
                "that does the work (an async def wrapped by a plain decorator looks like a "
                "def to mdb: make the wrapper async too)")


def _cancelled() -> bool:
    """Whether a scope around the current task was cancelled: the container is stopping its
    handlers (or a timeout around them ran out). A ``CancelledError`` the handler raises
    otherwise is its own (an awaited task was cancelled)."""
    return anyio.current_effective_deadline() == -math.inf


class Handling:
    """``Invoker.handling``: a message counted in ``Stats.in_flight`` while inside its span.
    A class rather than a generator-based context manager: it wraps every message, and
    ``contextlib``'s machinery costs more than the counting."""

    __slots__ = ("_span", "_stats")

    def __init__(self, stats: Stats, span: telemetry.Processing) -> None:
        self._stats = stats
        self._span = span

    def __enter__(self) -> telemetry.Processing:
        outcome = self._span.__enter__()
        self._stats.in_flight += 1
        return outcome

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> bool | None:
        self._stats.in_flight -= 1
        return self._span.__exit__(exc_type, exc, traceback)
