"""``mdb_stomp.framing``: bytes cut into frames where stomp.py's receiver cuts them."""

from __future__ import annotations

from mdb_stomp.framing import HEARTBEAT, Splitter


def fed(splitter: Splitter, *reads: bytes) -> list[bytes]:
    return [frame for data in reads for frame in splitter.feed(data)]


def test_frames_end_at_their_nul_whatever_the_reads() -> None:
    stream = b"RECEIPT\nreceipt-id:1\n\n\x00\nMESSAGE\nack:a\n\nbody\x00\r\n"
    whole = [b"RECEIPT\nreceipt-id:1\n\n", b"MESSAGE\nack:a\n\nbody"]
    assert fed(Splitter(), stream) == whole
    one_by_one = Splitter()
    # A line break read on its own after a frame looks like a heart-beat, as it does to stomp.py.
    assert [f for f in fed(one_by_one, *(stream[i:i + 1] for i in range(len(stream))))
            if f != HEARTBEAT] == whole
    assert len(one_by_one) == 0


def test_line_breaks_between_frames_are_heartbeats() -> None:
    splitter = Splitter()
    assert fed(splitter, b"\n", b"\r\n\n", b"RECEIPT\n\n\x00") == [
        HEARTBEAT, HEARTBEAT, b"RECEIPT\n\n"]
    # A line break inside a frame still being read is part of it.
    assert fed(splitter, b"MESSAGE\n", b"\n", b"x\x00") == [b"MESSAGE\n\nx"]


def test_a_body_holding_nuls_ends_where_its_content_length_says() -> None:
    frame = b"MESSAGE\ncontent-length:5\nack:a\n\na\x00b\x00c"
    splitter = Splitter()
    assert fed(splitter, frame[:20], frame[20:]) == []  # its NUL has not come yet
    assert fed(splitter, b"\x00MESSAGE\n\nnext\x00") == [frame, b"MESSAGE\n\nnext"]


def test_a_nul_in_a_header_cuts_the_frame_as_stomp_py_does() -> None:
    """Joined again by ``mdb_stomp.reassembly``, which expects these pieces."""
    assert fed(Splitter(), b"MESSAGE\nbad:x\x00\ny\nack:a\n\nbody\x00") == [
        b"MESSAGE\nbad:x", b"y\nack:a\n\nbody"]
