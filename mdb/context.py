"""``Context``: what a handler may know and do about the delivery it is processing."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import Any

import anyio.from_thread

from mdb.destinations import Destination
from mdb.message import Message

SendFunction = Callable[
    [Destination, object, Mapping[str, str] | None, str | None], Coroutine[Any, Any, None]
]


class Context:
    """Handed to a handler that declares a parameter annotated ``Context``."""

    def __init__(self, message: Message, listener: str, send: SendFunction) -> None:
        self.message = message
        self.listener = listener
        self._send = send
        self._loop_thread = threading.get_ident()

    @property
    def id(self) -> str:
        return self.message.id

    @property
    def headers(self) -> Mapping[str, str]:
        return self.message.headers

    @property
    def destination(self) -> Destination:
        return self.message.destination

    @property
    def redelivered(self) -> bool:
        """True when this message may have been processed before (the flag of JMS)."""
        return self.message.redelivered

    @property
    def delivery_count(self) -> int:
        """1 on the first delivery, one more on each redelivery."""
        return self.message.delivery_count

    def send(
        self, destination: str | Destination, body: object,
        headers: Mapping[str, str] | None = None, *, key: str | None = None,
    ) -> Awaitable[None]:
        """Send ``body`` as part of this delivery: in a transacted listener it is sent only if
        the handler succeeds, together with the acknowledgement.

        A distributed destination's member is chosen by ``key`` when given (one key, one
        member, so messages with the same key keep their order), else round robin among the
        members on this delivery's broker first. A member on another broker cannot join the
        transaction: such a send is made once the handler returned, just before the commit
        (see docs/distribution.md).

        In an ``async def`` handler, await it. In a plain ``def`` handler the call itself sends
        (blocking until done) and its result need not be awaited.
        """
        dest = Destination.parse(destination)
        if threading.get_ident() != self._loop_thread:
            anyio.from_thread.run(self._send, dest, body, headers, key)
            return _ALREADY_SENT
        return self._send(dest, body, headers, key)


class _AlreadySent:
    """An awaitable that is already done: a plain handler may ignore it without a warning."""

    def __await__(self) -> Generator[Any, Any, None]:
        yield from ()


_ALREADY_SENT = _AlreadySent()
