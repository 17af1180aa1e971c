"""Receipts: the answers to frames written with a ``receipt`` header, and how a missing one
is reported.

SUBSCRIBE, COMMIT, a non-transacted SEND, a NACK and the UNSUBSCRIBEs that close or delete a
subscription carry a receipt and wait for it at most ``ConnectionOptions.receipt_timeout``
(``Wire.request``). The answer is a RECEIPT frame naming it; an ERROR frame naming it
refuses the request; a lost connection fails every receipt still awaited. Any of those but the
RECEIPT raises ``Unanswered``, which never leaves this package: each kind of request states
once, in a ``ReceiptErrors``, which ``mdb.errors`` exception each outcome becomes.
"""

from __future__ import annotations

import asyncio
from typing import Literal, NamedTuple

from mdb.errors import BrokerError, ConnectionLost

Why = Literal["refused", "lost", "timeout"]


class Request(NamedTuple):
    """A frame that asked for a receipt: its name (``COMMIT``), the broker's address and how
    long the answer is waited for, as messages about it say. (Named tuples, this and
    ``ReceiptErrors``: one or two of each per SEND and COMMIT, and a frozen dataclass costs a
    call per field to make.)"""

    frame: str
    address: str
    timeout: float


class Unanswered(Exception):
    """``request`` was not confirmed: ``why`` says how, ``detail`` what happened (the ERROR
    frame's message, or the reason the connection went; empty for a timeout)."""

    def __init__(self, why: Why, request: Request, detail: str = "") -> None:
        super().__init__(detail)
        self.why: Why = why
        self.request = request
        self.detail = detail


class ReceiptErrors(NamedTuple):
    """How one kind of request reports an unconfirmed outcome, as ``mdb.errors``.

    ``subject`` (what the request was about) begins every message; ``refused``, ``unconfirmed``
    (no answer in time) and ``lost`` (the connection went first) are the exception types; the
    ``consequence``, what the caller may assume, ends the messages of the last two.
    """

    subject: str
    refused: type[BrokerError]
    unconfirmed: type[BrokerError]
    lost: type[BrokerError] = ConnectionLost
    consequence: str = ""

    def error(self, unanswered: Unanswered) -> BrokerError:
        """The ``mdb.errors`` exception that reports ``unanswered``."""
        request = unanswered.request
        if unanswered.why == "refused":
            return self.refused(
                f"{self.subject}: the broker refused the {request.frame}: {unanswered.detail}"
            )
        tail = f"; {self.consequence}" if self.consequence else ""
        if unanswered.why == "lost":
            return self.lost(
                f"{self.subject}: {unanswered.detail} before the {request.frame} receipt from "
                f"{request.address}{tail}"
            )
        return self.unconfirmed(
            f"{self.subject}: no receipt for {request.frame} from {request.address} within "
            f"{request.timeout}s{tail}"
        )


class Receipts:
    """The receipts awaited on one connection; event-loop thread only.

    One timer for them all, not one per receipt: it fires at the earliest deadline, fails
    what is overdue and is set again for the next. Receipts come in milliseconds and time
    out in seconds, so it fires about once per timeout, where a timer per receipt was armed
    and cancelled in the event loop's heap for each SEND and COMMIT (docs/performance.md)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._awaited: dict[str, tuple[Request, asyncio.Future[None], float]] = {}
        self._timer: asyncio.TimerHandle | None = None

    async def wait(self, receipt: str, request: Request) -> None:
        """Wait for the answer to receipt ``receipt``; ``Unanswered`` when it is refused, the
        connection is lost or ``request.timeout`` seconds pass first."""
        answered: asyncio.Future[None] = self._loop.create_future()
        deadline = self._loop.time() + request.timeout
        self._awaited[receipt] = (request, answered, deadline)
        timer = self._timer
        if timer is None or deadline < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._time_out)
        try:
            await answered
        finally:
            self._awaited.pop(receipt, None)

    def awaits(self, frame: str) -> bool:
        """Whether the receipt of a ``frame`` frame (``SUBSCRIBE``) is awaited."""
        return any(request.frame == frame for request, _, _ in self._awaited.values())

    def answer(self, receipt: str | None) -> bool:
        """A RECEIPT frame named ``receipt``; False when nobody awaits that receipt."""
        awaited = self._awaited.get(receipt or "")
        if awaited is None:
            return False
        if not awaited[1].done():
            awaited[1].set_result(None)
        return True

    def refuse(self, receipt: str, message: str) -> bool:
        """An ERROR frame named ``receipt``; False when nobody awaits that receipt."""
        awaited = self._awaited.get(receipt)
        if awaited is None:
            return False
        request, answered, _ = awaited
        if not answered.done():
            answered.set_exception(Unanswered("refused", request, message))
        return True

    def fail_all(self, reason: str) -> None:
        """The connection was lost: every awaited receipt fails with ``reason``."""
        for request, answered, _ in self._awaited.values():
            if not answered.done():
                answered.set_exception(Unanswered("lost", request, reason))
        self._awaited.clear()

    def _time_out(self) -> None:
        """Fail the receipts whose deadline passed; set the timer for the next deadline."""
        self._timer = None
        now, earliest = self._loop.time(), None
        for request, answered, deadline in self._awaited.values():
            if answered.done():
                continue
            if deadline <= now:
                answered.set_exception(Unanswered("timeout", request))
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._timer = self._loop.call_at(earliest, self._time_out)
