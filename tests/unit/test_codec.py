"""Bodies decode from the handler's annotation; a body that does not decode is a DecodeError."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from mdb.errors import DecodeError, EncodeError, MdbError
from mdb.messages import codec
from mdb.messages.headers import ID
from mdb_stomp.protocol.limits import HEADER_LIMITS


class Order(BaseModel):
    id: str
    quantity: int


@pytest.mark.parametrize(
    ("annotation", "body", "expected"),
    [
        (bytes, b"\x00\xff", b"\x00\xff"),
        (str, "héllo".encode(), "héllo"),
        (dict, b'{"a": 1}', {"a": 1}),
        (list[int], b"[1, 2]", [1, 2]),
        (Order, b'{"id": "o-1", "quantity": 2}', Order(id="o-1", quantity=2)),
    ],
)
def test_decodes_by_annotation(annotation: object, body: bytes, expected: object) -> None:
    assert codec.decoder_for(annotation)(body) == expected


@pytest.mark.parametrize(
    ("annotation", "body"),
    [(str, b"\xff\xfe"), (dict, b"not json"), (dict, b"[1]"), (Order, b'{"id": 1}')],
)
def test_a_body_that_does_not_decode_raises_decode_error(annotation: object, body: bytes) -> None:
    with pytest.raises(DecodeError):
        codec.decoder_for(annotation)(body)


def test_outgoing_messages_carry_a_content_type_and_a_fresh_id() -> None:
    first = codec.outgoing(Order(id="o", quantity=1), {"region": "eu"})
    second = codec.outgoing("text")
    assert first.body == b'{"id":"o","quantity":1}'
    assert first.content_type == codec.JSON and first.headers["region"] == "eu"
    assert second.content_type == codec.TEXT
    assert first.headers[ID] != second.headers[ID]


def test_an_unsendable_body_says_what_can_be_sent() -> None:
    with pytest.raises(TypeError, match="pydantic model") as raised:
        codec.outgoing(object())
    assert isinstance(raised.value, EncodeError) and isinstance(raised.value, MdbError)


class Payment(BaseModel):
    card: int


@pytest.mark.parametrize(("annotation", "body"), [
    (Payment, b'{"card": "4111-1111-1111-1111"}'),
    (dict[str, int], b'{"card": "4111-1111-1111-1111"}'),
    (list[int], b'["4111-1111-1111-1111"]'),
    (int, b'"4111-1111-1111-1111"'),
])
def test_a_decode_error_says_where_and_why_but_never_shows_the_body(annotation: object,
                                                                    body: bytes) -> None:
    """The text goes to logs, span status and error headers, where a body must never be."""
    with pytest.raises(DecodeError) as caught:
        codec.decoder_for(annotation)(body)
    text = str(caught.value)
    assert "4111" not in text and "input_value" not in text and "https://" not in text
    assert "valid integer" in text


def test_headers_beyond_the_bounds_are_refused_before_sending() -> None:
    """ActiveMQ refuses such a frame by dropping the connection, which would make the send's
    outcome unknown ("may have been stored") when it surely failed."""
    # with content-type, mdb_content_type and mdb_id
    limits = HEADER_LIMITS
    fits = {f"h{n}": "v" for n in range(limits.count - 3)}
    assert len(codec.outgoing("x", fits, limits=limits).headers) == limits.count
    for headers, why in [
        ({f"h{n}": "v" for n in range(limits.count - 2)}, "headers, more than"),
        ({"big": "x" * limits.line}, "bytes as a header line"),
        ({f"h{n}": "x" * 8000 for n in range(40)}, "bytes of headers"),
    ]:
        with pytest.raises(EncodeError, match=why):
            codec.outgoing("x", headers, limits=limits)
