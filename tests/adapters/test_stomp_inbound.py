"""``mdb_stomp.protocol.inbound``: bytes cut into frames, their headers parsed, and a NUL byte in
the headers of a MESSAGE frame kept and reported as damage."""

from __future__ import annotations

import pytest
import stomp.utils

from mdb_stomp.protocol import inbound
from mdb_stomp.protocol.inbound import HEARTBEAT, NEVER_ENDED, NUL_IN_HEADER, InboundFrame, Splitter

Parts = tuple[str, dict[str, str], bytes, str | None]


def fed(splitter: Splitter, *reads: bytes) -> list[InboundFrame]:
    return [frame for data in reads for frame in splitter.feed(data)]


def parts(frames: list[InboundFrame]) -> list[Parts]:
    return [(f.command, f.headers, f.body, f.damage) for f in frames]


def test_frames_end_at_their_nul_whatever_the_reads() -> None:
    stream = b"RECEIPT\nreceipt-id:1\n\n\x00\nMESSAGE\nack:a\n\nbody\x00\r\n"
    whole: list[Parts] = [("RECEIPT", {"receipt-id": "1"}, b"", None),
                          ("MESSAGE", {"ack": "a"}, b"body", None)]
    assert parts(fed(Splitter(), stream)) == whole
    one_by_one = Splitter()
    # A line break read on its own after a frame looks like a heart-beat, as it does to stomp.py.
    assert parts([f for f in fed(one_by_one, *(stream[i:i + 1] for i in range(len(stream))))
                  if f is not HEARTBEAT]) == whole
    assert len(one_by_one) == 0


def test_line_breaks_between_frames_are_heartbeats() -> None:
    splitter = Splitter()
    frames = fed(splitter, b"\n", b"\r\n\n", b"RECEIPT\n\n\x00")
    assert frames[:2] == [HEARTBEAT, HEARTBEAT]
    assert parts(frames[2:]) == [("RECEIPT", {}, b"", None)]
    # A line break inside a frame still being read is part of it.
    assert parts(fed(splitter, b"MESSAGE\n", b"\n", b"x\x00")) == [("MESSAGE", {}, b"x", None)]


def test_a_body_holding_nuls_ends_where_its_content_length_says() -> None:
    frame = b"MESSAGE\ncontent-length:5\nack:a\n\na\x00b\x00c"
    splitter = Splitter()
    assert fed(splitter, frame[:20], frame[20:]) == []  # its NUL has not come yet
    assert parts(fed(splitter, b"\x00MESSAGE\n\nnext\x00")) == [
        ("MESSAGE", {"content-length": "5", "ack": "a"}, b"a\x00b\x00c", None),
        ("MESSAGE", {}, b"next", None)]


def test_headers_are_parsed_as_stomp_py_parses_them() -> None:
    """Escapes undone, the first of repeated headers kept, CRLF line breaks, lines without a
    name or a colon skipped, undecodable bytes replaced."""
    [frame] = Splitter().feed(b"ERROR\r\na\\cb:c\\nd\\\\\r\nx:1\r\nx:2\r\n:v\r\nnone\r\n"
                              b"bad:\xff\r\n\r\nwhy\x00")
    assert parts([frame]) == [
        ("ERROR", {"a:b": "c\nd\\", "x": "1", "bad": "\ufffd"}, b"why", None)]
    assert frame.raw == (b"ERROR\r\na\\cb:c\\nd\\\\\r\nx:1\r\nx:2\r\n:v\r\nnone\r\n"
                         b"bad:\xff\r\n\r\nwhy")
    # ActiveMQ escapes the colons of its ids; an unknown escape and a last backslash are kept.
    preamble = b"MESSAGE\nack:ID\\cvm-1\\c2\nn\\r\\n:a\\tb\\\nz:\\c\\\\c"
    [message] = Splitter().feed(preamble + b"\n\nx\x00")
    assert message.headers == stomp.utils.parse_frame(preamble).headers == {
        "ack": "ID:vm-1:2", "n\r\n": "a\\tb\\", "z": ":\\c"}


def test_a_nul_in_a_message_header_keeps_the_frame_whole_and_marks_it_damaged() -> None:
    """stomp.py would cut it at the NUL and lose the line break after it."""
    assert parts(fed(Splitter(), b"MESSAGE\nbad:x\x00\ny:1\nack:a\n\nbody\x00")) == [
        ("MESSAGE", {"bad": "x\x00", "y": "1", "ack": "a"}, b"body", NUL_IN_HEADER)]


def test_a_nul_in_another_frame_ends_it_as_stomp_py_does() -> None:
    """The broker writes those: a frame without its blank line must not swallow the next."""
    assert parts(fed(Splitter(), b"RECEIPT\nreceipt-id:1\x00MESSAGE\nack:a\n\nbody\x00")) == [
        ("RECEIPT", {"receipt-id": "1"}, b"", None), ("MESSAGE", {"ack": "a"}, b"body", None)]


def test_a_message_whose_headers_never_end_is_given_up_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbound, "MAX_HELD", 64)
    splitter = Splitter()
    assert fed(splitter, b"MESSAGE\nack:a\nx:\x00", b"y" * 40) == []
    # Past the limit: what came up to the last NUL is the damaged frame, the rest starts anew.
    assert parts(fed(splitter, b"\x00RECEIPT\nreceipt-id:7")) == [
        ("MESSAGE", {"ack": "a", "x": "\x00" + "y" * 40}, b"", NEVER_ENDED)]
    assert parts(fed(splitter, b"\n\n\x00")) == [("RECEIPT", {"receipt-id": "7"}, b"", None)]


def test_a_body_read_in_many_pieces_is_waited_for_without_parsing_its_headers_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    head = inbound._head

    def counted(preamble: bytes) -> tuple[str, dict[str, str]]:
        parsed.append(preamble)
        return head(preamble)

    monkeypatch.setattr(inbound, "_head", counted)
    body = bytes(range(256)) * 40  # NULs included
    frame = b"MESSAGE\ncontent-length:%d\nack:a\n\n" % len(body) + body + b"\x00"
    splitter = Splitter()
    pieces = [frame[i:i + 100] for i in range(0, len(frame), 100)]
    assert [f for piece in pieces[:-1] for f in splitter.feed(piece)] == []
    assert len(splitter) == len(frame) - len(pieces[-1])
    assert parts(splitter.feed(pieces[-1])) == [
        ("MESSAGE", {"content-length": str(len(body)), "ack": "a"}, body, None)]
    assert parsed == [b"MESSAGE\ncontent-length:10240\nack:a"]
    assert len(splitter) == 0
