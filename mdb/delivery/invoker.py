"""Running one listener's handler on one message: its arguments, its thread, its span."""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread

from mdb import codec, tracing
from mdb.broker import Delivery
from mdb.context import Context, SendFunction
from mdb.delivery.stats import Stats
from mdb.errors import ListenerDefinitionError
from mdb.listener import ListenerSpec
from mdb.message import Message
from mdb.planning import PlannedSubscription


class Invoker:
    """Calls ``spec``'s handler for deliveries of the subscription ``planned``: an ``async def``
    one on the event loop, a plain one on a worker thread of ``threads``."""

    def __init__(self, spec: ListenerSpec, planned: PlannedSubscription, system: str,
                 stats: Stats, threads: anyio.CapacityLimiter) -> None:
        self._spec = spec
        self._stats = stats
        self._threads = threads
        self._is_async = spec.is_async  # asked once: inspect's answer costs several calls
        self._telemetry = tracing.Consumer(spec.name, system, spec.destination,
                                           planned.request.name, planned.shared)
        self._subscription = planned.name
        self.decode = codec.decoder_for(spec.body_type)
        """The body as the handler's annotation asks; raises ``DecodeError``."""

    def handling(self, delivery: Delivery, message: Message) -> Handling:
        """While a message is being handled: counted in flight and inside its ``process`` span
        (``mdb.tracing``), which entering returns to report the outcome on."""
        return Handling(self._stats, self._telemetry.processing(
            delivery.headers, message.id, message.body, message.delivery_count,
            message.redelivered))

    async def invoke(self, message: Message, body: Any, send: SendFunction) -> None:
        """Call the handler with ``body`` and a ``Context`` whose sends go to ``send``; what
        it raises is raised."""
        spec = self._spec
        kwargs: dict[str, Any] = {}
        if spec.body_parameter:
            kwargs[spec.body_parameter] = body
        if spec.context_parameter:
            kwargs[spec.context_parameter] = Context(message, spec.name, send,
                                                     self._subscription)
        if self._is_async:
            await spec.handler(**kwargs)
            return
        result = await anyio.to_thread.run_sync(
            partial(spec.handler, **kwargs), limiter=self._threads, abandon_on_cancel=True
        )
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


class Handling:
    """``Invoker.handling``: a message counted in ``Stats.in_flight`` while inside its span.
    A class rather than a generator-based context manager: it wraps every message, and
    ``contextlib``'s machinery costs more than the counting."""

    __slots__ = ("_span", "_stats")

    def __init__(self, stats: Stats, span: AbstractContextManager[tracing.Processing]) -> None:
        self._stats = stats
        self._span = span

    def __enter__(self) -> tracing.Processing:
        outcome = self._span.__enter__()
        self._stats.in_flight += 1
        return outcome

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> bool | None:
        self._stats.in_flight -= 1
        return self._span.__exit__(exc_type, exc, traceback)
