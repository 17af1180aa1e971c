"""What went to an error destination: list it, show one, replay or purge a selection
(docs/failed-messages.md). The ``mdb dlq`` command and the testing kit use it.

An error destination is read with ``Connection.browse``, one message at a time: nothing is
held but the one in hand, so a destination of any size streams. Replay and purge take the
messages in their order through a subscription of prefetch 1 and settle each in a transaction
of its own (``Connection.begin``), up to the last one selected (found by a browse first): a
selected one is sent to its original destination (replay) or dropped (purge) as it is acked;
one not selected before it is sent again to the back of the error destination as it is acked,
unchanged, its identity kept (so a selection leaves the rest, and replay never needs to hold a
message it is not to take: a broker's acks may be cumulative). Where the broker's
transactions are atomic (``Capabilities.atomic_transactions``), a replay cut short at any
point loses and doubles nothing, and a second run replays the rest. Without them the send is
confirmed before the ack: a cut between the two leaves the message replayed *and* still on
the error destination, and replaying it again sends it again under the same identity, which
an exactly-once listener takes once.

A replayed message keeps its identity (``mdb_id``, docs/architecture.md, "Identity"), starts
its delivery count afresh, counts its replays (``mdb_replays``: the listener's rounds of it
start anew, ``mdb.delivery.strikes.round_key``) and keeps the failure it had as history under
other names (``mdb.message.LAST_FAILURE``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import anyio

from mdb import message as m
from mdb.broker import Connection, Delivery, SubscriptionRequest
from mdb.brokers import Brokers
from mdb.destinations import Destination, Kind
from mdb.errors import ConfigurationError
from mdb.identity import identity_key
from mdb.message import OutgoingMessage
from mdb.redaction import mask_secrets, printable
from mdb.selector import Matcher, SelectorError, compile_selector
from mdb.topology import Member

TEXT_LIMIT = 200
"""Characters of a failure's text a listing shows."""
BODY_LIMIT = 4096
"""Bytes of a body ``show`` decodes and prints (``--raw`` writes all of it)."""


@dataclass(frozen=True, slots=True)
class Failed:
    """One message on an error destination, as mdb's headers describe its failure."""

    id: str
    """Its identity (``mdb.identity``): the ``mdb_id`` every copy of it carries."""
    member: Member
    """The error destination's member it is on."""
    original_destination: str
    error_type: str
    error_message: str
    listener: str
    delivery_count: int
    failed_at: datetime | None
    body: bytes
    headers: Mapping[str, str]
    protocol_headers: frozenset[str] = frozenset()

    @classmethod
    def of(cls, delivery: Delivery, member: Member) -> Failed:
        headers = delivery.headers
        return cls(
            id=identity_key(delivery), member=member,
            original_destination=headers.get(m.ORIGINAL_DESTINATION, ""),
            error_type=headers.get(m.ERROR_TYPE, ""),
            error_message=headers.get(m.ERROR_MESSAGE, ""),
            listener=headers.get(m.ERROR_LISTENER, ""),
            delivery_count=_count(headers.get(m.DELIVERY_COUNT)),
            failed_at=_time(headers.get(m.FAILED_AT)),
            body=delivery.body, headers=headers,
            protocol_headers=delivery.protocol_headers)

    def summary(self) -> dict[str, object]:
        """What a listing shows of it: no body, the failure's text bounded and printable."""
        text = printable(mask_secrets(self.error_message))
        return {"id": self.id, "broker": self.member.broker,
                "original_destination": self.original_destination,
                "listener": self.listener, "error_type": printable(self.error_type),
                "error": text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT - 1] + "…",
                "delivery_count": self.delivery_count,
                "failed_at": None if self.failed_at is None else self.failed_at.isoformat(),
                "body_bytes": len(self.body)}

    def shown_headers(self) -> dict[str, str]:
        """Its headers as ``show`` prints them: secrets masked, control characters escaped."""
        return {printable(k): printable(mask_secrets(v)) for k, v in self.headers.items()}

    def shown_lines(self, header: str) -> list[str]:
        """A header's value as ``show`` prints it in its own section, a traceback's say:
        line by line, each with secrets masked and control characters escaped."""
        return [printable(mask_secrets(line))
                for line in self.headers.get(header, "").splitlines()]

    def shown_body(self, limit: int = BODY_LIMIT) -> str:
        """Its body as text for a person: JSON indented, text as it is, other bytes as a
        hexadecimal dump; at most ``limit`` bytes, saying how many more there are."""
        body, rest = self.body[:limit], max(0, len(self.body) - limit)
        try:
            text = body.decode()
        except UnicodeDecodeError:
            text = body.hex(" ", 2)
        else:
            if m.content_type_of(self.headers) == "application/json" and not rest:
                with suppress(ValueError):  # labelled JSON and is not: shown as it is
                    text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            text = printable(text, lines=True)
        return text + (f"\n… {rest} more bytes" if rest else "")


@dataclass(frozen=True, slots=True)
class Selection:
    """Which messages of an error destination an operation takes: those that match every
    criterion given. ``older_than``/``newer_than`` compare with ``mdb_failed_at`` (a message
    without it is neither); ``selector`` is a JMS selector on the headers, evaluated by mdb
    (the subset of ``mdb.selector``) on every broker alike."""

    listener: str | None = None
    error_type: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    selector: str | None = None
    ids: frozenset[str] = frozenset()
    _matcher: Matcher | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.selector:
            try:
                object.__setattr__(self, "_matcher", compile_selector(self.selector))
            except SelectorError as exc:
                raise ConfigurationError(f"selector {self.selector!r}: {exc}") from None

    def matches(self, failed: Failed, now: datetime) -> bool:
        if self.ids and failed.id not in self.ids:
            return False
        if self.listener is not None and failed.listener != self.listener:
            return False
        if self.error_type is not None and failed.error_type != self.error_type:
            return False
        age = None if failed.failed_at is None else now - failed.failed_at
        if self.older_than is not None and (age is None or age < self.older_than):
            return False
        if self.newer_than is not None and (age is None or age > self.newer_than):
            return False
        return self._matcher is None or self._matcher(failed.headers)


EVERYTHING = Selection()


@dataclass(slots=True)
class Done:
    """What a replay or a purge did: ``taken`` messages replayed (or purged; on a dry run,
    that would be), ``moved_back`` not selected and sent again to the error destination's
    back on the way."""

    taken: int = 0
    moved_back: int = 0


Progress = Callable[[int, int], None]
"""Told (done, total) after each message a replay or purge took."""


Replayed = Callable[[str, Destination], None]
"""Told the identity of each message replayed, and where, once its transaction committed."""


class ErrorDestination:
    """One error destination (``queue:NAME``, every member of it in the topology) of the
    brokers of ``brokers``, read and changed through connections of its own. ``replayed`` is
    told of each replay (the testing kit's waits then wait for the message again)."""

    def __init__(self, brokers: Brokers, destination: Destination | str,
                 client_id: str = "mdb.dlq", replayed: Replayed | None = None) -> None:
        self.destination = (destination if isinstance(destination, Destination)
                            else Destination.parse(destination))
        if self.destination.kind is not Kind.QUEUE:
            raise ConfigurationError(f"{self.destination}: an error destination is a queue")
        self._brokers = brokers
        self._client_id = client_id
        self._replayed = replayed

    @property
    def members(self) -> tuple[Member, ...]:
        return self._brokers.topology.members(self.destination)

    async def list(self, selection: Selection = EVERYTHING) -> AsyncGenerator[Failed, None]:
        """The selected messages, member by member, each in its order, left where they are
        (``Capabilities.browsing`` says what browsing changes on a broker with no browser)."""
        now = datetime.now(UTC)
        for member in self.members:
            async with self._browsing(member) as deliveries:
                async for delivery in deliveries:
                    failed = Failed.of(delivery, member)
                    if selection.matches(failed, now):
                        yield failed

    async def show(self, message_id: str) -> Failed:
        """The message of identity ``message_id``; ConfigurationError when it is not there."""
        found = self.list(Selection(ids=frozenset({message_id})))
        try:
            async for failed in found:
                return failed
        finally:
            await found.aclose()
        raise ConfigurationError(f"no message {message_id!r} on {self.destination}")

    async def replay(self, selection: Selection = EVERYTHING, *, to: Destination | None = None,
                     dry_run: bool = False, rate: float | None = None,
                     progress: Progress | None = None) -> Done:
        """Send the selected messages back to their original destination (or ``to``) and take
        them off the error destination, each in one transaction (see the module docstring).
        ``rate``: at most that many per second. ``dry_run``: count them, change nothing."""
        done = Done()
        for member in self.members:
            await self._take(member, selection, done, dry_run, rate, progress,
                             lambda failed: _replayed(failed, to), self._replayed)
        return done

    async def purge(self, selection: Selection = EVERYTHING, *, dry_run: bool = False,
                    progress: Progress | None = None) -> Done:
        """Remove the selected messages, each acked in a transaction of its own."""
        done = Done()
        for member in self.members:
            await self._take(member, selection, done, dry_run, None, progress, lambda _: None,
                             None)
        return done

    async def _take(self, member: Member, selection: Selection, done: Done, dry_run: bool,
                    rate: float | None, progress: Progress | None,
                    sending: Callable[[Failed], tuple[Destination, OutgoingMessage] | None],
                    sent: Replayed | None) -> None:
        """Take the selected messages of ``member``: where ``sending`` says (None: nowhere;
        ``sent`` is told where it went), the others before the last selected one to the error
        destination's back."""
        now = datetime.now(UTC)
        selected, last = 0, -1
        async with self._browsing(member) as deliveries:
            position = 0
            async for delivery in deliveries:
                failed = Failed.of(delivery, member)
                if selection.matches(failed, now):
                    sending(failed)  # refuses, before anything changed, what it cannot send
                    selected, last = selected + 1, position
                position += 1
        if dry_run or not selected:
            done.taken += selected
            return
        link = self._brokers.link(member.broker, self._client_id)
        try:
            connection = await link.connect()
            subscription = await connection.subscribe(SubscriptionRequest(
                member.destination, None, durable=False, selector=None, prefetch=1))
            taken = 0
            for _ in range(last + 1):
                delivery = await subscription.receive()
                failed = Failed.of(delivery, member)
                chosen = selection.matches(failed, now)
                target = sending(failed) if chosen else (member.destination, _unchanged(failed))
                await _settle(connection, delivery, target)
                if not chosen:
                    done.moved_back += 1
                    continue
                taken += 1
                done.taken += 1
                if sent is not None and target is not None:
                    sent(failed.id, target[0])
                if progress is not None:
                    progress(taken, selected)
                if rate:
                    await anyio.sleep(1 / rate)
            await subscription.close()
        finally:
            await link.close()

    def _browsing(self, member: Member) -> _Browse:
        return _Browse(self._brokers, member, self._client_id)


class _Browse:
    """A browse of one member on a connection of its own, closed at the end (a broker with no
    browser closes it anyway: ``Connection.browse``)."""

    def __init__(self, brokers: Brokers, member: Member, client_id: str) -> None:
        self._link = brokers.link(member.broker, client_id)
        self._member = member
        self._deliveries: AsyncGenerator[Delivery, None] | None = None

    async def __aenter__(self) -> AsyncGenerator[Delivery, None]:
        connection = await self._link.connect()
        self._deliveries = connection.browse(self._member.destination)
        return self._deliveries

    async def __aexit__(self, *_: object) -> None:
        try:
            if self._deliveries is not None:
                await self._deliveries.aclose()
        finally:
            await self._link.close()


async def _settle(connection: Connection, delivery: Delivery,
                  target: tuple[Destination, OutgoingMessage] | None) -> None:
    """Ack ``delivery`` with the send to ``target`` (if any) in one transaction."""
    transaction = await connection.begin()
    try:
        if target is not None:
            await transaction.send(*target)
        await transaction.ack(delivery)
    except BaseException:
        await transaction.abort()
        raise
    await transaction.commit()


def _application(failed: Failed) -> dict[str, str]:
    return {k: v for k, v in failed.headers.items() if k not in failed.protocol_headers}


def _unchanged(failed: Failed) -> OutgoingMessage:
    """``failed`` as it is, to go to the back of its error destination."""
    headers = _application(failed)
    headers[m.ID] = failed.id
    return OutgoingMessage(failed.body, headers, copy_of=failed.headers)


def _replayed(failed: Failed, to: Destination | None) -> tuple[Destination, OutgoingMessage]:
    """Where ``failed`` is replayed and as what (see the module docstring); ConfigurationError
    when it names no original destination and no ``to`` is given."""
    if to is None:
        if not failed.original_destination:
            raise ConfigurationError(
                f"message {failed.id} on {failed.member.destination} names no original "
                f"destination ({m.ORIGINAL_DESTINATION}): replay it with --to DESTINATION")
        to = Destination.parse(failed.original_destination)
    headers = _application(failed)
    for name, history in m.LAST_FAILURE.items():
        if name in headers:
            headers[history] = headers.pop(name)
    headers.pop(m.REDELIVERY_OF, None)
    headers[m.ID] = failed.id
    headers[m.REPLAYS] = str(_count(failed.headers.get(m.REPLAYS), 0) + 1)
    return to, OutgoingMessage(failed.body, headers, copy_of=failed.headers)


def _count(text: str | None, default: int = 1) -> int:
    """A count header as a number (a producer may write anything there)."""
    return int(text) if text is not None and text.isdigit() else default


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        return None
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)
