"""Processing the deliveries of one subscription: classify each, run the handler on the fresh
ones, and carry out what ``mdb.delivery.decision`` decides, in one place (``_carry_out``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from mdb import clock
from mdb.delivery.batch import (
    BatchFailure,
    Ready,
    Step,
    fall_back,
    invoke_in_one_transaction,
    ready_run,
)
from mdb.delivery.decision import (
    SETTLE,
    AckLost,
    AlreadyProcessed,
    DeadLetter,
    Failure,
    Filter,
    Fresh,
    Happened,
    Keep,
    MoveToError,
    NotSelected,
    Outcome,
    Policy,
    Raised,
    Redeliver,
    Reused,
    Settle,
    Succeeded,
    Undecodable,
    Unreadable,
    classify,
    decide,
)
from mdb.delivery.handler_sends import TransactedSends, commit
from mdb.delivery.invoker import Invoker
from mdb.delivery.runs import OwnTransaction, Run, Transacted
from mdb.delivery.strikes import Strikes
from mdb.errors import (
    BrokerError,
    DatabaseUnavailable,
    DecodeError,
    DispatchPending,
    MdbError,
)
from mdb.listeners.listener import ListenerSpec
from mdb.messages.copies import failed_now
from mdb.messages.destinations import Destination
from mdb.messages.identity import identity, to_message
from mdb.messages.message import Message, OutgoingMessage
from mdb.observability import logs, telemetry
from mdb.observability.telemetry import Stats, names
from mdb.routing.planning import PlannedSubscription
from mdb.routing.producer import Producer
from mdb.seam.broker import Capabilities, Connection, Delivery, Subscription

log = logging.getLogger("mdb.delivery")


class Processor:
    """Runs one listener's handler on the deliveries of one planned subscription and settles
    them as the delivery contract says (docs/architecture.md, "Delivery contract"). Made once
    per pool slot; the connection and the subscription, which change at every reconnect, come
    with the deliveries. ``stopping()`` says when no further message may go to the handler.
    ``capabilities`` are the broker's, as known before connecting. ``stats`` and ``strikes``
    are the listener's, shared by its slots. ``run`` is how a fresh delivery runs
    (``mdb.delivery.runs``: the listener's guarantee), through ``invoker``."""

    def __init__(
        self, spec: ListenerSpec, planned: PlannedSubscription, system: str,
        capabilities: Capabilities, producer: Producer, stats: Stats, strikes: Strikes,
        invoker: Invoker, run: Run, stopping: Callable[[], bool],
    ) -> None:
        self._spec = spec
        self._system = system
        self._dead_letters = capabilities.dead_letters
        self._assigned_ids = capabilities.assigned_ids
        self._selector = planned.selector
        self._producer = producer
        self._stats = stats
        self._strikes = strikes
        self._stopping = stopping
        self._invoker = invoker
        self._guarantee = run
        self._policy: Policy | None = None
        self._policy_of: Subscription | None = None

    async def process_batch(self, connection: Connection, subscription: Subscription,
                            deliveries: Sequence[Delivery]) -> bool:
        """Process and settle ``deliveries``, received in this order from ``subscription`` on
        ``connection``, in as few transactions as ``mdb.delivery.batch`` allows. Return False
        as soon as one could not be settled (a broker error): it and the later ones stay
        unsettled, and the broker redelivers them, flagged: once the subscription is closed,
        or on its own when the connection was lost (perhaps already, elsewhere). Once
        ``stopping()`` is true no further message goes to the handler; the unprocessed ones stay
        unsettled too. Raises only BaseExceptions such as cancellation."""
        if len(deliveries) == 1:  # the usual case
            return await self._process(connection, subscription, self._step(deliveries[0]))
        steps = [self._step(d) for d in deliveries]
        if not self._guarantee.batches:
            return await self._one_at_a_time(connection, subscription, steps)
        start = 0
        while start < len(steps):
            if start and self._stopping():
                return True
            run = ready_run(steps[start:], self._invoker.decode)
            if len(run) < 2:
                if not await self._process(connection, subscription, steps[start]):
                    return False
                start += 1
            else:
                # A run cut short by stopping leaves its tail unsettled; the check above
                # then ends the loop.
                if not await self._batch(connection, subscription, run):
                    return False
                start += len(run)
        return True

    def _step(self, delivery: Delivery) -> Step:
        """``delivery`` as the handler would see it, classified once."""
        known = identity(delivery, self._producer.brokers.seal, assigned=self._assigned_ids)
        message = to_message(delivery, self._spec.destination, known)
        selected = self._selector is None or self._selector(delivery.headers)
        history = self._strikes.history_of(delivery, message)
        kind = classify(delivery, selected=selected, strikes=history.strikes,
                        copied=history.copied, seen=history.seen,
                        dead_letters=self._dead_letters)
        if isinstance(kind, Fresh):
            self._strikes.handing(message)
        return Step(delivery, message, kind)

    async def _one_at_a_time(self, connection: Connection, subscription: Subscription,
                             steps: Iterable[Step]) -> bool:
        for index, step in enumerate(steps):
            if index and self._stopping():
                return True
            if not await self._process(connection, subscription, step):
                return False
        return True

    async def _batch(self, connection: Connection, subscription: Subscription,
                     run: list[Ready]) -> bool:
        """One transaction for ``run`` (two or more): the broker's, or the run's own
        (``OwnTransaction``); after a handler failure, the run again one message at a
        time."""
        guarantee = self._guarantee
        if isinstance(guarantee, OwnTransaction):
            return await self._batch_apart(connection, subscription, guarantee, run)
        assert isinstance(guarantee, Transacted)
        sends = guarantee.sends(connection)
        try:
            done = await invoke_in_one_transaction(run, connection, sends, self._invoker,
                                                   self._stopping)
            if not isinstance(done, BatchFailure):
                await self._settle([item.delivery for item in done], sends)
                for item in done:
                    self._strikes.settled(item.message, SETTLE)
                return True
        except BrokerError as exc:
            return self._not_settled(f"a batch of {len(run)} from message {run[0].message.id}",
                                     exc, connection)
        return await self._fall_back(connection, subscription, run, done)

    async def _batch_apart(self, connection: Connection, subscription: Subscription,
                           guarantee: OwnTransaction, run: list[Ready]) -> bool:
        """``run`` committed in the guarantee's own transaction, then each delivery settled
        in order, as one processed alone would be: a success by a plain ack, a copy already
        processed or a reused identity through ``_process``."""
        try:
            ran = await guarantee.in_one_transaction(run)
        except DatabaseUnavailable as exc:  # the database logs its outage once
            return self._not_settled(f"a batch of {len(run)} from message {run[0].message.id}",
                                     exc, connection, logging.DEBUG)
        except DispatchPending as exc:  # not the messages' doing
            return self._not_settled(f"a batch of {len(run)} from message {run[0].message.id}",
                                     exc, connection)
        if isinstance(ran, BatchFailure):
            return await self._fall_back(connection, subscription, run, ran)
        for item, happened in zip(run, ran, strict=True):
            if not isinstance(happened, Succeeded):
                step = Step(item.delivery, item.message, happened)
                if not await self._process(connection, subscription, step):
                    return False
                continue
            try:
                await self._settle([item.delivery], None, connection)
            except BrokerError as exc:
                self._strikes.not_settled(item.message, SETTLE, exc, connection.is_open)
                return self._not_settled(f"message {item.message.id}", exc, connection)
            self._strikes.settled(item.message, SETTLE)
        return True

    async def _fall_back(self, connection: Connection, subscription: Subscription,
                         run: list[Ready], failed: BatchFailure) -> bool:
        log.info("listener %s: the batch of %d from message %s failed at message %d (%s: %s); "
                 "processing it one message at a time", self._spec.name, len(run),
                 run[0].message.id, failed.at + 1, failed.failure.error_type,
                 failed.failure.text)
        return await self._one_at_a_time(connection, subscription, fall_back(run, failed))

    async def _process(self, connection: Connection, subscription: Subscription,
                       step: Step) -> bool:
        """Process and settle one delivery; return False if it could not be settled (a broker
        error), in which case the broker redelivers it once its subscription is closed."""
        delivery, message = step.delivery, step.message
        # A message its selector rejects, or back after its settlement's copies were stored,
        # is settled unseen: no span, not in flight.
        handling = (telemetry.UNSEEN if isinstance(step.kind, NotSelected | AckLost)
                    else self._invoker.handling(delivery, message))
        outcome: Outcome | None = None
        try:
            with handling as span:
                happened: Happened
                sends: TransactedSends | None = None
                if isinstance(step.kind, Fresh):
                    happened, sends = await self._run(delivery, message, connection)
                else:
                    happened = step.kind
                outcome = decide(message, happened, self._policy_for(subscription),
                                 delivery.protocol_headers)
                await self._carry_out(outcome, step, connection, sends, span)
            self._strikes.settled(message, outcome)
        except BrokerError as exc:
            self._strikes.not_settled(message, outcome, exc, connection.is_open)
            return self._not_settled(f"message {message.id}", exc, connection)
        except DatabaseUnavailable as exc:  # the database logs its outage once
            return self._not_settled(f"message {message.id}", exc, connection, logging.DEBUG)
        except DispatchPending as exc:  # not the message's doing
            return self._not_settled(f"message {message.id}", exc, connection)
        return True

    def _policy_for(self, subscription: Subscription) -> Policy:
        """The decision's view of the listener and ``subscription``, made again only when the
        subscription changed (a reconnect)."""
        if self._policy is None or self._policy_of is not subscription:
            spec = self._spec
            self._policy = Policy(spec.name, spec.options.redelivery,
                                  subscription.requeue_destination, spec.error_destination,
                                  self._producer.brokers.header_limits)
            self._policy_of = subscription
        return self._policy

    async def _run(self, delivery: Delivery, message: Message, connection: Connection,
                   ) -> tuple[Succeeded | AlreadyProcessed | Undecodable | Reused | Raised,
                              TransactedSends | None]:
        """Run the handler on a fresh delivery as the listener's guarantee says
        (``mdb.delivery.runs``): what happened, and the transacted sends to settle it with
        (None: settled by a plain ack)."""
        try:
            body = self._invoker.decode(message.body)
        except DecodeError as exc:
            return Undecodable(str(exc)), None
        return await self._guarantee(delivery, message, body, connection)

    async def _carry_out(self, outcome: Outcome, step: Step, connection: Connection,
                         sends: TransactedSends | None, span: telemetry.Processing) -> None:
        """Do what ``outcome`` says with ``step``'s delivery: the one place where a decision
        becomes acks, copies, waits, strikes, counts and log lines."""
        delivery, message = step.delivery, step.message
        name = self._spec.name
        match outcome:
            case Settle(ack_lost=True):
                await connection.ack(delivery)
                log.debug("listener %s: message %s came back as delivery %d, whose copies the "
                          "broker had stored, not its ack: acked, not handled again", name,
                          message.id, message.delivery_count)
            case Settle(repeat=True):
                await connection.ack(delivery)
                self._stats.already_processed += 1
                span.already_processed()
            case Settle():
                await self._settle([delivery], sends, connection)
            case Filter():
                await connection.ack(delivery)
                self._stats.filtered += 1
            case DeadLetter(failure=failure):
                span.failed(failure.error_type, failure.text)
                await connection.dead_letter(delivery)
                span.given_up(names.DEAD_LETTERED)
                self._stats.dead_lettered += 1
                log.warning("listener %s: message %s handed to the broker's dead-letter queue "
                            "(%s: %s)", name, message.id, failure.error_type, failure.text)
            case Redeliver(failure=failure):
                held = await self._wait_or_hold(outcome.delay, connection)
                stacktrace = _failed(span, failure)
                await self._copy(connection, step, outcome.destination, outcome.headers, held)
                span.redelivery(outcome.delivery_count)
                self._stats.redelivered += 1
                log.info("listener %s: message %s failed (%s: %s), delivery %d of at most %d",
                         name, message.id, failure.error_type, failure.text,
                         message.delivery_count, self._spec.options.redelivery.limit + 1)
                if stacktrace:
                    logs.with_traceback(log, logging.DEBUG, stacktrace,
                                        "listener %s: message %s failed", name, message.id)
            case Keep(failure=failure):
                kept = self._strikes.keeping(message)
                await clock.current().sleep(outcome.delay)
                span.failed(failure.error_type, failure.text)
                await self._copy(connection, step, outcome.destination, outcome.headers)
                self._stats.kept += 1
                span.given_up(names.KEPT)
                log.log(logging.WARNING if kept == 1 else logging.DEBUG,
                        "listener %s: message %s kept on %s (%s: %s); the broker has no "
                        "dead-letter queue that surely keeps it: it stays there, not handled "
                        "again by this process, coming back after pauses of up to "
                        "redelivery.max_delay (kept %d times)", name, message.id,
                        outcome.destination, failure.error_type, failure.text, kept)
            case MoveToError(failure=failure):
                stacktrace = _failed(span, failure)
                await self._copy(connection, step, outcome.destination,
                                 failed_now(outcome.headers, self._producer.brokers.header_limits))
                span.moved(outcome.destination)
                self._stats.to_error_destination += 1
                if isinstance(failure, Unreadable) and failure.damaged:
                    self._stats.damaged += 1
                count = message.delivery_count
                logs.with_traceback(
                    log, logging.WARNING, stacktrace,
                    "listener %s: message %s moved to %s after %d %s (%s: %s)", name,
                    message.id, outcome.destination, count,
                    "delivery" if count == 1 else "deliveries", failure.error_type, failure.text)

    async def _settle(self, deliveries: Sequence[Delivery], sends: TransactedSends | None,
                      connection: Connection | None = None) -> None:
        """Settle ``deliveries`` (one, or a batch's) whose handler runs succeeded: in the
        transaction of their ``sends``, or, with none begun, by a plain ack each."""
        if sends is not None:
            await sends.settle(deliveries, self._stats)
            return
        assert connection is not None
        for delivery in deliveries:
            await connection.ack(delivery)
            self._stats.processed += 1

    async def _wait_or_hold(self, delay: float, connection: Connection) -> float:
        """The delay the broker holds a copy for, freeing this slot at once; or, where it
        cannot, 0 once the delay was waited out here."""
        if delay <= 0 or (await connection.capabilities()).cannot_hold_delays is None:
            return delay
        await clock.current().sleep(delay)
        return 0.0

    async def _copy(self, connection: Connection, step: Step, target: Destination,
                    headers: Mapping[str, str], delay: float = 0.0) -> None:
        """Ack ``step``'s delivery and, in the same transaction, send its copy with ``headers``
        to ``target``, held back ``delay`` seconds by the broker."""
        delivery, message = step.delivery, step.message
        tx = await connection.begin()
        # The copy is the same message (docs/concepts.md): it keeps the request's reply-to
        # and correlation id, for a ``ctx.reply`` of a later delivery, and the adapter keeps
        # what its protocol says of the message (copy_of).
        copy = self._producer.brokers.seal.sealed(OutgoingMessage(
            message.body, headers, reply_to=message.reply_to,
            correlation_id=message.correlation_id, copy_of=delivery.headers, delay=delay))
        with telemetry.sending(self._system, target, copy) as traced:
            await commit(tx, [delivery], sends=[(target, traced)])

    def _not_settled(self, what: str, exc: MdbError, connection: Connection,
                     level: int = logging.WARNING) -> bool:
        self._stats.rolled_back += 1
        # On a lost connection the broker redelivers on its own, perhaps long ago and to
        # another consumer; on a live one only once the subscription is closed (the caller's
        # next step).
        fate = ("the connection is lost: the broker redelivers it, flagged, to this or another "
                "consumer (it may have done so already)" if not connection.is_open
                else "its subscription is closed: the broker redelivers it, flagged")
        log.log(level, "listener %s: %s not settled (%s); %s", self._spec.name, what, exc, fate)
        return False


def _failed(span: telemetry.Processing, failure: Failure) -> str:
    """Tell ``span`` that ``failure`` happened; the traceback of a handler that raised, for
    the log ("" for a failure without one)."""
    stacktrace = failure.traceback if isinstance(failure, Raised) else ""
    span.failed(failure.error_type, failure.text, stacktrace)
    return stacktrace
