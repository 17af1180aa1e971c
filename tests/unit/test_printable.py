"""What mdb writes for a terminal or a line-based reader out of text that is not its own
(``mdb.observability.redaction.printable``, ``printable_json``): no control character, bidirectional
formatting character or line or paragraph separator reaches it raw, and JSON keeps the value."""

from __future__ import annotations

import json
import unicodedata

import pytest

from mdb.observability.redaction import printable, printable_json

UNPRINTABLE = [
    "\x1b", "\x07", "\r", "\x7f", "\x85", "\x9b",  # C0, DEL, C1 (NEL, CSI)
    "\u2028", "\u2029",  # line and paragraph separators
    "\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\u061c",  # bidirectional formatting
    "\u200b", "\ufeff", "\U000e0001",  # zero width, a byte-order mark, a tag character
    "\u00a0", "\u3000",  # spaces a reader cannot tell from a space
]


@pytest.mark.parametrize("char", UNPRINTABLE, ids=lambda c: f"U+{ord(c):04X}")
def test_every_character_a_terminal_may_act_on_is_escaped(char: str) -> None:
    shown = printable(f"a{char}b")
    assert shown.isprintable() and shown == f"a{ascii(char)[1:-1]}b"
    line = printable_json({"k": f"a{char}b"})
    assert line.isprintable()
    assert char not in line and json.loads(line) == {"k": f"a{char}b"}


def test_text_of_any_script_and_its_line_feeds_when_asked_are_kept() -> None:
    text = "Zürich 東京 مرحبا 🙂\tx\ny"
    assert printable(text) == "Zürich 東京 مرحبا 🙂\\tx\\ny"
    assert printable(text, lines=True) == text
    assert printable_json(text) == json.dumps(text, ensure_ascii=False)
    assert all(unicodedata.category(c)[0] != "C" for c in printable(text))
