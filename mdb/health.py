"""Health: liveness and readiness over HTTP, for an orchestrator's probes and ``mdb status``.

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
    (:func:`fetch_status`, for ``mdb status``).

Under ``mdb run --workers N`` the supervisor serves these routes for the whole server, from its
workers' snapshots (``mdb.supervisor``); its snapshot lists the workers (``WorkerHealth``).

Any other path is 404, any other method 405. The server logs nothing per request, and no client
can exhaust it: it keeps a bounded number of connections and threads, cuts off slow clients,
and answers probes under a flood of them (``mdb.probe_server``).

``/metrics`` (``mdb.metrics``, docs/metrics.md) costs the container's loop one short read per
``PAGE_FRESH_FOR`` seconds at most (longer for a page slow to make: ``PAGE_REUSE``), however
many clients scrape: the page is made from that read in a request thread, and every scrape
until it is stale gets the same page, served on the probe server's own loop; a scrape that
finds the page being made anew gets the last one instead of waiting.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

import anyio.from_thread
import anyio.lowlevel

from mdb.errors import ConfigurationError
from mdb.probe_server import Answer, ProbeServer, Request, json_answer
from mdb.redaction import printable
from mdb.settings import Settings

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
    """What serves ``/metrics`` (``mdb.metrics``)."""

    def content_type(self, accept: str) -> str:
        """The content type of the page an ``Accept`` header asks for."""
        ...

    def read(self) -> Render | Awaitable[Render]:
        """On the container's loop: what only the loop may read, taken at once (it must not
        block; a coroutine may await, as the supervisor's asks its workers). The page is made
        of it elsewhere."""
        ...


@dataclass(frozen=True)
class BrokerHealth:
    """One broker as the container sees it."""

    name: str
    state: str
    """``"up"``, ``"down"`` (reconnecting) or ``"failed"`` (down past its give-up time); any
    other state (``"unknown"``: never connected yet) counts as not up."""
    since: float
    """``time.time()`` of the last change of ``state``."""
    address: str = ""
    """The address (redacted URL) the broker's connections are on, or were last on: one of
    its ``url`` list; "" from a container that did not say."""


@dataclass(frozen=True)
class DatabaseHealth:
    """A database of exactly-once listeners (docs/exactly-once.md)."""

    name: str
    state: str
    """``"up"``, or ``"down"``: the last statement could not reach it, or had no answer in
    ``timeout``."""
    since: float
    """``time.time()`` of the last change of ``state``."""
    outbox: int
    """Sends waiting in its outbox, as last counted (every third of ``outbox_lease``)."""
    oldest: float | None
    """Seconds the oldest of them has waited; None when none waits."""


@dataclass(frozen=True)
class StuckHandler:
    """A plain ``def`` handler running past its listener's ``handler_timeout``: its pool slot
    is stuck until it returns."""

    message_id: str
    running_for: float
    """Seconds it has run, when the snapshot was taken."""


@dataclass(frozen=True)
class ListenerHealth:
    """One listener: how many of its members have a subscribed consumer, and its work."""

    name: str
    members: int
    subscribed: int
    in_flight: int
    processed: int
    slots: int = 0
    """Its pool slots (``pool`` per member); 0 from a container that did not say."""
    stuck: tuple[StuckHandler, ...] = ()
    """Its handlers past their ``handler_timeout``, each holding a slot."""

    @property
    def all_stuck(self) -> bool:
        """Every slot holds a stuck handler: the listener takes no message."""
        return 0 < self.slots <= len(self.stuck)


@dataclass(frozen=True)
class WorkerHealth:
    """One worker process of ``mdb run --workers N``, as its supervisor sees it."""

    index: int
    """1 to N: the worker's place, kept by the process that replaces it."""
    pid: int
    """The process now in that place; 0 while none runs."""
    state: str
    """``"starting"``, ``"ready"``, ``"not ready"``, ``"no answer"`` (its health endpoint did
    not answer), ``"restarting"`` (waiting to be started again), ``"failed"`` (given up: not
    started again until SIGHUP), ``"stopping"`` or ``"stopped"``."""
    restarts: int
    """How many times the supervisor started this place again after its process ended."""


@dataclass(frozen=True)
class Health:
    """A snapshot of the container, taken on its event loop (or of a server of several worker
    processes, taken by their supervisor: then ``workers`` lists them)."""

    live: bool
    ready: bool
    brokers: tuple[BrokerHealth, ...] = ()
    listeners: tuple[ListenerHealth, ...] = ()
    events: dict[str, int] = field(default_factory=dict)
    """How many availability events of each kind (``EventKind`` value) were emitted."""
    workers: tuple[WorkerHealth, ...] = ()
    """The worker processes (``mdb run --workers N``); empty for a single process."""
    databases: tuple[DatabaseHealth, ...] = ()
    """The databases of exactly-once listeners."""

    def unready(self) -> dict[str, object]:
        """Why the container is not ready: the brokers and databases not up, the listeners
        short of members, the listeners whose every slot is stuck in a handler past its
        ``handler_timeout``."""
        return {
            "brokers_down": [b.name for b in self.brokers if b.state != "up"],
            "databases_down": [d.name for d in self.databases if d.state != "up"],
            "listeners_short": [
                {"name": lh.name, "subscribed": lh.subscribed, "members": lh.members}
                for lh in self.listeners if lh.subscribed < lh.members
            ],
            "listeners_stuck": [
                {"name": lh.name, "stuck": len(lh.stuck), "slots": lh.slots}
                for lh in self.listeners if lh.all_stuck
            ],
        }

    def to_json(self) -> dict[str, object]:
        return {
            "live": self.live,
            "ready": self.ready,
            "brokers": [
                {"name": b.name, "state": b.state, "since": b.since, "address": b.address}
                for b in self.brokers],
            "listeners": [
                {"name": lh.name, "members": lh.members, "subscribed": lh.subscribed,
                 "in_flight": lh.in_flight, "processed": lh.processed, "slots": lh.slots,
                 "stuck": [{"message_id": h.message_id, "running_for": h.running_for}
                           for h in lh.stuck]}
                for lh in self.listeners
            ],
            "events": dict(self.events),
            "databases": [
                {"name": d.name, "state": d.state, "since": d.since, "outbox": d.outbox,
                 "oldest": d.oldest} for d in self.databases],
            **({"workers": [{"index": w.index, "pid": w.pid, "state": w.state,
                             "restarts": w.restarts} for w in self.workers]}
               if self.workers else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Health:
        """Rebuild what :meth:`to_json` wrote; ValueError when ``data`` is not that shape."""
        try:
            return cls(
                live=_typed(data["live"], bool),
                ready=_typed(data["ready"], bool),
                brokers=tuple(
                    BrokerHealth(_typed(b["name"], str), _typed(b["state"], str),
                                 float(_typed(b["since"], int | float)),
                                 _typed(b.get("address", ""), str))
                    for b in data["brokers"]
                ),
                listeners=tuple(
                    ListenerHealth(_typed(lh["name"], str), _typed(lh["members"], int),
                                   _typed(lh["subscribed"], int), _typed(lh["in_flight"], int),
                                   _typed(lh["processed"], int), _typed(lh.get("slots", 0), int),
                                   tuple(StuckHandler(_typed(h["message_id"], str),
                                                      float(_typed(h["running_for"], int | float)))
                                         for h in lh.get("stuck", ())))
                    for lh in data["listeners"]
                ),
                events={_typed(k, str): _typed(v, int) for k, v in data["events"].items()},
                workers=tuple(
                    WorkerHealth(_typed(w["index"], int), _typed(w["pid"], int),
                                 _typed(w["state"], str), _typed(w["restarts"], int))
                    for w in data.get("workers", ())
                ),
                databases=tuple(
                    DatabaseHealth(_typed(d["name"], str), _typed(d["state"], str),
                                   float(_typed(d["since"], int | float)),
                                   _typed(d["outbox"], int),
                                   None if d["oldest"] is None
                                   else float(_typed(d["oldest"], int | float)))
                    for d in data.get("databases", ())
                ),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an mdb health snapshot: {exc!r}") from None


def _typed(value: Any, kind: Any) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise TypeError(f"{value!r} is not {kind}")
    return value


class HealthServer:
    """Serves the routes above on ``host``:``port`` from threads of its own
    (``mdb.probe_server``).

    Construct it on the running event loop whose state ``snapshot`` reads: every request calls
    ``snapshot`` on that loop (it must not block; a coroutine function may await, as the
    supervisor's asks its workers), and waits for it. ``port`` 0 picks a free port;
    after :meth:`start`, ``port`` is the bound one. :meth:`close` is idempotent; it blocks its
    caller (the loop) only until the server has closed its connections. ``metrics``, when
    given, answers ``/metrics``: read on that loop, made in a request thread, served again
    until it is stale (the module docstring).
    """

    def __init__(self, snapshot: Callable[[], Health | Awaitable[Health]],
                 host: str = "127.0.0.1", port: int = 0,
                 metrics: MetricsSource | None = None) -> None:
        self.host = host
        self.port = port
        self._snapshot = snapshot
        self._metrics = metrics
        self._pages: dict[str, tuple[float, Page]] = {}  # by content type: (stale at, page)
        self._making = threading.Lock()  # held while a page is read and made
        self._token = anyio.lowlevel.current_token()  # RuntimeError off the event loop
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

    def _answer(self, request: Request) -> Answer:
        """Runs in a request thread."""
        path, accept = request
        if path == "/metrics" and self._metrics is not None:
            return self._page(self._metrics, accept)
        if path not in ("/health/live", "/health/ready", "/status"):
            return json_answer(HTTPStatus.NOT_FOUND, {
                "error": f"no route {path}; try /health/live, /health/ready or /status"})
        try:
            health = anyio.from_thread.run(self._take, token=self._token)
        except RuntimeError:
            return json_answer(HTTPStatus.SERVICE_UNAVAILABLE, {
                "live": False, "ready": False,
                "error": "the container's event loop is not running"})
        if path == "/health/live":
            return json_answer(_ok(health.live), {"live": health.live})
        if path == "/health/ready":
            return json_answer(_ok(health.ready), {"ready": health.ready, **health.unready()})
        return json_answer(HTTPStatus.OK, health.to_json())

    def _answer_now(self, request: Request) -> Answer | None:
        """``/metrics`` when it needs no request thread (``mdb.probe_server``): the page while
        it is fresh, and the last one while another request makes the next."""
        path, accept = request
        if path != "/metrics" or self._metrics is None:
            return None
        made = self._pages.get(self._metrics.content_type(accept))
        if made is None or (time.monotonic() >= made[0] and not self._making.locked()):
            return None
        return HTTPStatus.OK, *made[1]

    def _page(self, metrics: MetricsSource, accept: str) -> Answer:
        """``/metrics``, in a request thread: a new page, unless another request made one
        while this one waited."""
        content_type = metrics.content_type(accept)
        with self._making:
            made = self._pages.get(content_type)
            if made is not None and time.monotonic() < made[0]:
                return HTTPStatus.OK, *made[1]
            began = time.monotonic()
            try:
                render = anyio.from_thread.run(self._read, metrics, token=self._token)
            except RuntimeError:
                return (HTTPStatus.SERVICE_UNAVAILABLE, "text/plain",
                        b"the container's event loop is not running\n")
            page = render(accept)
            took = time.monotonic() - began
            self._pages[content_type] = (began + max(PAGE_FRESH_FOR, PAGE_REUSE * took), page)
            return HTTPStatus.OK, *page

    @staticmethod
    async def _read(metrics: MetricsSource) -> Render:
        read = metrics.read()
        return await read if isinstance(read, Awaitable) else read

    async def _take(self) -> Health:
        taken = self._snapshot()
        return taken if isinstance(taken, Health) else await taken


def _ok(good: bool) -> HTTPStatus:
    return HTTPStatus.OK if good else HTTPStatus.SERVICE_UNAVAILABLE


# -- the client: ``mdb status`` -------------------------------------------------------------

class Unreachable(Exception):
    """``fetch_status``: no answer from the health endpoint, or not one mdb would give."""


class NotLive(Exception):
    """``fetch_status``: the health endpoint answered that the container's event loop is not
    running."""


def fetch_status(url: str, timeout: float) -> Health:
    """GET ``url``/status and rebuild the snapshot; blocking, so call it from a worker thread."""
    target = f"{url.rstrip('/')}/status"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            raise Unreachable(f"{target}: HTTP {exc.code}; is this an mdb health "
                               f"endpoint?") from None
        try:
            said = printable(str(json.loads(exc.read())["error"]))  # for a terminal
        except (ValueError, KeyError, TypeError):
            said = "HTTP 503"
        raise NotLive(said) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(why, TimeoutError):
            why = f"no answer within {timeout:g} s (is its event loop blocked?)"
        raise Unreachable(f"cannot reach {target}: {why}") from None
    try:
        return Health.from_json(json.loads(body))
    except (ValueError, AttributeError) as exc:
        raise Unreachable(f"{target}: not an mdb health snapshot ({exc})") from None


def health_url(settings: Settings) -> str:
    """The URL of the health endpoint ``settings`` give a container on this host (``mdb
    status``); ConfigurationError when they give none that can be known here."""
    if settings.health_port is None:
        raise ConfigurationError("mdb status: set `health_port` (the container's health "
                                 "endpoint) in the settings, or give --url http://HOST:PORT")
    if settings.health_port == 0:
        raise ConfigurationError("mdb status: `health_port` is 0 (any free port), so the port "
                                 "is not known here; give --url http://HOST:PORT")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
        settings.health_host, settings.health_host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.health_port}"
