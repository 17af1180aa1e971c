"""The topology: which physical destinations (members) on which brokers make up a logical one.

A destination not described in settings has one member of the same name on the first broker.
A *distributed* destination has several members, possibly on several brokers; with the
``partitioned`` forwarding policy each message is stored on exactly one member, so a listener
consumes from every member and a sender picks one (``Topology.candidates``).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from mdb.messages.destinations import Destination


@dataclass(frozen=True, slots=True)
class Member:
    """One physical destination of a logical one, on a named broker."""

    broker: str
    destination: Destination

    def __str__(self) -> str:
        return f"{self.destination}@{self.broker}"


class Topology:
    """Logical destinations → members. Immutable; ``candidates`` keeps a round-robin position
    per destination."""

    def __init__(self, members: Mapping[Destination, tuple[Member, ...]],
                 default_broker: str) -> None:
        self._members = dict(members)
        self._default_broker = default_broker
        self._turns: dict[Destination, itertools.count[int]] = {}

    def members(self, destination: Destination) -> tuple[Member, ...]:
        """Every member of ``destination``, in the order settings list them."""
        found = self._members.get(destination)
        return found if found else (Member(self._default_broker, destination),)

    def candidates(
        self, destination: Destination, *, key: str | None = None, prefer: str | None = None,
        down: Collection[str] = (),
    ) -> list[Member]:
        """The members a send to ``destination`` should try, best first.

        With a ``key``, the member is chosen by a hash of the key that every process computes
        alike (CRC-32, not Python's salted ``hash``), so messages with one key go to one member
        and keep their order there; the following members are the fallbacks. Without a key,
        members take turns (round robin), those on broker ``prefer`` first. Members on brokers
        in ``down`` go last whatever the order, so they are tried only when nothing else is
        left.
        """
        members = self.members(destination)
        if len(members) == 1:  # most destinations: nothing to choose
            return list(members)
        if key is not None:
            start = zlib.crc32(key.encode()) % len(members)
        else:
            start = next(self._turns.setdefault(destination, itertools.count())) % len(members)
        ring = members[start:] + members[:start]
        if key is None and prefer is not None:
            ring = tuple(m for m in ring if m.broker == prefer) + tuple(
                m for m in ring if m.broker != prefer)
        return [m for m in ring if m.broker not in down] + [m for m in ring if m.broker in down]
