"""Keeping secrets out of what mdb shows (plan tables, errors, logs, spans and status pages),
and control characters out of the lines it writes for terminals and log files."""

from __future__ import annotations

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


# A query parameter holding a secret: named ``password``, ``sslpassword``, ``passwd``, ``pwd``,
# ``token``, ``client_secret``... Its value runs to the next ``&`` (SQLAlchemy and asyncpg read
# a ``#`` or ``;`` as part of it) or, in free text, to a space or a quote.
_SECRET_NAME = r"([?&;][^=&#\s'\"]*(?:pass|pwd|secret|token)[^=&#\s'\"]*=)"
_URL_QUERY_SECRET = re.compile(_SECRET_NAME + r"[^&]*", re.IGNORECASE)
_TEXT_QUERY_SECRET = re.compile(_SECRET_NAME + r"[^&\s'\"]*", re.IGNORECASE)

# A password in a URL's user-info (``scheme://user:PASSWORD@host``, up to the last ``@`` of the
# word: a password may hold one), and a STOMP ``passcode`` header as a frame is logged: up to
# the end of its line, a newline or, in the repr of the frame's lines that stomp.py logs, an
# escaped one (quotes may be part of the password).
_URL_PASSWORD = re.compile(r"(://[^/:@\s'\"]*:)[^\s'\"]*(@)")
_PASSCODE = re.compile(r"(passcode:).*?(?=\\n|\n|$)")


def mask_secrets(text: str) -> str:
    """``text`` with every URL password (in a user-info or a query) and STOMP passcode in it
    replaced by ``***``: for text mdb did not write itself (a library's log line, a frame)."""
    text = _TEXT_QUERY_SECRET.sub(rf"\g<1>{MASK}", text)
    return _PASSCODE.sub(rf"\g<1>{MASK}", _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", text))


# C0 controls, DEL, C1 controls (U+0085 among them), and the Unicode line and paragraph
# separators: what ends a line (str.splitlines, JavaScript, some log viewers) or drives a
# terminal (ESC, and CSI U+009B: an ESC[2J clears the screen). Written as a Python string
# literal writes them: \n, \x1b, \x85, \u2028.
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
_ESCAPED = {c: repr(chr(c))[1:-1] for c in _CONTROLS}
_ESCAPED_BUT_LINES = {c: e for c, e in _ESCAPED.items() if chr(c) not in "\n\t"}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``,
    ``\\u2028``): one line that cannot drive a terminal, for text that is not mdb's own (a
    message id, an exception's text, a file name). ``lines``: line feeds and tabs are kept,
    for text whose lines are the caller's to set apart (``mdb.logs.TextLines``)."""
    return text.translate(_ESCAPED_BUT_LINES if lines else _ESCAPED)
