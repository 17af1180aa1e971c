"""Logical destinations, written ``queue:NAME`` or ``topic:NAME``."""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass

from mdb.errors import ConfigurationError


class Kind(enum.StrEnum):
    QUEUE = "queue"
    TOPIC = "topic"


# Letters, digits and . _ - only: every broker accepts these in a destination name, and they
# survive being embedded in subscription names and STOMP paths.
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_KINDS = {kind.value: kind for kind in Kind}


@dataclass(frozen=True, slots=True)
class Destination:
    kind: Kind
    name: str

    @classmethod
    def parse(cls, text: str | Destination) -> Destination:
        """Parse ``queue:NAME`` / ``topic:NAME``; raise ConfigurationError saying what is valid."""
        if isinstance(text, Destination):
            return text
        return _parsed(str(text))

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.name}"

    @property
    def error_queue(self) -> Destination:
        """``queue:NAME.DLQ``: where what fails on its way to this destination goes when nobody
        named another (a listener's ``error_destination``, a refused outbox row's)."""
        return Destination(Kind.QUEUE, f"{self.name}.DLQ")


# A handler names its destination as text on every send: parsed once per text, not per send.
@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> Destination:
    prefix, sep, name = text.partition(":")
    kind = _KINDS.get(prefix)
    if not sep or kind is None:
        raise ConfigurationError(
            f"destination {text!r} must be written 'queue:NAME' or 'topic:NAME'"
        )
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"destination {text!r}: the name may contain only letters, digits, '.', '_' and '-'"
        )
    return Destination(kind, name)
