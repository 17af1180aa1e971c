"""The run of an exactly-once listener's delivery (``mdb.delivery.runs``): the handler's
database writes, its sends (to the outbox) and the message's inbox row commit in one database
transaction (``Guard``); the sends are dispatched; then a plain ack settles the delivery.

A database out of reach holds the delivery (docs/exactly-once.md, "A bad day of the
database"): sent back, it would come back flagged, each time one more of its deliveries, and
an outage longer than its redeliveries would move it to the error destination.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import ClassVar

from sqlalchemy.ext.asyncio import AsyncSession

from mdb.delivery.batch import BatchFailure, Ready
from mdb.delivery.decision import ALREADY_PROCESSED, SUCCEEDED, Raised, Reused
from mdb.delivery.handler_sends import TransactedSends
from mdb.delivery.invoker import Invoker
from mdb.delivery.runs import Ran
from mdb.errors import DatabaseUnavailable, DispatchPending, IdentityReused
from mdb.exactly_once.guard import Guard
from mdb.listeners.context import SendFunction
from mdb.messages.message import Message
from mdb.seam.broker import Connection, Delivery


class ExactlyOnce:
    """Runs through ``guard``; ``stopping()`` says the container is stopping (a delivery is
    then not held for the database)."""

    batches: ClassVar[bool] = True

    def __init__(self, invoker: Invoker, guard: Guard, stopping: Callable[[], bool]) -> None:
        self._invoker = invoker
        self._guard = guard
        self._stopping = stopping
        # Identity -> when it was claimed: the messages of a batch whose commit was in doubt,
        # run again one at a time next (``in_one_transaction``).
        self._in_doubt: dict[str, float] = {}

    async def __call__(self, delivery: Delivery, message: Message, body: object,
                       connection: Connection) -> tuple[Ran, TransactedSends | None]:
        """Settled by a plain ack once its sends were dispatched. When the database is out of
        reach the delivery is held until it answers, and run once more, flagged redelivered
        (the first run may have had effects outside the database); ``DispatchPending``, and
        ``DatabaseUnavailable`` at a stop or in that second run, leave it unsettled. A message
        of a batch whose commit was in doubt runs as such a second run."""
        at = self._in_doubt.pop(message.id, None) or time.time()
        try:
            return await self._run(message, body, at), None
        except DatabaseUnavailable:
            if self._stopping():
                raise
        # Held once only: a run that fails again once the database answered others (a
        # statement of its own that always takes longer than ``timeout``) is sent back, so
        # that its redeliveries bound it. A commit in doubt is found out by the claim of the
        # next run, made as of the first one's time: the row it finds is its own if it holds
        # that time (a copy's or a twin's else).
        await self._guard.database.reachable()
        again = dataclasses.replace(message, redelivered=True)
        return await self._run(again, body, at), None

    async def in_one_transaction(self, run: Sequence[Ready]) -> Sequence[Ran] | BatchFailure:
        """``run`` in one database transaction (``Guard.run_all``; ``OwnTransaction``). When
        the database is out of reach the batch is held until it answers (at a stop,
        ``DatabaseUnavailable`` leaves it unsettled), and then run one message at a time,
        as after a failure: ``BatchFailure`` at its end. ``DispatchPending`` leaves the batch
        unsettled. A stop does not cut a batch short (its claims commit together: a message
        left out of the run would be taken for processed)."""
        failed: list[BatchFailure] = []
        at = time.time()
        self._in_doubt.clear()  # left by a batch whose run one at a time a stop cut short

        async def handler(index: int, session: AsyncSession, send: SendFunction) -> None:
            item = run[index]
            with self._invoker.handling(item.delivery, item.message) as span:
                try:
                    await self._invoker.invoke(item.message, item.body, send, session)
                except Exception as exc:  # user code: the batch failed
                    failure = Raised.of(exc)
                    span.failed(failure.error_type, failure.text, failure.traceback)
                    failed.append(BatchFailure(index, failure))
                    raise

        try:
            ran = await self._guard.run_all([item.message for item in run], handler, at=at)
        except DatabaseUnavailable as exc:
            if self._stopping():
                raise
            await self._guard.database.reachable()
            self._in_doubt = {item.message.id: at for item in run}
            return BatchFailure(len(run), Raised.of(exc))
        except DispatchPending:
            raise
        except Exception as exc:  # the handler's, or its statements' at the commit
            return failed[0] if failed else BatchFailure(len(run), Raised.of(exc))
        return [Reused(str(done)) if isinstance(done, IdentityReused)
                else SUCCEEDED if done else ALREADY_PROCESSED for done in ran]

    async def _run(self, message: Message, body: object, at: float) -> Ran:
        async def handler(session: AsyncSession, send: SendFunction) -> None:
            await self._invoker.invoke(message, body, send, session)

        try:
            ran = await self._guard.run(message, handler, at=at)
        except (DatabaseUnavailable, DispatchPending):
            raise
        except IdentityReused as exc:
            return Reused(str(exc))
        except Exception as exc:  # user code, its database writes included
            return Raised.of(exc)
        return SUCCEEDED if ran else ALREADY_PROCESSED
