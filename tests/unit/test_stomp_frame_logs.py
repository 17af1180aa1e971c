"""stomp.py's DEBUG frame lines never show a body unless MDB_TRACE_BODIES=true: bodies and
validation inputs never reach logs (docs/tracing.md, docs/security.md)."""

from __future__ import annotations

import logging

import pytest
from stomp.utils import Frame, clean_lines, convert_frame

import mdb_stomp  # noqa: F401  (puts its filters on stomp.py's logger)
from mdb.observability.redaction import mask_secrets
from mdb_stomp.protocol.frame_logs import STOMP_LOGGER, log_sent, sent_frame_without_body
from mdb_stomp.protocol.frames import Command, encode

SECRET = b"card 4111-1111-1111-1111"


def logged(caplog: pytest.LogCaptureFixture, msg: str, *args: object) -> str:
    caplog.clear()
    # stomp.py's records show only while mdb logs at DEBUG (mdb.observability.logs.quiet_library)
    with caplog.at_level(logging.DEBUG, logger="mdb"), \
            caplog.at_level(logging.DEBUG, logger=STOMP_LOGGER):
        logging.getLogger(STOMP_LOGGER).debug(msg, *args)
    return caplog.text


def sent(body: bytes) -> str:
    return str(clean_lines(convert_frame(Frame("SEND", {"destination": "/queue/q"}, body))))


def test_a_received_frame_shows_command_and_headers_not_the_body(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MDB_TRACE_BODIES", raising=False)
    text = logged(caplog, "received frame: %r, headers=%r, body=%r", "MESSAGE",
                  {"destination": "/queue/q"}, SECRET)
    assert "MESSAGE" in text and "/queue/q" in text and f"{len(SECRET)} bytes" in text
    assert b"4111" not in text.encode()


def test_a_sent_frame_shows_command_and_headers_not_the_body(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MDB_TRACE_BODIES", raising=False)
    text = logged(caplog, "sending frame: %s", sent(SECRET))
    assert "SEND" in text and "destination:/queue/q" in text
    assert "4111" not in text and f"{len(SECRET)} bytes" in text
    assert "4111" not in logged(caplog, "sending frame: %s", "not a frame 4111")


def test_a_frame_without_a_body_is_shown_whole() -> None:
    assert sent_frame_without_body(sent(b"")) == sent(b"")


def test_with_mdb_trace_bodies_the_body_is_shown_its_secrets_masked(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDB_TRACE_BODIES", "true")
    shown = logged(caplog, "sending frame: %s", sent(SECRET + b" for order o-2"))
    assert "card *** for order o-2" in shown and "4111" not in shown


@pytest.mark.parametrize(("command", "headers", "body"), [
    ("SEND", {"destination": "/queue/q", "transaction": "t"}, SECRET),
    ("ACK", {"id": "a-1", "transaction": "t"}, b""),
])
def test_a_frame_mdb_writes_itself_is_logged_as_stomp_py_logged_its_own(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, command: Command,
    headers: dict[str, str], body: bytes,
) -> None:
    """mdb encodes its frames (``frames.encode``) instead of stomp.py: the DEBUG line stays
    stomp.py's, so that bodies stay hidden as above."""
    monkeypatch.setenv("MDB_TRACE_BODIES", "true")
    as_stomp_py = dict(headers, **({"content-length": str(len(body))} if body else {}))
    expected = "sending frame: " + clean_lines(convert_frame(Frame(command, as_stomp_py, body)))
    with caplog.at_level(logging.DEBUG, logger="mdb"), \
            caplog.at_level(logging.DEBUG, logger=STOMP_LOGGER):
        log_sent(encode(command, headers, body))
        monkeypatch.delenv("MDB_TRACE_BODIES")
        log_sent(encode(command, headers, body))
    assert caplog.records[0].getMessage() == mask_secrets(expected)
    assert "4111" not in caplog.records[1].getMessage()
