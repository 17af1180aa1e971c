"""What went to an error destination: list it, show one, replay or purge a selection
(docs/failed-messages.md). The ``mdb dlq`` command and the testing kit use it.

Every operation holds the error destination's lock (``Connection.lock``) on each member while
it works on it, on a connection of its own: a second operation meanwhile fails at once with
``QueueLocked``, so that neither waits for what the other holds nor counts what the other
changes. The lock keeps out other operators, not the destination's consumers.

An error destination is read with ``Connection.browse``, a page at a time: a destination of
any size streams. Replay and purge take the messages in their order (``Connection.take``) and
settle each in a transaction of its own (``Connection.begin``), up to the last one selected
(found by a browse first): a selected one is sent to its original destination (replay) or
dropped (purge) as it is acked; one not selected before it is sent again to the back of the
error destination as it is acked, unchanged, its identity kept (so a selection leaves the rest,
and replay never needs to hold a message it is not to take: a broker's acks may be cumulative).
A take ends once nothing is left for it, so a message gone since the browse (expired, taken by
a consumer) never keeps it waiting. Where the broker's transactions are atomic
(``Capabilities.atomic_transactions``), a replay cut short at any point loses and doubles
nothing, and a second run replays the rest. Without them the send is confirmed before the ack:
a cut between the two leaves the message replayed *and* still on the error destination, and
replaying it again sends it again under the same identity, which an exactly-once listener
takes once.

A replayed message keeps its identity (``mdb_id``, docs/architecture.md, "Identity"), proven
anew where mdb vouches for it (``Failed.vouched``: else it goes as the producer's word it came
as), but for one moved aside as reused, which is a message of its own under a new identity;
it starts its delivery count afresh, counts its replays (``mdb_replays``: the listener's
delivery attempts of it start anew, ``mdb.delivery.strikes.attempt_key``) and keeps the
failure it had as history under other names (``mdb.messages.message.LAST_FAILURE``).

Every header of a message on an error destination may have been written by a producer, mdb's
own too: they are read as untrusted text (a count or a time that is not one is none), and a
replay sends a message only where the application's listeners consume (``replay_target``),
unless the operator names the destination; a message it cannot send back is left where it is
and told (``Left``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio

from mdb.commands.dlq.failed_message import Failed
from mdb.commands.dlq.replays import (
    Left,
    named_origins,
    replay_target,
    replayed_message,
    unchanged_message,
)
from mdb.commands.dlq.selection import EVERYTHING, Selection
from mdb.errors import ConfigurationError, QueueLocked
from mdb.messages.destinations import Destination, Kind
from mdb.messages.message import OutgoingMessage
from mdb.messages.topology import Member
from mdb.routing.brokers import Brokers
from mdb.seam.broker import Connection, Delivery


@dataclass(slots=True)
class Done:
    """What a replay or a purge did: ``taken`` messages replayed (or purged; on a dry run,
    that would be), ``moved_back`` not taken and sent again to the error destination's back
    on the way, ``left`` selected and left on the error destination by a replay (``Left``)."""

    taken: int = 0
    moved_back: int = 0
    left: int = 0


Progress = Callable[[int, int], None]
"""Told (done, total) after each message a replay or purge took."""


Replayed = Callable[[str, Destination], None]
"""Told the identity of each message replayed, and where, once its transaction committed."""


Leaving = Callable[[Left], None]
"""Told of each selected message a replay leaves, as the replay finds it."""


class ErrorDestination:
    """One error destination (``queue:NAME``, every member of it in the topology) of the
    brokers of ``brokers``, read and changed through connections of its own. ``replayed`` is
    told of each replay (the testing kit's waits then wait for the message again).
    ``origins`` are where a replay may send a message back (``replay_target``): the
    destinations the application's listeners consume; by default the queue the error
    destination's name says (``named_origins``)."""

    def __init__(self, brokers: Brokers, destination: Destination | str,
                 client_id: str = "mdb.dlq", replayed: Replayed | None = None,
                 origins: Iterable[Destination] | None = None) -> None:
        self.destination = (destination if isinstance(destination, Destination)
                            else Destination.parse(destination))
        if self.destination.kind is not Kind.QUEUE:
            raise ConfigurationError(f"{self.destination}: an error destination is a queue")
        self.origins = (named_origins(self.destination) if origins is None
                        else frozenset(origins))
        self._brokers = brokers
        self._client_id = client_id
        self._replayed = replayed

    @property
    def members(self) -> tuple[Member, ...]:
        return self._brokers.topology.members(self.destination)

    async def list(self, selection: Selection = EVERYTHING) -> AsyncGenerator[Failed, None]:
        """The selected messages, member by member, each in its order, left where they are
        (``Capabilities.browsing`` says what browsing changes on a broker with no browser).
        ``QueueLocked`` while another operation holds a member."""
        now = datetime.now(UTC)
        for member in self.members:
            async with self._locked(member) as (connection, failed_of):
                deliveries = connection.browse(member.destination)
                async with aclosing(deliveries):
                    async for delivery in deliveries:
                        failed = failed_of(delivery)
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
                     progress: Progress | None = None, left: Leaving | None = None) -> Done:
        """Send the selected messages back where they failed (``replay_target``; or all to
        ``to``, which may be a topic) and take them off the error destination, each in one
        transaction (see the module docstring); ``left`` is told of each selected one that
        stays, and why. ``rate``: at most that many per second. ``dry_run``: count them,
        change nothing. ConfigurationError when ``to`` is the error destination itself."""
        if to is not None and (to == self.destination
                               or any(to == member.destination for member in self.members)):
            raise ConfigurationError(f"a replay to {to} would send the messages back to the "
                                     "error destination itself")

        def sending(failed: Failed) -> tuple[Destination, OutgoingMessage] | Left:
            target = to if to is not None else replay_target(failed, self.destination,
                                                             self.origins)
            return target if isinstance(target, Left) else (
                target, replayed_message(failed, self._brokers.seal))

        done = Done()
        for member in self.members:
            await self._take(member, selection, done, dry_run, rate, progress, sending,
                             self._replayed, left)
        return done

    async def purge(self, selection: Selection = EVERYTHING, *, dry_run: bool = False,
                    progress: Progress | None = None) -> Done:
        """Remove the selected messages, each acked in a transaction of its own."""
        done = Done()
        for member in self.members:
            await self._take(member, selection, done, dry_run, None, progress, lambda _: None,
                             None, None)
        return done

    async def _take(self, member: Member, selection: Selection, done: Done, dry_run: bool,
                    rate: float | None, progress: Progress | None,
                    sending: Callable[[Failed], tuple[Destination, OutgoingMessage] | Left | None],
                    sent: Replayed | None, left: Leaving | None) -> None:
        """Take the selected messages of ``member``: where ``sending`` says (None: nowhere;
        ``sent`` is told where it went), the others before the last one taken to the error
        destination's back, a selected one that ``sending`` leaves (``left`` is told) too."""
        now = datetime.now(UTC)
        async with self._locked(member) as (connection, failed_of):
            selected, last, position = 0, -1, 0
            deliveries = connection.browse(member.destination)
            async with aclosing(deliveries):
                async for delivery in deliveries:
                    failed = failed_of(delivery)
                    if selection.matches(failed, now):
                        target = sending(failed)
                        if not isinstance(target, Left):
                            selected, last = selected + 1, position
                        else:
                            done.left += 1
                            if left is not None:
                                left(target)
                    position += 1
            if dry_run or not selected:
                done.taken += selected
                return
            taken, position = 0, 0
            deliveries = connection.take(member.destination)
            async with aclosing(deliveries):
                async for delivery in deliveries:
                    failed = failed_of(delivery)
                    chosen = selection.matches(failed, now)
                    target = sending(failed) if chosen else None
                    if not chosen or isinstance(target, Left):
                        await _settle(connection, delivery,
                                      (member.destination, unchanged_message(failed)))
                        done.moved_back += 1
                    else:
                        await _settle(connection, delivery, target)
                        taken += 1
                        done.taken += 1
                        if sent is not None and target is not None:
                            sent(self._brokers.seal.known_as(target[1]), target[0])
                        if progress is not None:
                            progress(taken, selected)
                        if rate:
                            await anyio.sleep(1 / rate)
                    if position == last:
                        break
                    position += 1

    @asynccontextmanager
    async def _locked(self, member: Member,
                      ) -> AsyncIterator[tuple[Connection, Callable[[Delivery], Failed]]]:
        """A connection of its own to ``member``'s broker, holding the member's lock, and
        what a delivery of it is as a failure; ``QueueLocked`` saying what to do while
        another operation holds the lock."""
        link = self._brokers.link(member.broker, self._client_id)
        origin = link.capabilities.dead_letter_origin
        seal, assigned = self._brokers.seal, link.capabilities.assigned_ids
        try:
            connection = await link.connect()
            try:
                await connection.lock(member.destination)
            except QueueLocked:
                raise QueueLocked(
                    f"{member.destination} on broker {member.broker}: another mdb dlq command "
                    "is at work on it (list, show, replay and purge take an error destination "
                    "one at a time); run this one again once it is done") from None
            yield connection, lambda delivery: Failed.of(delivery, member, seal,
                                                         assigned=assigned,
                                                         origin=origin(delivery))
        finally:
            await link.close()


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
