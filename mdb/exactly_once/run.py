"""The run of an exactly-once listener's delivery (``mdb.delivery.runs``): the handler's
database writes, its sends (to the outbox) and the message's inbox row commit in one database
transaction (``Guard``); the sends are dispatched; then a plain ack settles the delivery.

A database out of reach holds the delivery (docs/exactly-once.md, "A bad day of the
database"): sent back, it would come back flagged, each time one more of its deliveries, and
an outage longer than its redeliveries would move it to the error destination.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar

from sqlalchemy.ext.asyncio import AsyncSession

from mdb.broker import Connection, Delivery
from mdb.context import SendFunction
from mdb.delivery.batch import BatchFailure, Ready
from mdb.delivery.decision import ALREADY_PROCESSED, SUCCEEDED, Raised, Reused
from mdb.delivery.invoker import Invoker
from mdb.delivery.runs import Ran
from mdb.delivery.sends import TransactedSends
from mdb.errors import DatabaseUnavailable, DispatchPending, IdentityReused
from mdb.exactly_once.guard import Guard
from mdb.identity import identity
from mdb.message import Message


class ExactlyOnce:
    """Runs through ``guard``; ``stopping()`` says the container is stopping (a delivery is
    then not held for the database)."""

    batches: ClassVar[bool] = True

    def __init__(self, invoker: Invoker, guard: Guard, stopping: Callable[[], bool]) -> None:
        self._invoker = invoker
        self._guard = guard
        self._stopping = stopping

    async def __call__(self, delivery: Delivery, message: Message, body: object,
                       connection: Connection) -> tuple[Ran, TransactedSends | None]:
        """Settled by a plain ack once its sends were dispatched. When the database is out of
        reach the delivery is held until it answers, and run once more, flagged redelivered
        (the first run may have had effects outside the database); ``DispatchPending``, and
        ``DatabaseUnavailable`` at a stop or in that second run, leave it unsettled."""
        by_content = identity(delivery).by_content
        try:
            return await self._run(message, body, by_content), None
        except DatabaseUnavailable:
            if self._stopping():
                raise
        # Held once only: a run that fails again once the database answered others (a
        # statement of its own that always takes longer than ``timeout``) is sent back, so
        # that its redeliveries bound it. A commit in doubt is found out by the claim of the
        # next run.
        await self._guard.database.reachable()
        again = dataclasses.replace(message, redelivered=True)
        return await self._run(again, body, by_content), None

    async def in_one_transaction(self, run: Sequence[Ready]) -> Sequence[Ran] | BatchFailure:
        """``run`` in one database transaction (``Guard.run_all``; ``OwnTransaction``). When
        the database is out of reach the batch is held until it answers (at a stop,
        ``DatabaseUnavailable`` leaves it unsettled), and then run one message at a time,
        as after a failure: ``BatchFailure`` at its end. ``DispatchPending`` leaves the batch
        unsettled. A stop does not cut a batch short (its claims commit together: a message
        left out of the run would be taken for processed)."""
        failed: list[BatchFailure] = []

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
            ran = await self._guard.run_all(
                [(item.message, identity(item.delivery).by_content) for item in run], handler)
        except DatabaseUnavailable as exc:
            if self._stopping():
                raise
            await self._guard.database.reachable()
            return BatchFailure(len(run), Raised.of(exc))
        except DispatchPending:
            raise
        except Exception as exc:  # the handler's, or its statements' at the commit
            return failed[0] if failed else BatchFailure(len(run), Raised.of(exc))
        return [Reused(str(done)) if isinstance(done, IdentityReused)
                else SUCCEEDED if done else ALREADY_PROCESSED for done in ran]

    async def _run(self, message: Message, body: object, by_content: bool) -> Ran:
        async def handler(session: AsyncSession, send: SendFunction) -> None:
            await self._invoker.invoke(message, body, send, session)

        try:
            ran = await self._guard.run(message, handler, by_content=by_content)
        except (DatabaseUnavailable, DispatchPending):
            raise
        except IdentityReused as exc:
            return Reused(str(exc))
        except Exception as exc:  # user code, its database writes included
            return Raised.of(exc)
        return SUCCEEDED if ran else ALREADY_PROCESSED
