"""Processing the deliveries of one subscription: run the handler, then settle each delivery
as ``mdb.delivery.decision`` decides (the effectful side of it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import anyio

from mdb import clock, tracing
from mdb.broker import Connection, Delivery, Subscription
from mdb.delivery.batch import Ready, Step, fall_back, ready_run, run_in_one_transaction
from mdb.delivery.copies import fitted
from mdb.delivery.decision import (
    MAX_STRIKES,
    Damaged,
    DeadLetter,
    Failure,
    InDoubt,
    Keep,
    MoveToError,
    Policy,
    Raised,
    Redeliver,
    Stuck,
    Undecodable,
    Unsupported,
    decide,
    to_message,
)
from mdb.delivery.invoker import Invoker
from mdb.delivery.sends import DirectSends, TransactedSends, commit
from mdb.delivery.stats import Stats
from mdb.delivery.strikes import Strikes, identity
from mdb.errors import BrokerError, DecodeError
from mdb.listener import ListenerSpec
from mdb.message import Message, OutgoingMessage
from mdb.planning import PlannedSubscription
from mdb.producer import Producer

log = logging.getLogger("mdb.delivery")


class Processor:
    """Runs one listener's handler on the deliveries of one planned subscription, as DESIGN §4
    says. Made once per pool slot; the connection and the subscription, which change at every
    reconnect, come with the deliveries. ``stopping()`` says when no further message may go to
    the handler. ``stats`` and ``strikes`` are the listener's, shared by its slots."""

    def __init__(
        self, spec: ListenerSpec, planned: PlannedSubscription, system: str,
        producer: Producer, stats: Stats, strikes: Strikes, threads: anyio.CapacityLimiter,
        stopping: Callable[[], bool],
    ) -> None:
        self._spec = spec
        self._broker = planned.broker
        self._system = system
        self._selector = planned.selector
        self._producer = producer
        self._stats = stats
        self._strikes = strikes
        self._stopping = stopping
        self._invoker = Invoker(spec, planned, system, stats, threads)
        self._direct = DirectSends(producer, planned.broker)

    async def process_batch(self, connection: Connection, subscription: Subscription,
                            deliveries: Sequence[Delivery]) -> bool:
        """Process and settle ``deliveries``, received in this order from ``subscription`` on
        ``connection``, in as few transactions as ``mdb.delivery.batch`` allows. Return False
        as soon as one could not be settled (a broker error): it and the later ones stay
        unsettled, and the broker redelivers them, flagged: once the subscription is closed,
        or on its own when the connection was lost (perhaps already, elsewhere). Once
        ``stopping()`` is true no further message goes to the handler; the unprocessed ones stay
        unsettled too. Raises only BaseExceptions such as cancellation."""
        destination = self._spec.destination
        if len(deliveries) == 1:  # the usual case
            delivery = deliveries[0]
            return await self._process(connection, subscription,
                                       Step(delivery, to_message(delivery, destination)))
        if not self._spec.options.transacted:
            return await self._one_at_a_time(
                connection, subscription, (Step(d, to_message(d, destination)) for d in deliveries))
        start = 0
        while start < len(deliveries):
            if start and self._stopping():
                return True
            run = ready_run(deliveries[start:], destination, self._batchable,
                            self._invoker.decode)
            if len(run) < 2:
                delivery = deliveries[start]
                if not await self._process(connection, subscription,
                                           Step(delivery, to_message(delivery, destination))):
                    return False
                start += 1
            else:
                # A run cut short by stopping leaves its tail unsettled; the check above
                # then ends the loop.
                if not await self._batch(connection, subscription, run):
                    return False
                start += len(run)
        return True

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
        """One transaction for ``run`` (two or more); after a handler failure, the run again
        one message at a time."""
        sends = TransactedSends(connection, self._broker, self._system, self._producer)
        try:
            failed = await run_in_one_transaction(run, connection, sends, self._invoker,
                                                  self._stats, self._stopping)
        except BrokerError as exc:
            return self._not_settled(f"a batch of {len(run)} from message {run[0].message.id}",
                                     exc, connection)
        if failed is None:
            return True
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
        failure: Failure | None = step.failure
        if failure is None and delivery.damage is not None:
            failure = Damaged(delivery.damage)
        if failure is None and delivery.unsupported is not None:
            failure = Unsupported(delivery.unsupported)
        strikes = self._strikes_of(delivery, message)
        if strikes >= MAX_STRIKES:
            failure = Stuck(strikes, delivery.can_dead_letter)
        try:
            if failure is None and not self._selected(delivery):
                # Not this subscription's message: settled unseen (see mdb.planning).
                await connection.ack(delivery)
                self._stats.filtered += 1
                return True
            with self._invoker.handling(delivery, message) as span:
                if failure is None:
                    failure = await self._run(connection, delivery, message)
                if failure is not None:
                    await self._settle_failure(connection, subscription, delivery, message,
                                               failure, span)
        except BrokerError as exc:
            if connection.is_open:  # refused, not lost: it counts against this message
                self._strikes.strike(identity(delivery))
            return self._not_settled(f"message {message.id}", exc, connection)
        return True

    def _selected(self, delivery: Delivery) -> bool:
        return self._selector is None or self._selector(delivery.headers)

    def _batchable(self, delivery: Delivery) -> bool:
        return (delivery.damage is None and delivery.unsupported is None
                and self._selected(delivery)
                and not (self._strikes and self._strikes.count(identity(delivery))))

    def _strikes_of(self, delivery: Delivery, message: Message) -> int:
        """The strikes of ``delivery``'s message (``mdb.delivery.strikes``), one more if it
        came back in doubt after the broker confirmed moving it to the error destination."""
        if delivery.broker_redelivered:
            return self._strikes.came_back(identity(delivery), message.delivery_count)
        if not self._strikes:
            return 0  # nothing was ever struck: no identity to work out
        return self._strikes.count(identity(delivery))

    async def _run(self, connection: Connection, delivery: Delivery,
                   message: Message) -> Failure | None:
        """Run the handler on ``delivery`` as the listener's options say and settle it; or,
        when it is in doubt, does not decode or the handler failed, return what went wrong
        with nothing of the run sent in a transaction or settled."""
        if delivery.broker_redelivered:
            return InDoubt()
        try:
            body = self._invoker.decode(message.body)
        except DecodeError as exc:
            return Undecodable(str(exc))
        if not self._spec.options.transacted:
            try:
                await self._invoker.invoke(message, body, self._direct.send)
            except Exception as exc:  # user code: any failure is a failed delivery
                return Raised.of(exc)
            await connection.ack(delivery)
            self._stats.processed += 1
            return None
        sends = TransactedSends(connection, self._broker, self._system, self._producer)
        try:
            await self._invoker.invoke(message, body, sends.send)
            error: Exception | None = await sends.flushed()
        except Exception as exc:  # user code: any failure is a failed delivery
            error = exc
        except BaseException:
            await sends.abort_shielded()
            raise
        if error is not None:
            await sends.abort()
            return Raised.of(error)
        await sends.settle([delivery], self._stats)
        return None

    async def _settle_failure(self, connection: Connection, subscription: Subscription,
                              delivery: Delivery, message: Message, failure: Failure,
                              span: tracing.Processing) -> None:
        """Settle ``delivery`` as ``decide`` says: ack it and, in the same transaction, send it
        back to ``subscription`` (for another delivery, or kept) or to the error destination;
        or hand it to the broker's dead-letter queue."""
        spec = self._spec
        policy = Policy(spec.name, spec.options.redelivery, subscription.requeue_destination,
                        spec.error_destination)
        outcome = fitted(decide(message, failure, policy, delivery.protocol_headers),
                         message, failure, policy, delivery.protocol_headers)
        if isinstance(outcome, DeadLetter):
            span.failed(failure.error_type, failure.text)
            await connection.dead_letter(delivery)
            span.given_up("dead-lettered")
            self._stats.dead_lettered += 1
            log.warning("listener %s: message %s handed to the broker's dead-letter queue (%s: "
                        "%s)", spec.name, message.id, failure.error_type, failure.text)
            return
        held = 0.0  # the delay the broker holds the copy for, freeing this slot at once
        if isinstance(outcome, Redeliver) and outcome.delay > 0:
            if await connection.delay_unsupported() is None:
                held = outcome.delay
            else:
                await clock.current().sleep(outcome.delay)
        elif isinstance(outcome, Keep):
            await clock.current().sleep(outcome.delay)
        stacktrace = failure.traceback if isinstance(failure, Raised) else ""
        span.failed(failure.error_type, failure.text, stacktrace)
        target = outcome.destination
        tx = await connection.begin()
        # The copy is the same message (docs/concepts.md): it keeps the request's reply-to
        # and correlation id, for a ``ctx.reply`` of a later delivery, and the adapter keeps
        # what its protocol says of the message (copy_of).
        copy = OutgoingMessage(message.body, outcome.headers, reply_to=message.reply_to,
                               correlation_id=message.correlation_id,
                               copy_of=delivery.headers, delay=held)
        try:
            with tracing.sending(self._system, target, copy) as traced:
                await commit(tx, [delivery], sends=[(target, traced)])
        except BrokerError:
            if isinstance(outcome, MoveToError) and not connection.is_open:
                # Refused by closing the connection, perhaps (RabbitMQ): see strikes. (A
                # refusal on an open connection is struck by _process.)
                self._strikes.strike(identity(delivery))
            raise
        if isinstance(outcome, MoveToError):
            self._strikes.moved(identity(delivery), message.delivery_count)
        if isinstance(outcome, Redeliver):
            span.redelivery(outcome.delivery_count)
            self._stats.redelivered += 1
            log.info("listener %s: message %s failed (%s: %s), delivery %d of at most %d",
                     spec.name, message.id, failure.error_type, failure.text,
                     message.delivery_count, policy.redelivery.limit + 1)
            if stacktrace:
                log.debug("listener %s: message %s failed:\n%s", spec.name, message.id,
                          stacktrace)
        elif isinstance(outcome, Keep):
            self._kept(delivery, message, failure, outcome)
            span.given_up("kept")
        else:
            span.moved(target)
            self._stats.to_error_destination += 1
            if isinstance(failure, Damaged):
                self._stats.damaged += 1
            log.warning("listener %s: message %s moved to %s after %d deliveries (%s: %s)%s",
                        spec.name, message.id, target, message.delivery_count,
                        failure.error_type, failure.text,
                        f"\n{stacktrace}" if stacktrace else "")

    def _kept(self, delivery: Delivery, message: Message, failure: Failure,
              outcome: Keep) -> None:
        """A stuck message was kept: one more strike (a longer pause next time), counted, and
        said at WARNING the first time only."""
        self._stats.kept += 1
        self._strikes.strike(identity(delivery))
        log.log(logging.WARNING if outcome.round == 1 else logging.DEBUG,
                "listener %s: message %s kept on %s (%s: %s); the broker has no dead-letter "
                "queue that surely keeps it: it stays there, not handled again by this process, "
                "coming back after pauses of up to redelivery.max_delay (round %d)",
                self._spec.name, message.id, outcome.destination, failure.error_type,
                failure.text, outcome.round)

    def _not_settled(self, what: str, exc: BrokerError, connection: Connection) -> bool:
        self._stats.rolled_back += 1
        # On a lost connection the broker redelivers on its own, perhaps long ago and to
        # another consumer; on a live one only once the subscription is closed (the caller's
        # next step).
        fate = ("the connection is lost: the broker redelivers it, flagged, to this or another "
                "consumer (it may have done so already)" if not connection.is_open
                else "its subscription is closed: the broker redelivers it, flagged")
        log.warning("listener %s: %s not settled (%s); %s", self._spec.name, what, exc, fate)
        return False

