"""Who may act on the console: the holder of the control token (setting
``control_token_file``, the one the containers check), once logged in.

The login form posts the token; a right one opens a session: a random id in an ``HttpOnly``,
``SameSite=Strict`` cookie, and a CSRF token of the session that every form of the console
carries. An action (a ``POST`` other than the login) is done only when it brings both the
session's cookie and its CSRF token (compared in constant time); else it is answered 403 and
nothing changes. Without a token configured there is no login, and no action. Reading the
pages needs a session too when the console listens beyond this machine (``bind`` not a loopback
address, which needs the token: ``mdb.commands.console.console_command``).

Sessions live in the console's memory (a restart logs every one out), ``MAX_SESSIONS`` at most
(the oldest goes first) and ``SESSION_SECONDS`` each."""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr

from mdb.commands.console.html import escape

COOKIE = "mdb_console"
MAX_SESSIONS = 64
SESSION_SECONDS = 12 * 3600.0


@dataclass(frozen=True)
class LoginSession:
    id: str
    csrf: str
    ends: float

    def field(self) -> str:
        """The hidden field every form of this session carries."""
        return f'<input type="hidden" name="csrf" value="{escape(self.csrf)}">'


class Auth:
    """The sessions of the console whose control token is ``token`` (None: control off);
    ``open_reading``: the pages may be read without a session."""

    def __init__(self, token: SecretStr | None, open_reading: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._token = token
        self.open_reading = open_reading
        self._clock = clock
        self._sessions: OrderedDict[str, LoginSession] = OrderedDict()

    @property
    def control(self) -> bool:
        """Whether actions are possible at all (a token is configured)."""
        return self._token is not None

    def login(self, given: str) -> LoginSession | None:
        """A new session when ``given`` is the token, else None."""
        if self._token is None or not hmac.compare_digest(
                given.encode(), self._token.get_secret_value().encode()):
            return None
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.popitem(last=False)
        session = LoginSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                          self._clock() + SESSION_SECONDS)
        self._sessions[session.id] = session
        return session

    def session(self, cookie_header: str) -> LoginSession | None:
        """The live session the request's ``Cookie`` header names, if any."""
        for part in cookie_header.split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                session = self._sessions.get(value)
                if session is not None and session.ends > self._clock():
                    return session
                self._sessions.pop(value, None)
        return None

    def may_act(self, session: LoginSession | None, csrf: str) -> bool:
        """Whether a ``POST`` with ``session`` and the form's ``csrf`` field may be done."""
        return session is not None and hmac.compare_digest(csrf.encode(), session.csrf.encode())

    def logout(self, session: LoginSession) -> None:
        self._sessions.pop(session.id, None)


def set_cookie(session: LoginSession | None) -> tuple[str, str]:
    """The ``Set-Cookie`` header that keeps ``session``, or ends the one the browser has."""
    if session is None:
        return "Set-Cookie", f"{COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"
    return "Set-Cookie", (f"{COOKIE}={session.id}; Max-Age={int(SESSION_SECONDS)}; Path=/; "
                          "HttpOnly; SameSite=Strict")
