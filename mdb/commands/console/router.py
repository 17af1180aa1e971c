"""The console's routes, on its event loop: every request is read by the probe server
(``mdb.serving.http.server``: bounded connections, request size and time) and answered here.

``GET /`` the overview (``fleet_pages``); ``GET /console.css`` its style; ``GET /login`` and
``POST /login`` (form field ``token``), ``POST /logout``; ``POST
/containers/<index>/listeners/<name>/pause`` (and ``/resume``), forwarded to that container
with the control token; ``GET /failed...`` and ``POST /failed/<destination>/replay`` (and
``/purge``), the failed messages (``failed_pages``); ``POST /subscriptions/delete`` (form
fields ``broker``, ``destination``, ``name``), the cleanup of an abandoned durable subscription
(``subscription_pages``). Every ``POST`` but the login needs the
session and its CSRF token (``auth``), or is answered 403 and nothing changes; every answer
carries ``POLICY`` and headers that keep it out of frames and caches."""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Protocol

from mdb.commands.console.auth import Auth, LoginSession, set_cookie
from mdb.commands.console.fleet_pages import overview
from mdb.commands.console.html import escape, quoted
from mdb.commands.console.pages import POLICY, STYLE, Fragment, layout
from mdb.commands.console.poller import Fleet
from mdb.commands.console.subscription_pages import (
    DurableSubscription,
    Subscriptions,
    subscriptions_body,
)
from mdb.errors import BrokerError
from mdb.observability.health import ListenerHealth
from mdb.serving.http.server import Answer, HttpRequest

MAX_FORM_BYTES = 65_536
"""The largest body a form may post (the probe server refuses a larger one, 413)."""
MAX_FIELDS = 1_000
"""Fields of a form (the ids of a selection of failed messages) at most."""
HEADERS = (("Content-Security-Policy", POLICY), ("X-Frame-Options", "DENY"),
           ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
           ("Cache-Control", "no-store"))

Control = Callable[[str, str, str], Awaitable[tuple[bool, str]]]
"""Pause or resume a listener of a container: (its URL, the listener, ``pause`` or
``resume``) to whether it was done and the container's words."""


class FailedRoutes(Protocol):
    """The failed messages' pages and actions (``mdb.commands.console.failed_pages``)."""

    async def index(self, csrf: str) -> Fragment: ...

    async def destination(self, destination: str, query: Mapping[str, Sequence[str]],
                          csrf: str) -> Fragment: ...

    async def message(self, destination: str, message_id: str, csrf: str) -> Fragment: ...

    async def replay(self, destination: str, ids: Sequence[str]) -> Fragment: ...

    async def purge(self, destination: str, ids: Sequence[str]) -> Fragment: ...

    async def close(self) -> None: ...


class Router:
    """Answers the console's requests from ``fleet``'s last reads; actions go through
    ``control``, ``failed`` and ``subscriptions``."""

    def __init__(self, fleet: Fleet, auth: Auth, control: Control,
                 failed: FailedRoutes, subscriptions: Subscriptions) -> None:
        self._fleet = fleet
        self._auth = auth
        self._control = control
        self._failed = failed
        self._subscriptions = subscriptions

    async def answer(self, request: HttpRequest) -> Answer:
        parts = [urllib.parse.unquote(part) for part in request.path.strip("/").split("/")]
        path = "/" + "/".join(parts)
        session = self._auth.session(request.headers.get("cookie", ""))
        if request.method == "GET" and path == "/console.css":
            return Answer(HTTPStatus.OK, "text/css; charset=utf-8", STYLE.encode(), HEADERS)
        if request.method == "POST":
            return await self._post(request, parts, session)
        if path == "/login" or not (self._auth.open_reading or session):
            return self._login_page(session)
        csrf = session.field() if session else ""
        if path == "/":
            durable = subscriptions_body(self._subscriptions.of(self._fleet.seen),
                                         self._cleanup_form(session))
            page = overview(self._fleet, self._fleet.clock(), self._actions(session), durable)
            return self._page(page, session, refresh=self._fleet.refresh)
        if parts[0] == "failed" and len(parts) <= 3:
            try:
                query = urllib.parse.parse_qs(request.query, max_num_fields=MAX_FIELDS)
            except ValueError:
                return self._page(Fragment("Bad request", "<p>Too many query fields.</p>",
                                           HTTPStatus.BAD_REQUEST), session)
            fragment = await self._run(
                self._failed.index(csrf) if len(parts) == 1
                else self._failed.destination(parts[1], query, csrf) if len(parts) == 2
                else self._failed.message(parts[1], parts[2], csrf))
            return self._page(fragment, session)
        return self._page(Fragment("Not found", f"<p>No page {escape(path)}.</p>",
                                   HTTPStatus.NOT_FOUND), session)

    async def _post(self, request: HttpRequest, parts: Sequence[str],
                    session: LoginSession | None) -> Answer:
        path = "/" + "/".join(parts)
        try:
            form = urllib.parse.parse_qs(request.body.decode(), max_num_fields=MAX_FIELDS,
                                         strict_parsing=bool(request.body))
        except (UnicodeDecodeError, ValueError):
            return self._page(Fragment("Bad request", "<p>The form could not be read.</p>",
                                       HTTPStatus.BAD_REQUEST), session)
        if path == "/login":
            return self._login(form.get("token", [""])[0])
        if not self._auth.may_act(session, form.get("csrf", [""])[0]):
            return self._page(Fragment("Forbidden", "<p>An action needs a login with the "
                                       "control token, from a page of this console.</p>",
                                       HTTPStatus.FORBIDDEN), session)
        assert session is not None
        if path == "/logout":
            self._auth.logout(session)
            return Answer(HTTPStatus.SEE_OTHER, "text/plain", b"",
                          (*HEADERS, ("Location", "/"), set_cookie(None)))
        if (len(parts) == 5 and parts[0] == "containers" and parts[2] == "listeners"
                and parts[4] in ("pause", "resume")):
            return await self._pause(parts[1], parts[3], parts[4], session)
        if path == "/subscriptions/delete":
            broker, destination, name = (form.get(key, [""])[0]
                                         for key in ("broker", "destination", "name"))
            return self._page(await self._subscriptions.clean_up(
                self._fleet.seen, broker, destination, name), session)
        if len(parts) == 3 and parts[0] == "failed" and parts[2] in ("replay", "purge"):
            act = self._failed.replay if parts[2] == "replay" else self._failed.purge
            return self._page(await self._run(act(parts[1], form.get("ids", []))), session)
        return self._page(Fragment("Not found", f"<p>No action {escape(path)}.</p>",
                                   HTTPStatus.NOT_FOUND), session)

    async def _pause(self, index: str, listener: str, action: str,
                     session: LoginSession) -> Answer:
        seen = self._fleet.seen
        if not index.isdigit() or int(index) >= len(seen):
            return self._page(Fragment("Not found", f"<p>No container {escape(index)}.</p>",
                                       HTTPStatus.NOT_FOUND), session)
        url = seen[int(index)].url
        done, said = await self._control(url, listener, action)
        if not done:
            return self._page(Fragment(
                f"Not {action}d", f'<p class="error">{escape(url)}: {escape(said)}</p>',
                HTTPStatus.BAD_GATEWAY), session)
        await self._fleet.read(int(index))  # the page shows what was done
        return Answer(HTTPStatus.SEE_OTHER, "text/plain", b"",
                      (*HEADERS, ("Location", "/#listeners")))

    def _actions(self, session: LoginSession | None) -> Callable[[int, ListenerHealth], str]:
        def forms(index: int, listener: ListenerHealth) -> str:
            if session is None:
                return ""
            action = "resume" if listener.paused else "pause"
            return (f'<form method="post" action="/containers/{index}/listeners/'
                    f'{escape(quoted(listener.name))}/{action}">{session.field()}'
                    f'<button type="submit" name="do" value="{action}">{action}</button></form>')
        return forms

    @staticmethod
    def _cleanup_form(session: LoginSession | None) -> Callable[[DurableSubscription], str]:
        def form(subscription: DurableSubscription) -> str:
            if session is None:
                return ""
            fields = "".join(f'<input type="hidden" name="{key}" value="{escape(value)}">'
                             for key, value in (("broker", subscription.broker),
                                                ("destination", subscription.destination),
                                                ("name", subscription.name)))
            return (f'<form method="post" action="/subscriptions/delete">{session.field()}'
                    f'{fields}<button type="submit">delete, with its messages</button></form>')
        return form

    def _login(self, token: str) -> Answer:
        session = self._auth.login(token)
        if session is None:
            return self._login_page(None, refused=True)
        return Answer(HTTPStatus.SEE_OTHER, "text/plain", b"",
                      (*HEADERS, ("Location", "/"), set_cookie(session)))

    def _login_page(self, session: LoginSession | None, refused: bool = False) -> Answer:
        if not self._auth.control:
            body = ("<p>Control is off: set <code>control_token_file</code> (the containers' "
                    "token) for the console to pause, resume, replay or purge.</p>")
        else:
            body = ('<form method="post" action="/login"><label>Control token '
                    '<input type="password" name="token" autocomplete="current-password">'
                    '</label> <button type="submit">Log in</button></form>')
        if refused:
            body = '<p class="error">That is not the control token.</p>' + body
        status = HTTPStatus.FORBIDDEN if refused else HTTPStatus.OK
        return self._page(Fragment("Log in", body, status), session)

    def _page(self, fragment: Fragment, session: LoginSession | None,
              refresh: float | None = None) -> Answer:
        if session is not None:
            corner = (f'<form method="post" action="/logout">{session.field()}'
                      '<button type="submit">Log out</button></form>')
        else:
            corner = '<a href="/login">Log in</a>' if self._auth.control else ""
        document = layout(fragment.title, fragment.body, refresh=refresh, session=corner)
        return Answer(HTTPStatus(fragment.status), "text/html; charset=utf-8",
                      document.encode(), HEADERS)

    @staticmethod
    async def _run(page: Awaitable[Fragment]) -> Fragment:
        """A failed messages' page; a broker that cannot be asked is a 502 saying why."""
        try:
            return await page
        except BrokerError as exc:
            return Fragment("Broker error", f'<p class="error">{escape(exc)}</p>',
                            HTTPStatus.BAD_GATEWAY)
