"""The capture reader of the fault runs (``tests.faults.tools.stomp_capture``) on a pcap file built
here: TCP segments out of order, retransmitted, overlapping or missing, STOMP frames split
across segments, and the trace of one message id through them."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.faults.tools.stomp_capture import (
    ACK_FLAG,
    FIN,
    SYN,
    Packet,
    Wire,
    audit,
    connections,
    frames,
    read_pcap,
)

CLIENT, SERVER = ("10.1.2.3", 40000), ("10.1.2.1", 61613)


def ethernet(source: tuple[str, int], target: tuple[str, int], seq: int, flags: int,
             payload: bytes) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", source[1], target[1], seq, 0, 5 << 4, flags, 65535, 0, 0)
    length = 20 + len(tcp) + len(payload)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, length, 0, 0, 64, 6, 0,
                     bytes(map(int, source[0].split("."))),
                     bytes(map(int, target[0].split("."))))
    return b"\x00" * 12 + b"\x08\x00" + ip + tcp + payload


def pcap(path: Path, packets: list[tuple[float, bytes]]) -> Path:
    """A classic pcap (microseconds, little-endian, Ethernet) of ``packets``."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for when, frame in packets:
        seconds = int(when)
        out.append(struct.pack("<IIII", seconds, round((when - seconds) * 1e6), len(frame),
                               len(frame)) + frame)
    path.write_bytes(b"".join(out))
    return path


SEND = b"SEND\ndestination:/topic/t\nmdb_id:abc123\nreceipt:7\n\nbody\x00"
MESSAGE = (b"MESSAGE\nsubscription:1\ndestination:/topic/t\nmessage-id:T_1@@s@@5\n"
           b"ack:T_1@@s@@5\nmdb_id:abc123\ncontent-length:5\n\nb\x00ody\x00\n")
ACK = b"ACK\nid:T_1@@s@@5\n\n\x00"


def test_out_of_order_and_retransmitted_segments_are_reassembled(tmp_path: Path) -> None:
    up, down = (CLIENT, SERVER), (SERVER, CLIENT)
    packets = [
        (100.0, ethernet(*up, 1000, SYN, b"")),
        (100.001, ethernet(*down, 5000, SYN | ACK_FLAG, b"")),
        # The SEND in two segments, the second first; the first retransmitted.
        (100.010, ethernet(*up, 1001 + 10, ACK_FLAG, SEND[10:])),
        (100.011, ethernet(*up, 1001, ACK_FLAG, SEND[:10])),
        (100.012, ethernet(*up, 1001, ACK_FLAG, SEND[:10])),
        # A heart-beat, then the MESSAGE (a NUL in its body: content-length), then a RECEIPT.
        (100.020, ethernet(*down, 5001, ACK_FLAG, b"\n" + MESSAGE[:30])),
        (100.021, ethernet(*down, 5001 + 31, ACK_FLAG, MESSAGE[30:])),
        (100.022, ethernet(*down, 5001 + 1 + len(MESSAGE), ACK_FLAG,
                           b"RECEIPT\nreceipt-id:7\n\n\x00")),
        (100.030, ethernet(*up, 1001 + len(SEND), ACK_FLAG | FIN, ACK)),
    ]
    wire = Wire.load(pcap(tmp_path / "stomp.pcap", packets).parent, [SERVER[1]])
    [connection] = wire.connections
    assert connection.client == CLIENT and connection.ended_by == "client"
    assert not connection.sent.gaps and not connection.received.gaps
    assert [f.command for f in wire.up[0]] == ["SEND", "ACK"]
    [message, receipt] = wire.down[0]
    assert message.body == b"b\x00ody" and message.headers["ack"] == "T_1@@s@@5"
    assert message.time == 100.021 and receipt.headers["receipt-id"] == "7"
    # The SEND's last byte came in the first segment seen.
    assert wire.up[0][0].time == 100.010
    trace = "\n".join(wire.trace("abc123"))
    assert "→ SEND" in trace and "← MESSAGE" in trace and "← RECEIPT receipt-id:7" in trace
    assert "settles the delivery on #0" in trace
    assert not [line for line in audit(wire) if "LOST" in line]


def test_a_delivery_never_settled_nor_delivered_again_is_lost_held(tmp_path: Path) -> None:
    packets = [
        (1.0, ethernet(SERVER, CLIENT, 1, ACK_FLAG, MESSAGE)),
        (1.5, ethernet(CLIENT, SERVER, 1, ACK_FLAG, b"ACK\nid:T_1@@s@@4\n\n\x00")),
        (2.0, ethernet(SERVER, CLIENT, 1 + len(MESSAGE), ACK_FLAG | FIN, b"")),
    ]
    wire = Wire.load(pcap(tmp_path / "stomp.pcap", packets).parent, [SERVER[1]])
    [lost] = [line for line in audit(wire) if "LOST" in line]
    assert "LOST HELD abc123" in lost and "none settled it" in lost  # @@4 is another
    assert "by the server" in lost


def test_a_hole_in_the_capture_is_counted_and_the_frames_around_it_kept(
        tmp_path: Path) -> None:
    second = b"ACK\nid:x\n\n\x00"
    stream = SEND + ACK + second
    packets = [
        (1.0, ethernet(CLIENT, SERVER, 1, ACK_FLAG, stream[:len(SEND)])),
        # The first ACK's segment is missing from the capture.
        (1.2, ethernet(CLIENT, SERVER, 1 + len(SEND) + len(ACK), ACK_FLAG, second)),
    ]
    [connection] = connections(read_pcap(pcap(tmp_path / "hole.pcap", packets)), [SERVER[1]])
    assert connection.sent.gaps == {len(SEND): len(ACK)}
    assert [(f.command, f.headers.get("id")) for f in frames(connection.sent)] == [
        ("SEND", None), ("ACK", "x")]


def test_a_new_syn_on_the_same_ports_is_a_new_connection(tmp_path: Path) -> None:
    packets = [
        (1.0, ethernet(CLIENT, SERVER, 10, SYN, b"")),
        (1.1, ethernet(CLIENT, SERVER, 11, ACK_FLAG, ACK)),
        (2.0, ethernet(CLIENT, SERVER, 90000, SYN, b"")),
        (2.1, ethernet(CLIENT, SERVER, 90001, ACK_FLAG, SEND)),
    ]
    found = connections(read_pcap(pcap(tmp_path / "two.pcap", packets)), [SERVER[1]])
    assert [[f.command for f in frames(c.sent)] for c in found] == [["ACK"], ["SEND"]]
    assert [
        p.time for p in read_pcap(tmp_path / "two.pcap")] == [1.0, 1.1, 2.0, 2.1]
    assert isinstance(next(read_pcap(tmp_path / "two.pcap")), Packet)
