"""``ProbeServer``: the HTTP server under the health endpoint (``mdb.serving.http.routes``), built
so that no client can exhaust it: a probe is answered while any number of idle, slow or vanishing
clients are connected.

``http.server.ThreadingHTTPServer``, which it replaces, spent a thread and a file descriptor on
every connection for as long as the client cared to keep it: 1,500 idle clients made 1,502
threads, and with a low file limit a readiness probe got no answer at all. Here:

* connections are accepted, and requests read, on an event loop of the server's own, in one
  thread, whatever the number of connections (not on the container's loop: a flood of
  clients must not slow the container, and a container whose loop has stopped is still
  answered for, 503);
* at most ``MAX_CONNECTIONS`` connections are open. A connection past it closes the one that
  has waited longest for its request, or for its turn (below) (a client that sends its
  request at once, as a probe does, is never that one under a flood of slow clients or
  scrapers); when every open connection has sent its request and waits for its answer, the
  new one is closed. This is decided as each connection is accepted, so the server never
  holds more file descriptors than that; when the process has none left (other parts of it
  hold them), accepting pauses and says so once;
* a connection has ``DEADLINE`` seconds, from its accept, to send its request and take the
  answer, then it is closed;
* answers are computed by ``ANSWER_THREADS`` threads (computing one may block: the health
  endpoint waits for the container's loop). When ``MAX_CONNECTIONS`` requests still wait for
  their answer (the container's loop does not answer), further requests are answered 503 at
  once instead of queuing for ever;
* an answer at hand (``answer_now``: a ``/metrics`` page already made) is given on the
  server's loop, without a thread, in turn: ``AT_HAND_PER_SECOND`` a second at most, so that
  clients asking for it in a loop take next to nothing from the process, whose threads share
  one interpreter lock with the container's loop (docs/metrics.md);
* a request is a ``GET`` or a ``POST``, whose body (``Content-Length``, never chunked) is at
  most ``max_body`` bytes (4 KiB unless its owner says otherwise): a larger one is answered 413
  without being kept;
* a client that goes away, or sends something that is not such a request, costs no log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import queue
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, NamedTuple

log = logging.getLogger("mdb.health")

METHODS = ("GET", "POST")
MAX_BODY_BYTES = 4_096
_DISCARDED_BYTES = 65_536  # of a body too large, read and dropped so that the 413 is seen...
_DISCARDING_FOR = 1.0  # ... within this many seconds


class Answer(NamedTuple):
    """A response: its status, content type, body, and any further header lines (a
    ``Set-Cookie``, a ``Location``...; ``Content-Length`` and ``Connection`` are the
    server's)."""

    status: HTTPStatus
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class HttpRequest:
    """A request as read: ``GET`` or ``POST``, its path and query (split at the first
    ``?``), its header lines (names lower-cased; of a repeated one, the last) and its body
    (at most the server's ``max_body`` bytes; b"" without a ``Content-Length``)."""

    method: str
    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def accept(self) -> str:
        """The ``Accept`` header, "" when none."""
        return self.headers.get("accept", "")


_Job = tuple[HttpRequest, asyncio.Future[Answer | Exception]]


class _Refused(Exception):
    """A request the server answers without asking: not a GET or POST, not HTTP, or with a
    body too large."""

    def __init__(self, status: HTTPStatus, error: str) -> None:
        super().__init__(error)
        self.answer: Answer = json_answer(status, {"error": error})


class ProbeServer:
    """Serves ``answer(request)`` (an ``Answer``; it runs in an answer thread) to ``GET`` and
    ``POST`` requests on the listening socket ``sock``, from :meth:`start` until :meth:`close`
    (idempotent; it returns once the server's threads are told to stop, without waiting for an
    answer being computed). ``answer_now(request)``, on the server's loop, gives the answer
    when it is at hand (it must not block), else None. A body longer than ``max_body`` bytes is
    answered 413 without asking either."""

    MAX_CONNECTIONS = 64
    DEADLINE = 5.0
    ANSWER_THREADS = 2
    AT_HAND_PER_SECOND = 10
    MAX_REQUEST_BYTES = 8_192  # the request line and the headers

    def __init__(self, sock: socket.socket, answer: Callable[[HttpRequest], Answer],
                 answer_now: Callable[[HttpRequest], Answer | None] = lambda _: None,
                 max_body: int = MAX_BODY_BYTES) -> None:
        self._sock = sock
        self._max_body = max_body
        self._answer = answer
        self._answer_now = answer_now
        self._loop = asyncio.new_event_loop()
        self._stopped = self._loop.create_future()
        self._open: dict[asyncio.Task[None], socket.socket] = {}
        self._waiting: dict[asyncio.Task[None], None] = {}  # no request yet, oldest first
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._unanswered = 0  # jobs handed to the answer threads and not finished
        self._threads: list[threading.Thread] = []
        self._said_out_of_files = False
        self._next_turn = -math.inf  # when the last answer at hand was, or will be, given

    def start(self) -> None:
        port = self._sock.getsockname()[1]
        self._threads = [threading.Thread(target=self._loop.run_until_complete,
                                          args=(self._serve(),), name=f"mdb-health-{port}",
                                          daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"mdb-health-{port}-{i}",
                                           daemon=True) for i in range(self.ANSWER_THREADS)]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        threads, self._threads = self._threads, []
        if not threads:
            return
        self._loop.call_soon_threadsafe(_settle, self._stopped, None)
        threads[0].join()
        for _ in threads[1:]:
            self._jobs.put(None)
        self._loop.close()

    async def _serve(self) -> None:
        accepting = asyncio.create_task(self._accept())
        await self._stopped
        tasks = [accepting, *self._open]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in self._open.values():
            conn.close()  # a connection cancelled before its task began
        self._sock.close()

    async def _accept(self) -> None:
        self._sock.setblocking(False)
        while True:
            try:
                conn, _ = await self._loop.sock_accept(self._sock)
            except OSError as exc:  # out of file descriptors, most likely
                if not self._said_out_of_files:
                    log.warning("health endpoint: cannot accept a connection: %s", exc)
                    self._said_out_of_files = True
                await asyncio.sleep(0.1)
                continue
            if len(self._open) >= self.MAX_CONNECTIONS and not self._evict_one():
                conn.close()
            else:
                self._open[asyncio.create_task(self._connected(conn))] = conn
            await asyncio.sleep(0)  # an evicted connection closes before the next accept

    async def _connected(self, conn: socket.socket) -> None:
        task = asyncio.current_task()
        assert task is not None
        writer = None
        answered = False
        try:
            async with asyncio.timeout(self.DEADLINE):
                reader, writer = await asyncio.open_connection(
                    sock=conn, limit=self.MAX_REQUEST_BYTES)
                self._waiting[task] = None
                try:
                    request = await _request(reader, self._max_body)
                    self._waiting.pop(task, None)
                    answer = self._answer_now(request)
                    if answer is None:
                        answer = await self._answered(request)
                    else:
                        self._waiting[task] = None  # a scraper waiting: closed before a probe
                        await self._turn()
                        self._waiting.pop(task, None)
                except _Refused as refused:
                    answer = refused.answer
                writer.write(_response(answer))
                await writer.drain()
                answered = True
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away, was too slow, or sent too much: nothing to say
        finally:
            self._open.pop(task, None)
            self._waiting.pop(task, None)
            if writer is None:
                conn.close()
            elif answered:
                writer.close()
            else:
                writer.transport.abort()

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for its request or its turn; False
        if none waits."""
        oldest = next(iter(self._waiting), None)
        if oldest is None:
            return False
        del self._waiting[oldest]
        del self._open[oldest]
        oldest.cancel()  # its task closes the connection as it ends
        return True

    async def _turn(self) -> None:
        """Return when an answer at hand may be given: ``AT_HAND_PER_SECOND`` a second at
        most, in the order asked."""
        now = self._loop.time()
        turn = self._next_turn = max(self._next_turn + 1 / self.AT_HAND_PER_SECOND, now)
        await asyncio.sleep(turn - now)

    async def _answered(self, request: HttpRequest) -> Answer:
        if self._unanswered >= self.MAX_CONNECTIONS:
            return json_answer(HTTPStatus.SERVICE_UNAVAILABLE, {
                "live": False, "ready": False,
                "error": "earlier requests are still waiting for the container's event loop"})
        future: asyncio.Future[Answer | Exception] = self._loop.create_future()
        self._unanswered += 1
        self._jobs.put((request, future))
        outcome = await future
        if isinstance(outcome, Exception):
            log.error("health endpoint: answering %s failed", request.path, exc_info=outcome)
            return json_answer(HTTPStatus.INTERNAL_SERVER_ERROR,
                               {"error": f"{type(outcome).__name__}"})
        return outcome

    def _work(self) -> None:
        """An answer thread."""
        while (job := self._jobs.get()) is not None:
            request, future = job
            outcome: Answer | Exception | None = None
            if not future.cancelled():  # its client is gone: no answer to compute
                try:
                    outcome = self._answer(request)
                except Exception as exc:  # a bug, reported to the client and logged once
                    outcome = exc
            try:
                self._loop.call_soon_threadsafe(self._finished, future, outcome)
            except RuntimeError:  # the server is closed
                return

    def _finished(self, future: asyncio.Future[Answer | Exception],
                  outcome: Answer | Exception | None) -> None:
        self._unanswered -= 1
        if outcome is not None:
            _settle(future, outcome)


async def _request(reader: asyncio.StreamReader, max_body: int) -> HttpRequest:
    """The request ``reader`` brings: its head, and a body of at most ``max_body`` bytes."""
    head = await reader.readuntil(b"\r\n\r\n")
    first, *lines = head[:-4].decode("latin-1").split("\r\n")
    words = first.split()
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        raise _Refused(HTTPStatus.BAD_REQUEST, "not an HTTP request")
    method, target, _ = words
    if method not in METHODS:
        raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, f"{method}: every route is a GET or a POST")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    if "transfer-encoding" in headers:
        raise _Refused(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length")
    length = headers.get("content-length", "0")
    if not (length.isascii() and length.isdigit()):
        raise _Refused(HTTPStatus.BAD_REQUEST, f"Content-Length {length!r} is not a number")
    if len(length) > 12 or int(length) > max_body:
        # Read (up to a bound, for a second at most) and dropped: a socket closed on unread
        # data resets the connection, and the client would see that rather than the answer.
        with contextlib.suppress(asyncio.IncompleteReadError, TimeoutError):
            async with asyncio.timeout(_DISCARDING_FOR):
                await reader.readexactly(min(int(length), _DISCARDED_BYTES))
        raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                       f"a body of {length} bytes; at most {max_body} are read")
    body = await reader.readexactly(int(length))
    path, _, query = target.partition("?")
    return HttpRequest(method, path, query, headers, body)


def json_answer(status: HTTPStatus, body: dict[str, object]) -> Answer:
    return Answer(status, "application/json", json.dumps(body).encode())


def _response(answer: Answer) -> bytes:
    """The bytes of ``answer``; a 500 for one whose header lines would not be one line each
    (an owner's bug, logged), never the split head a header's line break would write."""
    try:
        return _written(answer)
    except ValueError as exc:
        log.error("health endpoint: an answer not written: %s", exc)
        return _written(json_answer(HTTPStatus.INTERNAL_SERVER_ERROR,
                                    {"error": "an answer could not be written"}))


def _written(answer: Answer) -> bytes:
    lines = [f"HTTP/1.1 {answer.status.value} {answer.status.phrase}",
             f"Content-Type: {answer.content_type}",
             *(f"{name}: {value}" for name, value in answer.headers),
             f"Content-Length: {len(answer.body)}", "Connection: close"]
    if any(c in line for line in lines for c in "\r\n"):  # a value that would split the head
        raise ValueError(f"a header line holds a line break: {lines!r}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + answer.body


def _settle(future: asyncio.Future[Any], value: object) -> None:
    if not future.done():
        future.set_result(value)

