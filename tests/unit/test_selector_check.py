"""What mdb checks of a queue listener's selector before connecting (``mdb subscriptions``
finds what the broker would refuse at ``mdb run``; docs/distribution.md)."""

from __future__ import annotations

import re

import pytest

from mdb.messages.selector import SelectorError
from mdb.messages.selector_check import check_broker_selector


@pytest.mark.parametrize("selector", [
    "region = 'eu'",
    "priority > 5 AND NOT urgent",
    "sku LIKE 'A%'",                              # JMS beyond mdb's subset: the broker's to parse
    "region IN ('eu', 'us') AND (qty * 2 > 10)",
    "price BETWEEN 1 AND 2",
])
def test_a_valid_selector_passes(selector: str) -> None:
    check_broker_selector(selector)


@pytest.mark.parametrize(("selector", "why"), [
    ("region = 'eu", "string literal is not closed"),
    ("", "empty"),
    ("region =", "expected"),
    ("sku LIKE 'A%", "string literal is not closed"),
    ("region IN ('eu', 'us'", "'(' is not closed"),
    ("qty * 2 > 10)", "')' closes no '('"),
])
def test_an_invalid_selector_is_refused_saying_why(selector: str, why: str) -> None:
    with pytest.raises(SelectorError, match=re.escape(why)):
        check_broker_selector(selector)
