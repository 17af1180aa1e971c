"""Header names a JMS selector can name, and one warning per name it cannot.

A Java service picks messages with a JMS selector (``region = 'eu'``), and ActiveMQ turns each
header of a STOMP SEND into a JMS property of the same name. A selector names a property by a
JMS identifier: letters, digits, ``_`` and ``$``, not starting with a digit, not one of the
selector's words (``NULL``, ``TRUE``, ``FALSE``, ``NOT``, ``AND``, ``OR``, ``BETWEEN``,
``LIKE``, ``IN``, ``IS``, ``ESCAPE``, in any case), and not starting with ``JMS`` (reserved for
JMS's own; only the ``JMSX`` properties JMS defines are names). Any other name cannot be
written in a selector: ``order-id = '7'`` parses as ``order - id = '7'`` and silently matches
nothing. mdb's own headers are all identifiers (``mdb_content_type`` carries the content type,
see ``mdb.messages.headers``); a user's header that is not one gets a warning, once per name per
process, the first time a message carrying it is sent.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable

from mdb.messages.headers import CONTENT_TYPE

log = logging.getLogger("mdb.headers")

RESERVED = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN",
                      "IS", "ESCAPE"})
JMSX = frozenset({"JMSXUserID", "JMSXAppID", "JMSXDeliveryCount", "JMSXGroupID", "JMSXGroupSeq",
                  "JMSXProducerTXID", "JMSXConsumerTXID", "JMSXRcvTimestamp", "JMSXState"})
# Headers that are no property: STOMP headers ActiveMQ maps to JMS header fields (JMSReplyTo,
# JMSCorrelationID, JMSExpiration, JMSPriority, JMSDeliveryMode), and the content type, which
# mdb also writes under a selectable name.
NOT_PROPERTIES = frozenset({"reply-to", "correlation-id", "expires", "priority", "persistent",
                            CONTENT_TYPE})
MAX_WARNED = 1_000  # names remembered; a producer inventing names endlessly is not warned forever


@functools.lru_cache(maxsize=4_096)
def is_jms_identifier(name: str) -> bool:
    """True when a JMS selector can name a property called ``name`` (see the module docstring)."""
    if not name or name.upper() in RESERVED:
        return False
    if not (name[0].isalpha() or name[0] in "_$"):
        return False
    if not all(c.isalnum() or c in "_$" for c in name):
        return False
    return not name.startswith("JMS") or name in JMSX


_warned: set[str] = set()
_lock = threading.Lock()  # sends run on the event loop and in handlers' worker threads


def warn_unselectable(names: Iterable[str]) -> None:
    """Log a warning for each of ``names`` that a JMS selector cannot name, once per name."""
    for name in names:
        if name in NOT_PROPERTIES or is_jms_identifier(name):
            continue
        with _lock:
            if name in _warned or len(_warned) >= MAX_WARNED:
                continue
            _warned.add(name)
        log.warning("header %r is not a JMS identifier: a Java (JMS) selector cannot name it "
                    "and one that tries silently matches nothing; name it with letters, digits "
                    "and '_' (see docs/interop.md)", name)
