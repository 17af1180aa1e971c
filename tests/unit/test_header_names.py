"""Header names a Java (JMS) selector can use (docs/interop.md): mdb's content type under a
JMS identifier too, read from either name, and one warning per header name a selector cannot
name."""

from __future__ import annotations

import logging
import uuid

import pytest

from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.jms_names import is_jms_identifier
from mdb.messages.message import Message, OutgoingMessage


@pytest.mark.parametrize("name", ["region", "_x", "$y", "a1", "Ort_ü", "JMSXGroupID",
                                  "mdb_id", "mdb_content_type", "traceparent", "notice"])
def test_jms_identifiers(name: str) -> None:
    assert is_jms_identifier(name)


@pytest.mark.parametrize("name", ["", "content-type", "amq-msg-type", "1st", "a.b", "a b",
                                  "NULL", "true", "And", "between", "like", "in", "is",
                                  "escape", "not", "or", "false", "JMSPriority", "JMSXNope"])
def test_not_jms_identifiers(name: str) -> None:
    assert not is_jms_identifier(name)


def test_every_message_names_its_content_type_for_selectors_too() -> None:
    for body, expected in [("t", codec.TEXT), ({"a": 1}, codec.JSON), (b"b", codec.BYTES)]:
        headers = codec.outgoing(body).headers
        assert headers["content-type"] == headers["mdb_content_type"] == expected


def test_a_content_type_given_by_either_name_labels_both() -> None:
    for given in ({"content-type": "text/csv"}, {"mdb_content_type": "text/csv"}):
        headers = codec.outgoing("a,b", given).headers
        assert (headers["content-type"], headers["mdb_content_type"]) == ("text/csv", "text/csv")


def test_the_content_type_is_read_from_either_name() -> None:
    def received(headers: dict[str, str]) -> Message:
        return Message("i", Destination.parse("queue:q"), b"", headers, False, 1)

    assert received({"content-type": "text/csv"}).content_type == "text/csv"
    assert received({"mdb_content_type": "application/json"}).content_type == codec.JSON
    assert received({}).content_type is None
    assert OutgoingMessage(b"", {"mdb_content_type": codec.JSON}).content_type == codec.JSON
    # Another STOMP producer's content-type is the one that counts.
    assert received({"content-type": "text/csv", "mdb_content_type": "x/y"}).content_type \
        == "text/csv"


def test_a_header_no_selector_can_name_is_warned_about_once(
        caplog: pytest.LogCaptureFixture) -> None:
    dashed, digit = f"order-{uuid.uuid4().hex}", f"1{uuid.uuid4().hex}"  # new to this process
    with caplog.at_level(logging.WARNING, logger="mdb"):
        for _ in range(3):
            codec.outgoing("x", {dashed: "1", "region": "eu", "reply-to": "queue:r",
                                 "correlation-id": "c", "content-type": "text/csv"})
        codec.outgoing("x", {digit: "y"})
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert f"{dashed!r} is not a JMS identifier" in warned[0]
    assert f"{digit!r} is not a JMS identifier" in warned[1]
