"""The health endpoint's routes: liveness and readiness over HTTP, for an orchestrator's probes
and ``mdb status``.

Off by default; setting ``health_port`` turns it on. Three routes, all ``GET``, all JSON:

``/health/live``
    200 ``{"live": true}`` while the container's event loop answers; 503 when it reports itself
    not live or its loop has stopped. A wedged loop does not answer at all, so the probe times
    out: the snapshot is taken *on the event loop*, never in the server's thread.
``/health/ready``
    200 when every broker and every database of exactly-once listeners is up, every listener
    has a subscribed consumer on each member and a pool slot not stuck in a handler past its
    ``handler_timeout``; 503 otherwise, with the reason (the brokers and databases that are
    down, the listeners that are short, those all stuck).
``/status``
    200 with :meth:`Health.to_json`, which :meth:`Health.from_json` rebuilds
    (``mdb.serving.http.client.fetch_status``, for ``mdb status``).

Under ``mdb run --workers N`` the supervisor serves these routes for the whole server, from its
workers' snapshots (``mdb.serving.process.supervisor``); its snapshot lists the workers
(``WorkerHealth``).

Two routes are ``POST``s, the operator's controls (docs/health.md, "Pause and resume"):

``/listeners/NAME/pause``, ``/listeners/NAME/resume``
    200 ``{"listener": NAME, "paused": true|false, "workers": N}`` once done in every process
    of the server (``Act``); 403 without the token of ``control_token_file`` (``Authorization:
    Bearer TOKEN``, compared in constant time), or when none is set, and nothing changes; 404
    for a listener not run there, naming those that are; 502 when a worker did not do it. The
    body is not read but bounded (``mdb.serving.http.server``: 4 KiB).

Any other path is 404, any other method 405. The server logs nothing per request, and no client
can exhaust it: it keeps a bounded number of connections and threads, cuts off slow clients,
and answers probes under a flood of them (``mdb.serving.http.server``).

``/metrics`` (``mdb.serving.http.metrics_page``, docs/metrics.md) costs the container's loop one
short read per ``PAGE_FRESH_FOR`` seconds at most (longer for a page slow to make: ``PAGE_REUSE``),
however many clients scrape: the page is made from that read in a request thread, and every scrape
until it is stale gets the same page, served on the probe server's own loop; a scrape that finds the
page being made anew gets the last one instead of waiting.
"""

from __future__ import annotations

import hmac
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Protocol

import anyio.from_thread
import anyio.lowlevel
from pydantic import SecretStr

from mdb.errors import ConfigurationError, UnknownListener
from mdb.observability.health import Health
from mdb.serving.http.server import Answer, HttpRequest, ProbeServer, json_answer

Page = tuple[str, bytes]
"""``/metrics``: (content type, body)."""
Render = Callable[[str], Page]
"""``/metrics`` as read from the container: its page in the format an ``Accept`` header asks
for, made off the container's loop."""

PAGE_FRESH_FOR = 1.0
"""Seconds a ``/metrics`` page is served again before the container is read anew: a fraction
of any scrape interval, so a scraper sees no difference, while a flood of scrapers costs the
container one read a second (docs/metrics.md)..."""
PAGE_REUSE = 10.0
"""... or this many times as long as the page took to make, when that is longer: however
large the page and however busy the process, making pages takes at most a tenth of its
time."""


class MetricsSource(Protocol):
    """What serves ``/metrics`` (``mdb.serving.http.metrics_page``)."""

    def content_type(self, accept: str) -> str:
        """The content type of the page an ``Accept`` header asks for."""
        ...

    def read(self) -> Render | Awaitable[Render]:
        """On the container's loop: what only the loop may read, taken at once (it must not
        block; a coroutine may await, as the supervisor's asks its workers). The page is made
        of it elsewhere."""
        ...


Act = Callable[[str, str], int | Awaitable[int]]
"""``POST /listeners/NAME/pause`` and ``.../resume``: ``act(action, name)`` ("pause" or
"resume"), on the container's loop (a coroutine may await, as the supervisor's asks its
workers); how many processes did it. ``UnknownListener`` for a name not run there, ``NotDone``
when a worker did not do it."""

_CONTROL = re.compile(r"/listeners/([^/]+)/(pause|resume)")
_CONTROL_OFF = "control is off: set control_token_file"


class NotDone(Exception):
    """``Act``: a worker of the server did not do it; the message names it."""


class HealthServer:
    """Serves the routes above on ``host``:``port`` from threads of its own
    (``mdb.serving.http.server``).

    Construct it on the running event loop whose state ``snapshot`` reads: every request calls
    ``snapshot`` on that loop (it must not block; a coroutine function may await, as the
    supervisor's asks its workers), and waits for it. ``port`` 0 picks a free port;
    after :meth:`start`, ``port`` is the bound one. :meth:`close` is idempotent; it blocks its
    caller (the loop) only until the server has closed its connections. ``metrics``, when
    given, answers ``/metrics``: read on that loop, made in a request thread, served again
    until it is stale (the module docstring). ``act``, when given, answers the POSTs of a
    request bringing ``token`` (``Authorization: Bearer TOKEN``); without a token, every POST
    is refused.
    """

    def __init__(self, snapshot: Callable[[], Health | Awaitable[Health]],
                 host: str = "127.0.0.1", port: int = 0,
                 metrics: MetricsSource | None = None, act: Act | None = None,
                 token: SecretStr | None = None) -> None:
        self.host = host
        self.port = port
        self._snapshot = snapshot
        self._metrics = metrics
        self._act = act
        self._token = None if token is None else token.get_secret_value().encode()
        self._pages: dict[str, tuple[float, Page]] = {}  # by content type: (stale at, page)
        self._making = threading.Lock()  # held while a page is read and made
        self._token_of_loop = anyio.lowlevel.current_token()  # RuntimeError off the loop
        self._server: ProbeServer | None = None

    def start(self) -> None:
        """Bind and start serving; ConfigurationError naming the setting when the address
        cannot be bound (the port is taken, the host is not this machine's, ...)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            sock = socket.create_server((self.host, self.port), family=family)
        except OSError as exc:
            raise ConfigurationError(
                f"health_port {self.port}: cannot listen on {self.host}:{self.port}: "
                f"{exc.strerror or exc}; choose another port (0: any free one) or health_host"
            ) from None
        self.port = sock.getsockname()[1]
        self._server = ProbeServer(sock, self._answer, self._answer_now)
        self._server.start()

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _answer(self, request: HttpRequest) -> Answer:
        """Runs in a request thread."""
        path = request.path
        if request.method == "POST" and _CONTROL.fullmatch(path):
            return self._control(request)
        if request.method != "GET":
            return json_answer(HTTPStatus.METHOD_NOT_ALLOWED, {
                "error": f"{request.method} {path}: a GET route (POST /listeners/NAME/pause "
                         "or /resume)"})
        if path == "/metrics" and self._metrics is not None:
            return self._page(self._metrics, request.accept)
        if path not in ("/health/live", "/health/ready", "/status"):
            return json_answer(HTTPStatus.NOT_FOUND, {
                "error": f"no route {path}; try /health/live, /health/ready or /status"})
        try:
            health = anyio.from_thread.run(self._take, token=self._token_of_loop)
        except RuntimeError:
            return json_answer(HTTPStatus.SERVICE_UNAVAILABLE, {
                "live": False, "ready": False,
                "error": "the container's event loop is not running"})
        if path == "/health/live":
            return json_answer(_ok(health.live), {"live": health.live})
        if path == "/health/ready":
            return json_answer(_ok(health.ready), {"ready": health.ready, **health.unready()})
        return json_answer(HTTPStatus.OK, health.to_json())

    def _control(self, request: HttpRequest) -> Answer:
        """``POST /listeners/NAME/pause`` or ``.../resume``, in a request thread: refused (403)
        without the token, and changing nothing; else done on the container's loop."""
        if self._token is None or self._act is None:
            return json_answer(HTTPStatus.FORBIDDEN, {"error": _CONTROL_OFF})
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode("latin-1"), self._token):
            return json_answer(HTTPStatus.FORBIDDEN, {
                "error": "a missing or wrong token: send `Authorization: Bearer TOKEN`, the "
                         "token of the container's control_token_file"})
        found = _CONTROL.fullmatch(request.path)
        assert found is not None
        name, action = urllib.parse.unquote(found[1]), found[2]
        try:
            workers = anyio.from_thread.run(self._acted, self._act, action, name,
                                            token=self._token_of_loop)
        except RuntimeError:
            return json_answer(HTTPStatus.SERVICE_UNAVAILABLE, {
                "error": "the container's event loop is not running"})
        except UnknownListener as exc:
            return json_answer(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except NotDone as exc:
            return json_answer(HTTPStatus.BAD_GATEWAY, {"error": str(exc)})
        return json_answer(HTTPStatus.OK, {"listener": name, "paused": action == "pause",
                                           "workers": workers})

    @staticmethod
    async def _acted(act: Act, action: str, name: str) -> int:
        done = act(action, name)
        return await done if isinstance(done, Awaitable) else done

    def _answer_now(self, request: HttpRequest) -> Answer | None:
        """``/metrics`` when it needs no request thread (``mdb.serving.http.server``): the page
        while it is fresh, and the last one while another request makes the next."""
        if request.method != "GET" or request.path != "/metrics" or self._metrics is None:
            return None
        made = self._pages.get(self._metrics.content_type(request.accept))
        if made is None or (time.monotonic() >= made[0] and not self._making.locked()):
            return None
        return Answer(HTTPStatus.OK, *made[1])

    def _page(self, metrics: MetricsSource, accept: str) -> Answer:
        """``/metrics``, in a request thread: a new page, unless another request made one
        while this one waited."""
        content_type = metrics.content_type(accept)
        with self._making:
            made = self._pages.get(content_type)
            if made is not None and time.monotonic() < made[0]:
                return Answer(HTTPStatus.OK, *made[1])
            began = time.monotonic()
            try:
                render = anyio.from_thread.run(self._read, metrics, token=self._token_of_loop)
            except RuntimeError:
                return Answer(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain",
                              b"the container's event loop is not running\n")
            page = render(accept)
            took = time.monotonic() - began
            self._pages[content_type] = (began + max(PAGE_FRESH_FOR, PAGE_REUSE * took), page)
            return Answer(HTTPStatus.OK, *page)

    @staticmethod
    async def _read(metrics: MetricsSource) -> Render:
        read = metrics.read()
        return await read if isinstance(read, Awaitable) else read

    async def _take(self) -> Health:
        taken = self._snapshot()
        return taken if isinstance(taken, Health) else await taken


def _ok(good: bool) -> HTTPStatus:
    return HTTPStatus.OK if good else HTTPStatus.SERVICE_UNAVAILABLE
