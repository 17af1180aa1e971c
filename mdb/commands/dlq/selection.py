"""``Selection``: which messages of an error destination an operation (list, replay, purge)
takes: by listener, error type, age, a selector on the headers, identities.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from mdb.commands.dlq.failed_message import Failed
from mdb.errors import ConfigurationError
from mdb.messages.selector import Matcher, SelectorError, compile_selector
from mdb.observability.redaction import printable


@dataclass(frozen=True, slots=True)
class Selection:
    """Which messages of an error destination an operation takes: those that match every
    criterion given. ``older_than``/``newer_than`` compare with ``mdb_failed_at`` (a message
    without it is neither); ``selector`` is a JMS selector on the headers, evaluated by mdb
    (the subset of ``mdb.messages.selector``) on every broker alike; ``ids`` are identities as they
    are, or as ``printable`` shows them (what an operator copied from a listing)."""

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
        if self.ids and failed.id not in self.ids and printable(failed.id) not in self.ids:
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
