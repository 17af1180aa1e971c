"""mdb's names for WebLogic's: listeners, brokers and the app in snake case, destinations and
subscriptions in the characters mdb accepts there. Which characters those are is asked of
mdb's own validation (``Destination.parse``, ``ListenerOptions``), never written here again."""

from __future__ import annotations

import functools
import keyword
import re

from pydantic import ValidationError

from mdb import ConfigurationError, Destination
from mdb.listeners.options import ListenerOptions

_WORD_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake(name: str, fallback: str) -> str:
    """``OrderEventsMDB`` as ``order_events_mdb``: a Python identifier of letters, digits and
    ``_`` (``fallback`` when nothing of ``name`` is left), the form of a listener's, a broker's
    and an app's name (an environment variable's part too: ``MDB_BROKERS__JMS_A__URL``)."""
    words = _WORD_BREAK.sub("_", name)
    cleaned = "".join(c if c.isascii() and c.isalnum() else "_" for c in words).lower()
    cleaned = re.sub("_+", "_", cleaned).strip("_") or fallback
    if cleaned[0].isdigit():
        cleaned = f"{fallback}_{cleaned}"
    return f"{cleaned}_" if keyword.iskeyword(cleaned) else cleaned


def destination_name(name: str) -> str:
    """``name`` (a JMS module's, a JNDI or a broker's name) as the name of an mdb destination:
    ``/`` made ``.``, any other character mdb does not accept made ``_``."""
    return "".join(c if _destination_character(c) else "." if c == "/" else "_"
                   for c in name) or "_"


def subscription_part(name: str) -> str:
    """``name`` (a client id, a subscription name) as part of an mdb subscription name: any
    character mdb does not accept there made ``_``."""
    return "".join(c if _subscription_character(c) else "_" for c in name) or "_"


@functools.cache
def _destination_character(character: str) -> bool:
    try:
        Destination.parse(f"queue:{character}")
    except ConfigurationError:
        return False
    return True


@functools.cache
def _subscription_character(character: str) -> bool:
    if character in "{}":
        return False  # mdb's placeholders: a name's own braces would become one
    try:
        ListenerOptions(subscription=character)
    except ValidationError:
        return False
    return True
