"""mdb.messages.selector's AND and OR in three-valued logic, and where its error sits in the tree
(the grammar's other cases: tests/adapters/test_memory_broker.py)."""

from __future__ import annotations

import pytest

from mdb.errors import ConfigurationError, MdbError
from mdb.messages.selector import SelectorError, compile_selector


@pytest.mark.parametrize(
    ("selector", "headers", "matches"),
    [
        # NOT tells FALSE from unknown: NOT FALSE is TRUE, NOT unknown stays unknown.
        ("NOT (a = 1 OR b = 2)", {"a": "0", "b": "0"}, True),  # FALSE OR FALSE
        ("NOT (a = 1 OR b = 2)", {"a": "0"}, False),  # FALSE OR unknown is unknown
        ("a = 1 OR b = 2", {"a": "1"}, True),  # TRUE OR unknown is TRUE
        ("NOT (a = 1 AND b = 2)", {"a": "0"}, True),  # FALSE AND unknown is FALSE
        ("NOT (a = 1 AND b = 2)", {"a": "1"}, False),  # TRUE AND unknown is unknown
        ("a = 1 AND b = 2 AND c = 3", {"a": "1", "b": "2", "c": "3"}, True),
        ("a = 1 OR b = 2 AND c = 3", {"a": "1", "b": "0"}, True),  # AND binds tighter
        ("(a = 1 OR b = 2) AND c = 3", {"a": "1", "b": "0"}, False),
    ],
)
def test_and_and_or_follow_sql_three_valued_logic(selector: str, headers: dict[str, str],
                                                  matches: bool) -> None:
    assert compile_selector(selector)(headers) is matches


def test_a_selector_outside_the_subset_is_a_configuration_error_naming_the_word() -> None:
    with pytest.raises(SelectorError, match="LIKE is not in the supported subset") as caught:
        compile_selector("a LIKE 'x%'")
    assert isinstance(caught.value, ConfigurationError) and isinstance(caught.value, MdbError)
    assert isinstance(caught.value, ValueError)  # as before it joined the tree
