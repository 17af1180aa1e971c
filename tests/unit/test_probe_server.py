"""``ProbeServer`` reads GET and POST requests, their headers and a bounded body, and writes an
answer's own header lines (mdb/serving/http/server.py)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus

from mdb.serving.http.server import Answer, HttpRequest, ProbeServer

WAIT = 10.0


def echo(request: HttpRequest) -> Answer:
    """What the server read, as JSON; the ``X-Echo`` header line sent back as ``X-Said``."""
    said = {"method": request.method, "path": request.path, "query": request.query,
            "headers": dict(request.headers), "body": request.body.decode()}
    extra = (("X-Said", request.headers["x-echo"]),) if "x-echo" in request.headers else ()
    return Answer(HTTPStatus.OK, "application/json", json.dumps(said).encode(), extra)


@contextmanager
def serving(max_body: int = 4096) -> Iterator[int]:
    sock = socket.create_server(("127.0.0.1", 0))
    server = ProbeServer(sock, echo, max_body=max_body)
    server.start()
    try:
        yield sock.getsockname()[1]
    finally:
        server.close()


def exchange(port: int, data: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send ``data`` and read the whole answer: its status line, headers and body."""
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.settimeout(WAIT)
        client.sendall(data)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return status, {n.lower(): v.strip() for n, _, v in (x.partition(":") for x in lines)}, body


def test_a_post_brings_its_headers_and_body() -> None:
    with serving() as port:
        status, headers, body = exchange(
            port, b"POST /listeners/a/pause?x=1 HTTP/1.1\r\nAuthorization: Bearer t\r\n"
                  b"X-Echo: x=1\r\n"
                  b"Content-Length: 5\r\nCookie: s=1\r\n\r\nhello")
    assert " 200 " in status
    said = json.loads(body)
    assert said["method"] == "POST" and said["path"] == "/listeners/a/pause"
    assert said["query"] == "x=1" and said["body"] == "hello"
    assert said["headers"]["authorization"] == "Bearer t" and said["headers"]["cookie"] == "s=1"
    assert headers["x-said"] == "x=1"


def test_a_body_past_the_bound_is_refused_unread() -> None:
    with serving(max_body=4096) as port:
        status, _, body = exchange(port, b"POST /x HTTP/1.1\r\nContent-Length: 4097\r\n\r\n"
                                   + b"a" * 4097)
        assert " 413 " in status and "4096" in json.loads(body)["error"]
        status, _, body = exchange(port, b"POST /x HTTP/1.1\r\nContent-Length: 4096\r\n\r\n"
                                   + b"a" * 4096)
        assert " 200 " in status and len(json.loads(body)["body"]) == 4096


def test_what_the_server_does_not_read_is_refused() -> None:
    with serving() as port:
        for request, code in (
                (b"PUT /x HTTP/1.1\r\n\r\n", " 405 "),
                (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                 " 411 "),
                (b"POST /x HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", " 400 "),
                (b"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", " 413 ")):
            assert code in exchange(port, request)[0], request


def test_an_answer_header_that_would_split_the_head_is_not_written() -> None:
    with serving() as port:
        status, headers, _ = exchange(port, b"GET /x HTTP/1.1\r\nX-Echo: a b\r\n\r\n")
        assert " 200 " in status and headers["x-said"] == "a b"
        status, headers, _ = exchange(port, b"GET /x HTTP/1.1\r\nX-Echo: a\rb\r\n\r\n")
    assert " 500 " in status and "x-said" not in headers
