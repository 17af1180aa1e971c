"""Processing one delivery: the transaction, the redelivery policy and the error destination.

The container, not the broker, owns redelivery (ActiveMQ over STOMP gives no delivery count
and does not redeliver an aborted ack on a live subscription). A failed delivery is settled by
acknowledging it and, in the same transaction, re-sending a copy to the subscription's own
queue with ``mdb_delivery_count`` one higher — or, past the limit, to the error destination.
The count therefore lives in the message and survives a crash of the process. A delivery the
broker flags redelivered had an unknown outcome (a process died or a connection dropped while
holding it): it counts as a failed delivery and is re-sent the same way before being processed,
so even a message that kills the process cannot loop forever.

Batches (``max_messages_per_transaction`` > 1). A slot hands over what its subscription already
holds, in dispatch order. Consecutive deliveries that can go to the handler (not in doubt, not
undecodable, selected: the others are settled on their own, in their turn) run in one
transaction: the handler is invoked once per message, in order, its sends join the
transaction, and only once every invocation succeeded are the deliveries acked in it, in
order, and committed. So a
transaction that is aborted holds no ack, and after an abort every delivery of the batch is
simply unsettled, which matters on ActiveMQ where client acks are cumulative and an aborted ack
stays with the live subscription. After a handler raised, the batch is processed again one
message at a time, in order: the messages before the failing one run again flagged redelivered
with a delivery count one higher (their first run was rolled back, but the handler may have
had effects of its own), the failing one takes the failure path with its own count, and those
after it run as fresh deliveries. Each is settled before the next, so every ack settles the
oldest unsettled delivery of the subscription and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

from mdb import codec, tracing
from mdb import message as headers_
from mdb.broker import Connection, Delivery, Subscription, Transaction
from mdb.context import Context
from mdb.destinations import Destination
from mdb.errors import BrokerError, ConnectionLost, DecodeError
from mdb.listener import ListenerSpec
from mdb.message import Message, OutgoingMessage, portable_headers
from mdb.planning import PlannedSubscription
from mdb.producer import Producer

log = logging.getLogger("mdb.delivery")


@dataclass
class Stats:
    """Counters of one listener in this process."""

    processed: int = 0
    redelivered: int = 0
    to_error_destination: int = 0
    rolled_back: int = 0
    in_flight: int = 0
    filtered: int = 0  # not selected by a topic listener's selector, settled unseen


def to_message(delivery: Delivery, destination: Destination) -> Message:
    """``delivery`` as the handler sees it: from the listener's logical ``destination``, whatever
    member or re-send queue it came through."""
    h = delivery.headers
    count = _int(h.get(headers_.DELIVERY_COUNT), 1)
    return Message(
        id=h.get(headers_.ID) or delivery.broker_message_id,
        destination=destination,
        body=delivery.body,
        headers=h,
        redelivered=count > 1 or delivery.broker_redelivered,
        delivery_count=count,
    )


@dataclass(frozen=True, slots=True)
class _Ready:
    """A delivery of a batch that can go to the handler: not in doubt, its body decoded."""

    delivery: Delivery
    message: Message
    body: Any


class _Sends:
    """The sends of a handler's run. Those to a member on the delivery's broker go into a
    transaction begun by the first of them; a handler that sends nothing is settled by a plain
    ack (a transaction holding one ack is no more atomic, and it costs the broker two more
    commands and a commit). A member on another broker cannot join that transaction: those
    sends are held and made by ``flush``, once the handler returned and before the commit, so
    a failed handler sends nothing and a committed ack always follows its sends (a commit that
    then fails means a redelivery, and those sends may be made twice)."""

    def __init__(self, connection: Connection, broker: str, system: str,
                 producer: Producer) -> None:
        self._connection = connection
        self._broker = broker
        self._system = system
        self._producer = producer
        self.begun: Transaction | None = None
        self._held: list[tuple[Destination, OutgoingMessage, str | None]] = []

    async def send(self, destination: Destination, body: object,
                   headers: Mapping[str, str] | None, key: str | None) -> None:
        message = codec.outgoing(body, headers)
        member = self._producer.topology.candidates(destination, key=key, prefer=self._broker)[0]
        if member.broker != self._broker:
            self._held.append((destination, message, key))
            return
        if self.begun is None:
            self.begun = await self._connection.begin()
        with tracing.sending(self._system, destination, message) as traced:
            await self.begun.send(member.destination, traced)

    async def flush(self) -> None:
        """Make the held sends; raises BrokerError when one was surely or maybe not sent."""
        held, self._held = self._held, []
        for destination, message, key in held:
            await self._producer.send_message(destination, message, key=key)

    async def abort(self) -> None:
        self._held.clear()
        if self.begun is not None:
            await self.begun.abort()


class Processor:
    """Runs one listener's handler on deliveries of one subscription, as DESIGN §4 says."""

    def __init__(
        self, spec: ListenerSpec, planned: PlannedSubscription, system: str,
        connection: Connection, subscription: Subscription, producer: Producer, stats: Stats,
        threads: anyio.CapacityLimiter, stopping: Callable[[], bool],
    ) -> None:
        self._spec = spec
        self._planned = planned
        self._broker = planned.broker
        self._system = system
        self._selector = planned.selector
        self._producer = producer
        self._span: tracing.Processing | None = None
        self._connection = connection
        self._subscription = subscription
        self._stats = stats
        self._threads = threads
        self._stopping = stopping
        self._decode = codec.decoder_for(spec.body_type)

    async def process_batch(self, deliveries: Sequence[Delivery]) -> bool:
        """Process and settle ``deliveries``, received in this order from the subscription, in
        as few transactions as the module docstring allows. Return False as soon as one could
        not be settled (a broker error): it and the later ones stay unsettled, and the broker
        redelivers them once the subscription is closed. Once ``stopping()`` is true no further
        message goes to the handler; the unprocessed ones stay unsettled too. Raises only
        BaseExceptions such as cancellation."""
        if len(deliveries) == 1 or not self._spec.options.transacted:
            return await self._one_by_one(deliveries)
        start = 0
        while start < len(deliveries):
            if start and self._stopping():
                return True
            run = self._ready_run(deliveries[start:])
            if len(run) < 2:
                if not await self.process(deliveries[start]):
                    return False
                start += 1
            else:
                # A run cut short by stopping leaves its tail unsettled; the check above
                # then ends the loop.
                if not await self._batch(run):
                    return False
                start += len(run)
        return True

    async def process(self, delivery: Delivery) -> bool:
        """Process and settle ``delivery``; return False if it could not be settled (a broker
        error), in which case the broker redelivers it once its subscription is closed. Raises
        only BaseExceptions such as cancellation."""
        return await self._process(delivery, to_message(delivery, self._spec.destination))

    async def _one_by_one(self, deliveries: Sequence[Delivery]) -> bool:
        for index, delivery in enumerate(deliveries):
            if index and self._stopping():
                return True
            if not await self.process(delivery):
                return False
        return True

    async def _process(self, delivery: Delivery, message: Message) -> bool:
        if self._selector is not None and not self._selector(delivery.headers):
            # Not this subscription's message: settled unseen (see mdb.planning).
            try:
                await self._connection.ack(delivery)
            except BrokerError as exc:
                return self._not_settled(f"message {message.id}", exc)
            self._stats.filtered += 1
            return True
        try:
            with self._handling(delivery, message):
                await self._handle(delivery, message)
        except BrokerError as exc:
            return self._not_settled(f"message {message.id}", exc)
        return True

    async def _handle(self, delivery: Delivery, message: Message) -> None:
        """Settle a selected delivery: in doubt or undecodable on the failure path, else run
        the handler as the listener's options say."""
        if delivery.broker_redelivered:
            await self._settle_failure(
                delivery, message, "mdb.InDoubt",
                "an earlier delivery's outcome is unknown (process or connection lost)",
                retry=True, wait=False,
            )
            return
        try:
            body = self._decode(message.body)
        except DecodeError as exc:
            await self._settle_failure(delivery, message, "mdb.DecodeError", str(exc),
                                       retry=False, wait=False)
            return
        if self._spec.options.transacted:
            await self._transacted(delivery, message, body)
        else:
            await self._acked_after(delivery, message, body)

    @contextmanager
    def _handling(self, delivery: Delivery, message: Message) -> Iterator[None]:
        """While a message is being handled: counted in flight and in the pool usage metric,
        inside its ``process`` span (``mdb.tracing``)."""
        self._stats.in_flight += 1
        tracing.pool_usage(self._spec.name, 1)
        try:
            with tracing.processing(
                    self._system, self._spec.destination, self._planned.request.name,
                    self._planned.shared, delivery.headers, message.id, message.body,
                    message.delivery_count, message.redelivered) as self._span:
                yield
        finally:
            self._span = None
            self._stats.in_flight -= 1
            tracing.pool_usage(self._spec.name, -1)

    def _not_settled(self, what: str, exc: BrokerError) -> bool:
        self._stats.rolled_back += 1
        log.warning("listener %s: %s not settled (%s); redelivered once the subscription closes",
                    self._spec.name, what, exc)
        return False

    def _ready_run(self, deliveries: Sequence[Delivery]) -> list[_Ready]:
        """The leading deliveries that can go to the handler, decoded; the first one in doubt,
        undecodable or not selected ends the run (``process`` settles it on its own)."""
        run: list[_Ready] = []
        for delivery in deliveries:
            if delivery.broker_redelivered or (
                    self._selector is not None and not self._selector(delivery.headers)):
                break
            message = to_message(delivery, self._spec.destination)
            try:
                body = self._decode(message.body)
            except DecodeError:
                break
            run.append(_Ready(delivery, message, body))
        return run

    async def _batch(self, run: list[_Ready]) -> bool:
        """One transaction for ``run`` (two or more); on a handler failure, abort it and fall
        back to one message at a time (see the module docstring)."""
        sends = self._sends()
        done = 0
        failure: Exception | None = None
        try:
            try:
                for item in run:
                    if done and self._stopping():
                        break
                    with self._handling(item.delivery, item.message):
                        try:
                            await self._invoke(item.message, item.body, sends.send)
                        except Exception as exc:  # user code: the batch failed
                            failure = exc
                            assert self._span is not None
                            self._span.failed(_type_name(exc), str(exc))
                    if failure is not None:
                        break
                    done += 1
                if failure is None:
                    failure = await _flushed(sends)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await sends.abort()
                raise
            if failure is None:
                await self._settle(sends.begun, [item.delivery for item in run[:done]])
                return True
            await sends.abort()
            if not self._connection.is_open:
                # Nothing of the batch can be settled any more: the broker redelivers it all.
                raise ConnectionLost(f"the connection was lost during the batch ({failure})")
        except BrokerError as exc:
            return self._not_settled(f"a batch of {len(run)} from message {run[0].message.id}",
                                     exc)
        log.info("listener %s: the batch of %d from message %s failed at message %d (%s: %s); "
                 "processing it one message at a time", self._spec.name, len(run),
                 run[0].message.id, done + 1, _type_name(failure), failure)
        return await self._fall_back(run, done, failure)

    async def _settle(self, tx: Transaction | None, deliveries: list[Delivery]) -> None:
        """Ack ``deliveries`` in order: plainly if no handler sent anything, else in ``tx``,
        then commit. Counts them processed."""
        if tx is None:
            for delivery in deliveries:
                await self._connection.ack(delivery)
                self._stats.processed += 1
            return
        await _commit(tx, deliveries)
        self._stats.processed += len(deliveries)

    async def _fall_back(self, run: list[_Ready], failed: int, failure: Exception) -> bool:
        for index, item in enumerate(run):
            if index and self._stopping():
                return True
            if index < failed:
                again = replace(item.message, redelivered=True,
                                delivery_count=item.message.delivery_count + 1)
                settled = await self._process(item.delivery, again)
            elif index == failed:
                settled = await self._failed(item.delivery, item.message, failure)
            else:
                settled = await self._process(item.delivery, item.message)
            if not settled:
                return False
        return True

    async def _failed(self, delivery: Delivery, message: Message, failure: Exception) -> bool:
        """The failure path for a message whose handler already raised ``failure``."""
        try:
            with self._handling(delivery, message):
                await self._settle_failure(delivery, message, _type_name(failure), str(failure),
                                           retry=True, wait=True)
        except BrokerError as exc:
            return self._not_settled(f"message {message.id}", exc)
        return True

    async def _transacted(self, delivery: Delivery, message: Message, body: Any) -> None:
        sends = self._sends()
        try:
            await self._invoke(message, body, sends.send)
            failure: Exception | None = await _flushed(sends)
        except Exception as exc:  # the handler is user code: any failure is a failed delivery
            failure = exc
        except BaseException:
            with anyio.CancelScope(shield=True):
                await sends.abort()
            raise
        if failure is not None:
            await sends.abort()
            await self._settle_failure(delivery, message, _type_name(failure), str(failure),
                                       retry=True, wait=True)
            return
        await self._settle(sends.begun, [delivery])

    def _sends(self) -> _Sends:
        return _Sends(self._connection, self._broker, self._system, self._producer)

    async def _acked_after(self, delivery: Delivery, message: Message, body: Any) -> None:
        try:
            await self._invoke(message, body, self._send_now)
        except Exception as exc:  # user code
            await self._settle_failure(delivery, message, _type_name(exc), str(exc),
                                       retry=True, wait=True)
            return
        await self._connection.ack(delivery)
        self._stats.processed += 1

    async def _invoke(self, message: Message, body: Any, send: Any) -> None:
        spec = self._spec
        kwargs: dict[str, Any] = {}
        if spec.body_parameter:
            kwargs[spec.body_parameter] = body
        if spec.context_parameter:
            kwargs[spec.context_parameter] = Context(message, spec.name, send)
        if spec.is_async:
            await spec.handler(**kwargs)
        else:
            await anyio.to_thread.run_sync(
                partial(spec.handler, **kwargs), limiter=self._threads, abandon_on_cancel=True
            )

    async def _send_now(self, destination: Destination, body: object,
                        headers: Mapping[str, str] | None, key: str | None) -> None:
        await self._producer.send_message(destination, codec.outgoing(body, headers), key=key,
                                          prefer=self._broker)

    async def _settle_failure(
        self, delivery: Delivery, message: Message, error_type: str, error_text: str,
        *, retry: bool, wait: bool,
    ) -> None:
        """Ack ``delivery`` and, in the same transaction, send it on: back to this
        subscription for another delivery, or to the error destination."""
        policy = self._spec.options.redelivery
        count = message.delivery_count
        keep = portable_headers(message.headers)
        keep.pop(headers_.REDELIVERY_OF, None)
        keep[headers_.ID] = message.id
        if retry and count <= policy.limit:
            if wait:
                await anyio.sleep(policy.delay_before(count))
            target = self._subscription.requeue_destination
            keep[headers_.DELIVERY_COUNT] = str(count + 1)
            keep[headers_.REDELIVERY_OF] = str(message.destination)
            outcome = "redelivered"
        else:
            target = self._spec.error_destination
            keep[headers_.DELIVERY_COUNT] = str(count)
            keep.update({
                headers_.ERROR_TYPE: error_type,
                headers_.ERROR_MESSAGE: error_text[:4000],
                headers_.ERROR_LISTENER: self._spec.name,
                headers_.ORIGINAL_DESTINATION: str(message.destination),
            })
            outcome = "to_error_destination"
        if self._span is not None:
            self._span.failed(error_type, error_text)
        tx = await self._connection.begin()
        with tracing.sending(self._system, target, OutgoingMessage(message.body, keep)) as traced:
            await _commit(tx, [delivery], sends=[(target, traced)])
        if self._span is not None:
            if outcome == "redelivered":
                self._span.redelivery(count + 1)
            else:
                self._span.moved(target)
        if outcome == "redelivered":
            self._stats.redelivered += 1
            log.info("listener %s: message %s failed (%s: %s), delivery %d of at most %d",
                     self._spec.name, message.id, error_type, error_text, count,
                     policy.limit + 1)
        else:
            self._stats.to_error_destination += 1
            log.warning("listener %s: message %s moved to %s after %d deliveries (%s: %s)",
                        self._spec.name, message.id, target, count, error_type, error_text)


async def _commit(
    tx: Transaction, deliveries: Sequence[Delivery],
    sends: Sequence[tuple[Destination, OutgoingMessage]] = (),
) -> None:
    """Send ``sends`` and ack ``deliveries`` (in dispatch order) in ``tx``, then commit; abort
    if interrupted before the commit."""
    try:
        for target, outgoing in sends:
            await tx.send(target, outgoing)
        for delivery in deliveries:
            await tx.ack(delivery)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await tx.abort()
        raise
    await tx.commit()


async def _flushed(sends: _Sends) -> BrokerError | None:
    """Make the held sends of a handler that succeeded; a send that failed fails the run,
    as if the handler had raised."""
    try:
        await sends.flush()
    except BrokerError as exc:
        return exc
    return None


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _int(text: str | None, default: int) -> int:
    try:
        return max(int(text), 1) if text is not None else default
    except ValueError:
        return default
