"""Running one listener's handler on one message: its arguments, its thread, its span."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
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
        self._planned = planned
        self._system = system
        self._stats = stats
        self._threads = threads
        self.decode = codec.decoder_for(spec.body_type)
        """The body as the handler's annotation asks; raises ``DecodeError``."""

    @contextmanager
    def handling(self, delivery: Delivery, message: Message) -> Iterator[tracing.Processing]:
        """While a message is being handled: counted in flight and in the pool usage metric,
        inside its ``process`` span (``mdb.tracing``), which is yielded to report the outcome
        on."""
        spec, planned = self._spec, self._planned
        self._stats.in_flight += 1
        tracing.pool_usage(spec.name, 1)
        try:
            with tracing.processing(
                    self._system, spec.destination, planned.request.name, planned.shared,
                    delivery.headers, message.id, message.body, message.delivery_count,
                    message.redelivered) as span:
                yield span
        finally:
            self._stats.in_flight -= 1
            tracing.pool_usage(spec.name, -1)

    async def invoke(self, message: Message, body: Any, send: SendFunction) -> None:
        """Call the handler with ``body`` and a ``Context`` whose sends go to ``send``; what
        it raises is raised."""
        spec = self._spec
        kwargs: dict[str, Any] = {}
        if spec.body_parameter:
            kwargs[spec.body_parameter] = body
        if spec.context_parameter:
            kwargs[spec.context_parameter] = Context(message, spec.name, send)
        if spec.is_async:
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
