"""Batches: several deliveries of one subscription in one transaction, and the fall-back.

Batches (``max_messages_per_transaction`` > 1). A slot hands over what its subscription already
holds, in dispatch order. Consecutive deliveries that can go to the handler together (fresh and
never struck, ``mdb.delivery.decision.classify``, decoded, and each of an identity the run does
not hold yet: the others are processed on their own, in their turn, a copy thus after the
transaction that may have processed it) run in one
transaction: the handler is invoked once per message, in order, its sends join the
transaction, and only once every invocation succeeded are the deliveries acked in it, in
order, and committed. So a transaction that is aborted holds no ack, and after an abort every
delivery of the batch is simply unsettled, which matters on ActiveMQ where client acks are
cumulative and an aborted ack stays with the live subscription. After a handler raised, the
batch is processed again one message at a time, in order: the messages before the failing one
run again flagged redelivered with a delivery count one higher (their first run was rolled
back, but the handler may have had effects of its own), the failing one takes the failure path
with its own count, and those after it run as fresh deliveries. Each is settled before the
next, so every ack settles the oldest unsettled delivery of the subscription and nothing else.

``ready_run`` and ``fall_back`` are pure; ``invoke_in_one_transaction`` runs the handler in the
transaction, which the processor settles as it settles a single delivery. An exactly-once
listener's batch commits in its database's transaction instead
(``mdb.delivery.runs.OwnTransaction``), the same way: the handler once per message in order,
all or nothing, the same fall-back; then each delivery is settled by a plain ack, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mdb.delivery.decision import FRESH, AlreadyProcessed, Kind, Raised, Reused
from mdb.delivery.handler_sends import TransactedSends
from mdb.delivery.invoker import Invoker
from mdb.errors import ConnectionLost, DecodeError
from mdb.messages.message import Message
from mdb.seam.broker import Connection, Delivery


@dataclass(frozen=True, slots=True)
class Ready:
    """A delivery of a batch that can go to the handler: fresh, never struck, its body
    decoded."""

    delivery: Delivery
    message: Message
    body: Any


@dataclass(frozen=True, slots=True)
class BatchFailure:
    """The handler raised on ``run[at]`` (or, with ``at == len(run)``, a held send failed)."""

    at: int
    failure: Raised


@dataclass(frozen=True, slots=True)
class Step:
    """One delivery to process: ``message`` as the handler sees it this time, and ``kind``,
    what it is (``classify``), or what a batch already made of it: the failure the handler
    raised on it, or, in a batch with a transaction of its own, a copy already processed or a
    reused identity."""

    delivery: Delivery
    message: Message
    kind: Kind | Raised | AlreadyProcessed | Reused


def ready_run(steps: Sequence[Step], decode: Callable[[bytes], Any]) -> list[Ready]:
    """The leading ``steps`` that can go to the handler together, decoded: the first that is
    not fresh, was struck, does not decode or has the identity of one before it ends the run
    (it is processed on its own)."""
    run: list[Ready] = []
    identities: set[str] = set()
    for step in steps:
        if step.kind != FRESH or step.message.id in identities:
            break
        identities.add(step.message.id)
        try:
            body = decode(step.message.body)
        except DecodeError:
            break
        run.append(Ready(step.delivery, step.message, body))
    return run


def fall_back(run: Sequence[Ready], failed: BatchFailure) -> list[Step]:
    """``run`` again one message at a time after ``failed`` (see the module docstring): those
    before the failing one flagged redelivered with the count one higher, the failing one with
    its failure, those after it as they came."""
    steps = []
    for index, item in enumerate(run):
        if index < failed.at:
            again = replace(item.message, redelivered=True,
                            delivery_count=item.message.delivery_count + 1)
            steps.append(Step(item.delivery, again, FRESH))
        elif index == failed.at:
            steps.append(Step(item.delivery, item.message, failed.failure))
        else:
            steps.append(Step(item.delivery, item.message, FRESH))
    return steps


async def invoke_in_one_transaction(
    run: Sequence[Ready], connection: Connection, sends: TransactedSends, invoker: Invoker,
    stopping: Callable[[], bool],
) -> Sequence[Ready] | BatchFailure:
    """Invoke the handler on each of ``run`` with ``sends``, in one transaction: return those
    invoked, for the processor to settle in ``sends``; once ``stopping()`` is true no further
    message goes to the handler, and those not invoked stay unsettled. When an invocation
    raised, or a held send failed, abort and return where and why: nothing of the run is
    settled. Raises ``BrokerError`` when a held send failed, ``ConnectionLost`` when the
    connection was lost by the time of the failure (nothing of the run can be settled any
    more)."""
    done = 0
    failure: Raised | None = None
    try:
        for item in run:
            if done and stopping():
                break
            with invoker.handling(item.delivery, item.message) as span:
                try:
                    await invoker.invoke(item.message, item.body, sends.send)
                except Exception as exc:  # user code: the batch failed
                    failure = Raised.of(exc)
                    span.failed(failure.error_type, failure.text, failure.traceback)
            if failure is not None:
                break
            done += 1
        if failure is None:
            not_sent = await sends.flushed()
            failure = None if not_sent is None else Raised.of(not_sent)
    except BaseException:
        await sends.abort_shielded()
        raise
    if failure is None:
        return run[:done]
    await sends.abort()
    if not connection.is_open:
        # The broker redelivers the whole batch.
        raise ConnectionLost(f"the connection was lost during the batch ({failure.text})")
    return BatchFailure(done, failure)
