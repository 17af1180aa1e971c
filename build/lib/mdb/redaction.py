"""Keeping secrets out of what mdb shows: plan tables, errors, logs, spans and status pages."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with the password of its user-info replaced by ``***`` (the user name is kept: it
    says who connects, which an operator needs). A URL that does not parse is returned masked
    whole after its scheme, since it may hold a secret in a place mdb cannot find."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        scheme, _, _ = url.partition("://")
        return f"{scheme}://{MASK}"
    if password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    user = parts.username or ""
    netloc = f"{user}:{MASK}@{host}"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# A password in a URL's user-info (``scheme://user:PASSWORD@host``), and a STOMP ``passcode``
# header as a frame is logged: up to the end of its line, a newline or, in the repr of the
# frame's lines that stomp.py logs, an escaped one (quotes may be part of the password).
_URL_PASSWORD = re.compile(r"(://[^/:@\s'\"]*:)[^@\s'\"]*(@)")
_PASSCODE = re.compile(r"(passcode:).*?(?=\\n|\n|$)")


def mask_secrets(text: str) -> str:
    """``text`` with every URL password and STOMP passcode in it replaced by ``***``: for text
    mdb did not write itself (a library's log line, a frame)."""
    return _PASSCODE.sub(rf"\g<1>{MASK}", _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", text))
