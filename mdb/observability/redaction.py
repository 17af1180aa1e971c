"""Keeping secrets out of what mdb shows (plan tables, errors, logs, spans and status pages),
and control characters out of the lines it writes for terminals and log files."""

from __future__ import annotations

import base64
import binascii
import json
import re

MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with the password of its user-info replaced by ``***`` (the user name is kept: it
    says who connects, which an operator needs), and so is the value of every query parameter
    whose name says it holds a secret (``_SECRET_NAME``): asyncpg and libpq take
    ``?user=u&password=...`` as well as a user-info.

    Found by text, not by a URL parser: a password may hold an unencoded ``/``, ``?`` or ``#``
    (a base64 one often does), and a parser then ends the user-info there and reads the
    password as the host, the port or the path. The user-info is therefore everything between
    ``://`` and the last ``@`` (a password may hold an ``@`` too), and the user name what comes
    before its first ``:``. A ``@`` in a path or query masks more than needed, never less."""
    scheme, sep, rest = url.partition("://") if "://" in url else ("", "", url)
    userinfo, at, location = rest.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        url = f"{scheme}{sep}{user}{':' + MASK if colon else ''}@{location}"
    return _URL_QUERY_SECRET.sub(rf"\g<1>{MASK}", url)


def check_userinfo(url: str) -> None:
    """ValueError when ``url`` has an ``@`` after its host part: a user name or password
    holding an unencoded ``/``, ``?`` or ``#``, which every URL parser would read as the host
    (or a path holding an unencoded ``@``)."""
    rest = url.partition("://")[2]
    host_end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    if "@" in rest[host_end:]:
        raise ValueError(
            "an '@' after a '/', '?' or '#': percent-encode these in a user name or password "
            "('/' as %2F, '?' as %3F, '#' as %23, '@' as %40), or give the password in "
            "`password` or `password_file` instead of the URL")


# A name saying its value is a secret, the same in a URL's query, in ``name=value`` and
# ``name: value``, in JSON and a Python dict's repr (``"name": "value"``) and as a header's
# name: ``password``, ``sslpassword``, ``DB_PASSWORD``, ``passwd``, ``pwd``, ``client_secret``,
# ``access_token``, ``x-api-key``, ``credentials``, ``Authorization``... and ``pass`` alone
# (not "passed" nor "bypass").
_NAME = (r"(?:[\w.-]*(?:password|passwd|passphrase|passcode|pwd|secret|token|api[-_]?key"
         r"|access[-_]?key|private[-_]?key|credentials?|authorization)[\w.-]*|pass)")
_SECRET_NAME = re.compile(_NAME, re.IGNORECASE)

# A query parameter holding a secret. Its value runs to the next ``&`` (SQLAlchemy and asyncpg
# read a ``#`` or ``;`` as part of it) or, in free text, to a space or a quote.
_QUERY_NAME = rf"([?&;]{_NAME}=)"
_URL_QUERY_SECRET = re.compile(_QUERY_NAME + r"[^&]*", re.IGNORECASE)
_TEXT_QUERY_SECRET = re.compile(_QUERY_NAME + r"[^&\s'\"]*", re.IGNORECASE)

# A password in a URL's user-info (``scheme://user:PASSWORD@host``, up to the last ``@`` of the
# word: a password may hold one), and a STOMP ``passcode`` header as a frame is logged: up to
# the end of its line, a newline or, in the repr of the frame's lines that stomp.py logs, an
# escaped one (quotes may be part of the password).
_URL_PASSWORD = re.compile(r"(://[^/:@\s'\"]*:)[^\s'\"]*(@)")
_PASSCODE = re.compile(r"(passcode:).*?(?=\\n|\n|$)")
# A secret by its name: ``name=value`` or ``name: value``, the name perhaps quoted as JSON and
# a Python dict's repr quote it, the value quoted (up to its closing quote, escapes within
# included) or up to a space or an ``&`` (a form's next field), with an HTTP authorization
# scheme's word before it; not a value masked already (a passcode, up to its line's end), nor
# a file's name in a path, nor a setting mdb's own errors name (``setting brokers.main.password:
# Input should be a valid string``: they never show a setting's value).
_KEYED = re.compile(
    rf"""(?P<name>(?<![\w./-])(?<!setting )(?P<q>["']?){_NAME}(?P=q)\s*[:=]\s*)"""
    r"""(?!\*\*\*(?:[\s&"'\\]|$))"""
    r"""(?:(?P<quote>["'])(?:(?!(?P=quote))[^\\]|\\.)*(?P=quote)"""
    r"""|(?:(?:bearer|basic|digest|negotiate)\s+)?[^\s&]+)""",
    re.IGNORECASE)
# An HTTP credential without its header's name: a bearer token (eight characters at least:
# "Bearer token expired" holds none), or Basic's base64 of ``user:password``.
_BEARER = re.compile(r"\b(Bearer\s+)[\w.~+/=-]{8,}", re.IGNORECASE)
_BASIC = re.compile(r"\b(Basic\s+)([A-Za-z0-9+/]{4,}={0,2})(?![\w+/=])", re.IGNORECASE)
# Digits that may hold a payment card's number: groups of three or more, apart by one space or
# dash, neither inside a word or an id nor next to a dash (``card_numbers`` picks them out).
_DIGITS = re.compile(r"(?<![\w-])\d{3,}(?:[ -]\d{3,})*(?![\w-])")
_GROUP = re.compile(r"\d+")


def mask_secrets(text: str) -> str:
    """``text`` with every secret mdb can tell in it replaced by ``***`` (the rules are
    docs/security.md's, "Secrets"): a URL's password, in its user-info or a query parameter
    whose name says it holds one (``_NAME``); the value of such a name written ``name=value``,
    ``name: value`` or as JSON and a Python dict write it; a STOMP passcode; an HTTP bearer or
    basic credential; a payment card's number (``card_numbers``). For text mdb did not write
    itself: an exception's, a library's log line, a frame, a header. Masking twice changes
    nothing more."""
    text = _TEXT_QUERY_SECRET.sub(rf"\g<1>{MASK}", text)
    text = _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", text)
    text = _PASSCODE.sub(rf"\g<1>{MASK}", text)
    text = _KEYED.sub(_masked_value, text)
    text = _BEARER.sub(rf"\g<1>{MASK}", text)
    text = _BASIC.sub(_masked_basic, text)
    return _DIGITS.sub(_masked_cards, text)


def secret_name(name: str) -> bool:
    """Whether ``name`` (a header's, a setting's) says its value is a secret (``_NAME``)."""
    return _SECRET_NAME.fullmatch(name) is not None


def _masked_value(found: re.Match[str]) -> str:
    quote = found["quote"] or ""
    return f"{found['name']}{quote}{MASK}{quote}"


def _masked_basic(found: re.Match[str]) -> str:
    try:
        credential = base64.b64decode(found[2], validate=True)
    except binascii.Error:
        return found[0]
    return found[1] + MASK if b":" in credential else found[0]


def _masked_cards(found: re.Match[str]) -> str:
    digits = found[0]
    for start, end in reversed(card_numbers(digits)):
        digits = digits[:start] + MASK + digits[end:]
    return digits


def card_numbers(digits: str) -> list[tuple[int, int]]:
    """Where ``digits`` (groups of digits apart by a space or a dash) hold payment card
    numbers, as (start, end) spans: runs of whole groups, the longest first, of 13 to 19
    digits that start with 2 to 6 (the payment networks' first digits: a time in milliseconds
    or nanoseconds, which starts with 1 until 2033, is none) and pass the Luhn check (an order
    id of 16 digits most likely fails it)."""
    groups = [(g.start(), g.end()) for g in _GROUP.finditer(digits)]
    found: list[tuple[int, int]] = []
    first = 0
    while first < len(groups):
        for last in range(len(groups) - 1, first - 1, -1):
            number = "".join(digits[a:b] for a, b in groups[first:last + 1])
            if 13 <= len(number) <= 19 and number[0] in "23456" and _luhn(number):
                found.append((groups[first][0], groups[last][1]))
                first = last
                break
        first += 1
    return found


def _luhn(number: str) -> bool:
    total = 0
    for place, digit in enumerate(map(int, reversed(number))):
        if place % 2:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character ``str.isprintable`` calls unprintable written as an escape,
    as a Python string literal writes it (``\\n``, ``\\x1b``, ``\\x9b``, ``\\u2028``,
    ``\\u202e``): one line that cannot drive a terminal, for text that is not mdb's own (a
    message id, an exception's text, a file name). Those are the C0 and C1 controls and DEL
    (ESC and CSI drive a terminal: an ESC[2J clears the screen), what ends a line besides a
    line feed (U+0085, U+2028, U+2029: str.splitlines, JavaScript and some log viewers take
    them for one), the bidirectional and other format characters (U+202E shows what follows
    right to left), and every space but U+0020 (a reader cannot tell them from it).
    ``lines``: line feeds and tabs are kept, for text whose lines are the caller's to set
    apart (``mdb.observability.logs.TextLines``)."""
    if text.isprintable():
        return text
    kept = "\n\t" if lines else ""
    return "".join(c if c.isprintable() or c in kept else repr(c)[1:-1] for c in text)


def printable_json(value: object) -> str:
    """``value`` as one line of JSON with no character raw that ``printable`` escapes: each is
    a JSON escape (``\\u202e``; a pair of them past U+FFFF), so that a reader decodes the
    value as it was and a terminal shows it inert. Text of any script stays as it is."""
    text = json.dumps(value, ensure_ascii=False)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _json_escape(ord(c)) for c in text)


def _json_escape(code: int) -> str:
    if code > 0xFFFF:  # as UTF-16 writes it: JSON's escapes have four digits
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"
