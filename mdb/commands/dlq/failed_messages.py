"""The failed-message workflow on the error destinations an operator names: one implementation
for ``mdb dlq`` (``failed_command``) and the console's page (``mdb.commands.console.failed_pages``),
over ``mdb.commands.dlq.failed.ErrorDestination`` (docs/failed-messages.md).

What a person reads a page at a time is bounded: ``counts`` reads at most ``COUNT_LIMIT``
messages of a destination, ``page`` at most ``COUNT_LIMIT`` past its offset."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from mdb.commands.dlq.failed import Done, ErrorDestination, Leaving, Progress
from mdb.commands.dlq.failed_message import Failed
from mdb.commands.dlq.selection import EVERYTHING, Selection
from mdb.config.settings import Settings
from mdb.container.wiring import find_listeners, import_modules
from mdb.errors import ConfigurationError
from mdb.messages.destinations import Destination
from mdb.routing.brokers import Brokers, refuse_embedded
from mdb.routing.planning import plan_listeners

COUNT_LIMIT = 10_000
"""Messages of one error destination ``counts`` and ``page`` read at most."""


@dataclass(frozen=True, slots=True)
class Counts:
    """The messages of an error destination per failure type (``types``, most first)."""

    destination: Destination
    types: tuple[tuple[str, int], ...]
    total: int
    complete: bool
    """False when it holds more than ``COUNT_LIMIT``: these are the counts of the first ones."""


@dataclass(frozen=True, slots=True)
class Page:
    """``rows``: the messages of an error destination from ``offset`` on, of one failure type
    or of all (``error_type`` None); ``more``: there are others after them."""

    destination: Destination
    rows: tuple[Failed, ...]
    offset: int
    error_type: str | None
    more: bool


class FailedMessages:
    """The error destinations ``destinations``, each as ``ErrorDestination`` reads and changes
    it. ``sealing``: the settings whose identity secret a replay proves with, as the
    application's containers prove theirs (``database_seal``), and the brokers it sends on;
    None (a test's error destinations) proves with the seal the brokers have."""

    def __init__(self, destinations: Sequence[ErrorDestination],
                 sealing: tuple[Settings, Brokers] | None = None) -> None:
        self.destinations = tuple(destinations)
        self._sealing = sealing

    @classmethod
    def of(cls, settings: Settings, names: Sequence[str] = (), modules: Sequence[str] = (),
           *, command: str = "mdb dlq") -> FailedMessages:
        """The error destinations ``names`` (``queue:NAME``), else those of the listeners of
        ``modules``, each once, on the brokers of ``settings``; a replay from them sends back
        where those listeners consume, else where a destination's name says
        (``mdb.commands.dlq.failed.named_origins``). ``command`` names the caller in the
        errors."""
        specs = ([spec for spec, _ in plan_listeners(
            settings, find_listeners(import_modules(list(modules))))] if modules else [])
        found = ([Destination.parse(name) for name in names] if names
                 else [spec.error_destination for spec in specs])
        origins = [spec.destination for spec in specs] if modules else None
        brokers = Brokers(settings)
        unique = list(dict.fromkeys(found))
        errors = [ErrorDestination(brokers, name, f"{settings.app}.{settings.server}.dlq",
                                   origins=origins) for name in unique]
        for name in unique:
            refuse_embedded(settings, name, f"{command} {name}", "its error destinations are "
                            "out of reach from here; set brokers.<name>.url to a real broker "
                            "(docs/activemq.md), or read them in a test (mdb.testing: "
                            "docs/failed-messages.md)")
        return cls(errors, (settings, brokers))

    def find(self, destination: Destination | str) -> ErrorDestination | None:
        """The error destination of that name among these; None when it is not one of them
        (or no destination's name at all)."""
        try:
            wanted = (destination if isinstance(destination, Destination)
                      else Destination.parse(destination))
        except ConfigurationError:
            return None
        return next((d for d in self.destinations if d.destination == wanted), None)

    def _chosen(self, destination: Destination | None) -> tuple[ErrorDestination, ...]:
        if destination is None:
            return self.destinations
        found = self.find(destination)
        if found is None:
            names = ", ".join(str(d.destination) for d in self.destinations)
            raise ConfigurationError(f"{destination} is not one of the error destinations "
                                     f"named here ({names})")
        return (found,)

    async def list(self, selection: Selection = EVERYTHING,
                   destination: Destination | None = None) -> AsyncGenerator[Failed, None]:
        """The selected messages of each error destination (or of ``destination``), in turn."""
        for errors in self._chosen(destination):
            async with aclosing(errors.list(selection)) as listed:
                async for failed in listed:
                    yield failed

    async def counts(self, destination: Destination) -> Counts:
        """How many messages of each failure type ``destination`` holds (the first
        ``COUNT_LIMIT``)."""
        counted: Counter[str] = Counter()
        complete = True
        async with aclosing(self.list(destination=destination)) as listed:
            async for failed in listed:
                if counted.total() == COUNT_LIMIT:
                    complete = False
                    break
                counted[failed.error_type] += 1
        return Counts(destination, tuple(counted.most_common()), counted.total(), complete)

    async def page(self, destination: Destination, offset: int, limit: int,
                   error_type: str | None = None) -> Page:
        """At most ``limit`` messages of ``destination`` from ``offset`` (at most
        ``COUNT_LIMIT``), in its order, of failure type ``error_type`` or of any."""
        offset = max(0, min(offset, COUNT_LIMIT))
        rows: list[Failed] = []
        more = False
        selection = Selection(error_type=error_type)
        async with aclosing(self.list(selection, destination)) as listed:
            position = 0
            async for failed in listed:
                if len(rows) == limit:
                    more = True
                    break
                if position >= offset:
                    rows.append(failed)
                position += 1
        return Page(destination, tuple(rows), offset, error_type, more)

    async def show(self, message_id: str, destination: Destination | None = None) -> Failed:
        """The message of identity ``message_id`` (as it is, or as ``printable`` shows it) on
        the first error destination (or on ``destination``) that holds it;
        ConfigurationError when none does."""
        chosen = self._chosen(destination)
        for errors in chosen:
            try:
                return await errors.show(message_id)
            except ConfigurationError:
                continue
        names = ", ".join(str(d.destination) for d in chosen)
        raise ConfigurationError(f"no message {message_id!r} on {names}")

    async def replay(self, selection: Selection = EVERYTHING, *,
                     destination: Destination | None = None, to: Destination | None = None,
                     dry_run: bool = False, rate: float | None = None,
                     progress: Progress | None = None, left: Leaving | None = None) -> Done:
        """``ErrorDestination.replay`` on each error destination (or on ``destination``)."""
        chosen = self._chosen(destination)
        if self._sealing is not None:
            settings, brokers = self._sealing
            if settings.databases:  # else no database's secret, and no SQLAlchemy to import
                from mdb.exactly_once.store import database_seal

                if (seal := await database_seal(settings)) is not None:
                    brokers.seal = seal
        done = Done()
        for errors in chosen:
            _add(done, await errors.replay(selection, to=to, dry_run=dry_run, rate=rate,
                                           progress=progress, left=left))
        return done

    async def purge(self, selection: Selection = EVERYTHING, *,
                    destination: Destination | None = None, dry_run: bool = False,
                    progress: Progress | None = None) -> Done:
        """``ErrorDestination.purge`` on each error destination (or on ``destination``)."""
        done = Done()
        for errors in self._chosen(destination):
            _add(done, await errors.purge(selection, dry_run=dry_run, progress=progress))
        return done


def _add(done: Done, found: Done) -> None:
    done.taken += found.taken
    done.moved_back += found.moved_back
    done.left += found.left
