"""Values as TOML writes them, for the settings file and for the report's text of a setting.

Only what a migration writes: strings, whole numbers, finite floats, booleans, and lists of
inline tables of these. Whatever came from the input is escaped as a TOML basic string (its
control characters as ``\\uXXXX``), so no input can end a line of the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def value(item: object) -> str:
    """``item`` as a TOML value."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int | float):
        return repr(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, Mapping):
        return "{ " + ", ".join(f"{k} = {value(v)}" for k, v in item.items()) + " }"
    if isinstance(item, Sequence):
        return "[" + ", ".join(value(v) for v in item) + "]"
    raise TypeError(f"mdb migrate writes no {type(item).__name__} to TOML")


def string(text: str) -> str:
    """``text`` as a TOML basic string."""
    escaped = []
    for character in text:
        if character in '"\\':
            escaped.append("\\" + character)
        elif ord(character) < 0x20 or ord(character) == 0x7F:
            escaped.append(f"\\u{ord(character):04X}")
        else:
            escaped.append(character)
    return '"' + "".join(escaped) + '"'
