"""Processing one delivery: the transaction, the redelivery policy and the error destination.

The container, not the broker, owns redelivery (ActiveMQ over STOMP gives no delivery count
and does not redeliver an aborted ack on a live subscription). A failed delivery is settled by
acknowledging it and, in the same transaction, re-sending a copy to the subscription's own
queue with ``mdb_delivery_count`` one higher — or, past the limit, to the error destination.
The count therefore lives in the message and survives a crash of the process. A delivery the
broker flags redelivered had an unknown outcome (a process died or a connection dropped while
holding it): it counts as a failed delivery and is re-sent the same way before being processed,
so even a message that kills the process cannot loop forever.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

from mdb import codec
from mdb import message as headers_
from mdb.broker import Connection, Delivery, Subscription, Transaction
from mdb.context import Context
from mdb.destinations import Destination
from mdb.errors import BrokerError, DecodeError
from mdb.listener import ListenerSpec
from mdb.message import Message, OutgoingMessage, portable_headers

log = logging.getLogger("mdb.delivery")


@dataclass
class Stats:
    """Counters of one listener in this process."""

    processed: int = 0
    redelivered: int = 0
    to_error_destination: int = 0
    rolled_back: int = 0
    in_flight: int = 0


def to_message(delivery: Delivery) -> Message:
    h = delivery.headers
    count = _int(h.get(headers_.DELIVERY_COUNT), 1)
    redelivery_of = h.get(headers_.REDELIVERY_OF)
    return Message(
        id=h.get(headers_.ID) or delivery.broker_message_id,
        destination=Destination.parse(redelivery_of) if redelivery_of else delivery.destination,
        body=delivery.body,
        headers=h,
        redelivered=count > 1 or delivery.broker_redelivered,
        delivery_count=count,
    )


class Processor:
    """Runs one listener's handler on deliveries of one subscription, as DESIGN §4 says."""

    def __init__(
        self, spec: ListenerSpec, connection: Connection, subscription: Subscription,
        stats: Stats, threads: anyio.CapacityLimiter,
    ) -> None:
        self._spec = spec
        self._connection = connection
        self._subscription = subscription
        self._stats = stats
        self._threads = threads
        self._decode = codec.decoder_for(spec.body_type)

    async def process(self, delivery: Delivery) -> bool:
        """Process and settle ``delivery``; return False if it could not be settled (a broker
        error), in which case the broker redelivers it once its subscription is closed. Raises
        only BaseExceptions such as cancellation."""
        message = to_message(delivery)
        self._stats.in_flight += 1
        try:
            if delivery.broker_redelivered:
                await self._settle_failure(
                    delivery, message, "mdb.InDoubt",
                    "an earlier delivery's outcome is unknown (process or connection lost)",
                    retry=True, wait=False,
                )
                return True
            try:
                body = self._decode(message.body)
            except DecodeError as exc:
                await self._settle_failure(delivery, message, "mdb.DecodeError", str(exc),
                                           retry=False, wait=False)
                return True
            if self._spec.options.transacted:
                await self._transacted(delivery, message, body)
            else:
                await self._acked_after(delivery, message, body)
            return True
        except BrokerError as exc:
            self._stats.rolled_back += 1
            log.warning("listener %s: message %s not settled (%s); it will be redelivered",
                        self._spec.name, message.id, exc)
            return False
        finally:
            self._stats.in_flight -= 1

    async def _transacted(self, delivery: Delivery, message: Message, body: Any) -> None:
        # The transaction begins with the handler's first send. A handler that sends nothing
        # is settled by a plain ack: a transaction holding one ack is no more atomic, and it
        # costs the broker two more commands and a commit.
        tx: Transaction | None = None

        async def send(destination: Destination, body: object,
                       headers: Mapping[str, str] | None) -> None:
            nonlocal tx
            if tx is None:
                tx = await self._connection.begin()
            await tx.send(destination, codec.outgoing(body, headers))

        try:
            await self._invoke(message, body, send)
        except Exception as exc:  # the handler is user code: any failure is a failed delivery
            if tx is not None:
                await tx.abort()
            await self._settle_failure(delivery, message, _type_name(exc), str(exc),
                                       retry=True, wait=True)
            return
        except BaseException:
            if tx is not None:
                with anyio.CancelScope(shield=True):
                    await tx.abort()
            raise
        if tx is None:
            await self._connection.ack(delivery)
        else:
            await tx.ack(delivery)
            await tx.commit()
        self._stats.processed += 1

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
                        headers: Mapping[str, str] | None) -> None:
        await self._connection.send(destination, codec.outgoing(body, headers))

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
        tx = await self._connection.begin()
        try:
            await tx.send(target, OutgoingMessage(message.body, keep))
            await tx.ack(delivery)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await tx.abort()
            raise
        await tx.commit()
        if outcome == "redelivered":
            self._stats.redelivered += 1
            log.info("listener %s: message %s failed (%s: %s), delivery %d of at most %d",
                     self._spec.name, message.id, error_type, error_text, count,
                     policy.limit + 1)
        else:
            self._stats.to_error_destination += 1
            log.warning("listener %s: message %s moved to %s after %d deliveries (%s: %s)",
                        self._spec.name, message.id, target, count, error_type, error_text)


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
