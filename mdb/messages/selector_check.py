"""The check mdb makes, before connecting, of a selector that a broker evaluates (a queue
listener's): so that ``mdb subscriptions`` finds what ``mdb run`` would otherwise only learn
from the broker's refusal of the SUBSCRIBE.

A selector written in the subset ``mdb.messages.selector`` evaluates is checked completely: when mdb
cannot parse it, it is not valid JMS either. A selector that uses JMS beyond the subset (``LIKE``,
``IN``, ``BETWEEN``, ``ESCAPE``, arithmetic) is the broker's to parse; mdb checks only what every
selector must have — closed string literals and balanced parentheses — and the broker checks
the rest when ``mdb run`` subscribes (a refusal then exits 3).
"""

from __future__ import annotations

import re

from mdb.messages.selector import SelectorError, compile_selector

_STRING = re.compile(r"'(?:[^']|'')*'")
_BEYOND_SUBSET = re.compile(r"\b(?:LIKE|IN|BETWEEN|ESCAPE)\b|[*/+,-]", re.IGNORECASE)


def check_broker_selector(text: str) -> None:
    """Raise SelectorError (saying where and why) for a selector no JMS broker accepts, as far
    as mdb can tell; see the module docstring."""
    try:
        compile_selector(text)
        return
    except SelectorError as error:
        outside_strings = _STRING.sub("''", text)
        if "'" in outside_strings.replace("''", ""):
            raise SelectorError("a string literal is not closed") from None
        if not _BEYOND_SUBSET.search(outside_strings):
            raise error from None
    depth = 0
    for char in outside_strings:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            raise SelectorError("a ')' closes no '('")
    if depth:
        raise SelectorError("a '(' is not closed")
