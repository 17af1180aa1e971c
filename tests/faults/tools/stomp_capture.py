"""What went over the wire in a fault run, independent of mdb's own code and logs.

A fault run started with ``--capture DIR`` (``tests.faults.tools.random_faults``) records every
packet to and from the broker's STOMP port with ``tcpdump`` (``Capture``: one capture on the
private bridge, where the container processes' connections pass, one on the loopback, where
the producer's and the harness's do), keeps the broker's log files and each process's log in
DIR. This module then reads those captures without anything of mdb: a plain pcap reader,
TCP reassembly per connection and direction (gaps, i.e. bytes the capture missed, are
counted), and a STOMP frame parser::

    python -m tests.faults.tools.stomp_capture DIR MDB_ID

prints, with wall-clock times, every frame on every connection that mentions ``MDB_ID``
(the producer's SEND, each MESSAGE delivering it, a send on whose body is it), the RECEIPT of
each such SEND, every ACK or NACK carrying the ``ack`` id of one of those deliveries (and the
BEGIN/COMMIT/ABORT of its transaction), what each receiving connection wrote after the
delivery until it ended and who ended it, and the broker's restarts as seen on the wire (the
moments it closed every connection, the CONNECTED frames after). ``--summary`` prints only the
connections and restarts.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType

from tests.faults.tools.command_line import parser_for

__all__ = ["ACK_FLAG", "FIN", "SYN", "Capture", "Connection", "Frame", "Packet", "Wire",
           "connections", "frames", "read_pcap"]

# -- capturing -----------------------------------------------------------------------------------

CAPTURES = {"bridge": "stomp.pcap", "lo": "stomp-lo.pcap"}  # the interface's role → its file


class Capture:
    """``tcpdump`` of every packet of the TCP ``ports`` (the brokers' STOMP ports) on
    ``bridge`` (the container processes' namespaces reach the broker through it) and on
    ``lo`` (a process of this host reaching an address of this host, the bridge's too, goes
    through the loopback), into ``directory``; each process's log and the broker's log files
    are kept there as well. ``close`` stops both captures (SIGTERM by PID) and keeps what
    they said (their counts of packets dropped) in ``tcpdump-*.txt``."""

    def __init__(self, directory: Path, ports: Sequence[int], bridge: str | None) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._processes: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._handler: logging.Handler | None = None
        interfaces = {"lo": "lo"} if bridge is None else {"bridge": bridge, "lo": "lo"}
        (directory / "ports").write_text(" ".join(map(str, ports)) + "\n")
        expression = " or ".join(f"tcp port {port}" for port in ports)
        for role, interface in interfaces.items():
            said = directory / f"tcpdump-{role}.txt"
            with open(said, "wb") as out:
                process = subprocess.Popen(
                    ["tcpdump", "-i", interface, "-s", "0", "-U", "-B", "32768", "-n",
                     "-w", str(directory / CAPTURES[role]), expression],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
            self._processes.append((process, said))
        # The monotonic clock of the ledger's ``started`` and of the schedule's lines, against
        # the wall clock of the captures.
        (directory / "clock.json").write_text(json.dumps(
            {"wall": time.time(), "monotonic": time.monotonic()}) + "\n")
        deadline = time.monotonic() + 10
        while not all(said.read_bytes().count(b"listening on") for _, said in self._processes):
            if time.monotonic() > deadline or any(p.poll() is not None
                                                  for p, _ in self._processes):
                outputs = [path.read_text() for _, path in self._processes]
                self.close()
                raise RuntimeError(f"tcpdump did not start: {outputs}")
            time.sleep(0.05)

    def log_path(self, name: str) -> Path:
        """A new log file in the directory: ``name``, or ``name-2``… if taken."""
        path, number = self.directory / f"{name}.log", 1
        while path.exists():
            number += 1
            path = self.directory / f"{name}-{number}.log"
        return path

    def log_here(self, logger: str = "mdb") -> None:
        """This process's ``logger`` at INFO into ``this.log`` (the producer's)."""
        handler = logging.FileHandler(self.log_path("this"))
        handler.setFormatter(logging.Formatter(
            "%(created).6f %(threadName)s %(name)s %(levelname)s %(message)s"))
        logging.getLogger(logger).addHandler(handler)
        logging.getLogger(logger).setLevel(logging.INFO)
        self._handler = handler

    def keep(self, name: str, paths: Iterable[Path]) -> None:
        """Copy ``paths`` (a broker's log files) into the directory's ``name/``."""
        target = self.directory / name
        target.mkdir(exist_ok=True)
        for path in paths:
            if path.is_file():
                shutil.copy(path, target / path.name)

    def close(self) -> None:
        """Stop the captures (their files are complete then); never raises."""
        for process, _ in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            if process.poll() is None:
                process.kill()
                process.wait()
        self._processes.clear()
        if self._handler is not None:
            logging.getLogger("mdb").removeHandler(self._handler)
            self._handler.close()
            self._handler = None

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


# -- pcap and TCP --------------------------------------------------------------------------------

ETHERNET, RAW, LINUX_SLL, LINUX_SLL2 = 1, 101, 113, 276
FIN, SYN, RST, ACK_FLAG = 0x01, 0x02, 0x04, 0x10


@dataclass(frozen=True)
class Packet:
    """A TCP segment as captured: wall-clock ``time``, addresses, ports, flags, payload."""

    time: float
    source: tuple[str, int]
    target: tuple[str, int]
    seq: int
    flags: int
    payload: bytes


def read_pcap(path: Path) -> Iterator[Packet]:
    """The IPv4 TCP packets of a classic pcap file (microsecond or nanosecond, either byte
    order; link types Ethernet, raw IP, Linux cooked v1 and v2). A file cut short (a capture
    killed mid-write) ends at its last whole packet."""
    data = path.read_bytes()
    magic = data[:4]
    order, scale = {b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\xa1\xb2\xc3\xd4": (">", 1e-6),
                    b"\x4d\x3c\xb2\xa1": ("<", 1e-9), b"\xa1\xb2\x3c\x4d": (">", 1e-9),
                    }.get(magic, ("", 0.0))
    if not order:
        raise ValueError(f"{path}: not a classic pcap file (magic {magic.hex()})")
    link = struct.unpack(order + "I", data[20:24])[0] & 0x0FFFFFFF
    offset = 24
    while offset + 16 <= len(data):
        seconds, fraction, length, _ = struct.unpack(order + "IIII", data[offset:offset + 16])
        frame = data[offset + 16:offset + 16 + length]
        offset += 16 + length
        if len(frame) < length:
            return
        packet = _tcp(frame, link, seconds + fraction * scale)
        if packet is not None:
            yield packet


def _tcp(frame: bytes, link: int, when: float) -> Packet | None:
    if link == ETHERNET:
        kind, start = struct.unpack("!H", frame[12:14])[0], 14
        if kind == 0x8100:  # a VLAN tag
            kind, start = struct.unpack("!H", frame[16:18])[0], 18
    elif link == LINUX_SLL:
        kind, start = struct.unpack("!H", frame[14:16])[0], 16
    elif link == LINUX_SLL2:
        kind, start = struct.unpack("!H", frame[0:2])[0], 20
    elif link == RAW:
        kind, start = 0x0800, 0
    else:
        raise ValueError(f"link type {link} not supported")
    ip = frame[start:]
    if kind != 0x0800 or len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
        return None
    header, total = (ip[0] & 0x0F) * 4, struct.unpack("!H", ip[2:4])[0]
    source, target = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
    segment = ip[header:total] if total else ip[header:]  # 0: segmentation offload
    sport, dport, seq = struct.unpack("!HHI", segment[:8])
    data_offset, flags = (segment[12] >> 4) * 4, segment[13]
    return Packet(when, (source, sport), (target, dport), seq, flags, segment[data_offset:])


@dataclass
class Direction:
    """One direction of a connection, reassembled: ``data``, the wall-clock time each run of
    bytes was first seen (``starts``/``times``: the byte at offset o was first seen at
    ``times[bisect_right(starts, o) - 1]``), the offsets after which bytes are missing from the
    capture (``gaps``: offset → bytes missing), and when it ended (FIN or RST)."""

    data: bytes = b""
    starts: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    gaps: dict[int, int] = field(default_factory=dict)
    fin: float | None = None
    rst: float | None = None

    def time_at(self, offset: int) -> float:
        return self.times[max(0, bisect.bisect_right(self.starts, offset) - 1)]


@dataclass
class Connection:
    """A TCP connection to the broker: ``client`` and ``server`` (address, port), when its
    first packet was seen, each direction reassembled (``sent``: client to server)."""

    client: tuple[str, int]
    server: tuple[str, int]
    opened: float
    sent: Direction
    received: Direction

    @property
    def name(self) -> str:
        return f"{self.client[0]}:{self.client[1]}"

    @property
    def ended(self) -> float | None:
        """When the first FIN or RST of either side was seen."""
        return min((t for t in (self.sent.fin, self.sent.rst, self.received.fin,
                                self.received.rst) if t is not None), default=None)

    @property
    def ended_by(self) -> str:
        """Who sent that first FIN or RST: ``client``, ``server`` or ``-`` (still open)."""
        if self.ended is None:
            return "-"
        return "client" if self.ended in (self.sent.fin, self.sent.rst) else "server"


def _reassemble(packets: Sequence[Packet]) -> Direction:
    syn = next((p for p in packets if p.flags & SYN), None)
    carrying = [p for p in packets if p.payload]
    direction = Direction()
    ends = [p for p in packets if p.flags & (FIN | RST)]
    direction.fin = next((p.time for p in ends if p.flags & FIN), None)
    direction.rst = next((p.time for p in ends if p.flags & RST), None)
    if not carrying:
        return direction
    base = (syn.seq + 1) if syn else carrying[0].seq
    # Relative offsets (sequence numbers wrap at 2**32); a segment from before ``base`` (a
    # stray retransmission) would look huge and is left out.
    placed = sorted(((p.seq - base) & 0xFFFFFFFF, p.time, p.payload) for p in carrying)
    chunks: list[bytes] = []
    end = size = 0  # the stream offset placed up to; the bytes kept (holes have none)
    for offset, when, payload in placed:
        if offset >= 1 << 31:
            continue
        if offset > end:
            direction.gaps[size] = offset - end
            end = offset  # parsing resumes after the hole
        new = payload[end - offset:]
        if not new:
            continue  # a retransmission of bytes already placed
        direction.starts.append(size)
        direction.times.append(when)
        chunks.append(new)
        end += len(new)
        size += len(new)
    direction.data = b"".join(chunks)
    return direction


def connections(packets: Iterable[Packet], ports: Collection[int]) -> list[Connection]:
    """The packets split into connections to one of ``ports`` (a new SYN on the same address pair
    starts a new one), each direction reassembled; in the order they were first seen."""
    found: list[tuple[tuple[str, int], tuple[str, int], list[Packet], list[Packet]]] = []
    open_: dict[tuple[tuple[str, int], tuple[str, int]], int] = {}
    for packet in sorted(packets, key=lambda p: p.time):
        from_client = packet.target[1] in ports
        if not from_client and packet.source[1] not in ports:
            continue
        client, server = ((packet.source, packet.target) if from_client
                          else (packet.target, packet.source))
        key = client, server
        fresh = packet.flags & SYN and not packet.flags & ACK_FLAG and from_client
        if key not in open_ or (fresh and any(p.payload for p in found[open_[key]][2])):
            open_[key] = len(found)
            found.append((client, server, [], []))
        _, _, up, down = found[open_[key]]
        (up if from_client else down).append(packet)
    return [Connection(client, server, min(p.time for p in [*up, *down]),
                       _reassemble(up), _reassemble(down))
            for client, server, up, down in found]


# -- STOMP ---------------------------------------------------------------------------------------

COMMANDS = (b"CONNECT", b"STOMP", b"CONNECTED", b"SEND", b"SUBSCRIBE", b"UNSUBSCRIBE", b"ACK",
            b"NACK", b"BEGIN", b"COMMIT", b"ABORT", b"DISCONNECT", b"MESSAGE", b"RECEIPT",
            b"ERROR")
_ESCAPES = {"\\n": "\n", "\\c": ":", "\\\\": "\\", "\\r": "\r"}


@dataclass(frozen=True)
class Frame:
    """One STOMP frame as it went over the wire: when its last byte was first seen, its
    command, headers (the first of a repeated one, escapes undone) and body."""

    time: float
    command: str
    headers: dict[str, str]
    body: bytes
    raw: bytes


def _unescape(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        pair = value[i:i + 2]
        if pair in _ESCAPES:
            out.append(_ESCAPES[pair])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _resync(data: bytes, start: int) -> int:
    """The first offset from ``start`` where a frame seems to begin (after a hole)."""
    best = len(data)
    for command in COMMANDS:
        at = data.find(command + b"\n", start)
        while at > start and data[at - 1] not in (0, 10):
            at = data.find(command + b"\n", at + 1)
        if at >= 0:
            best = min(best, at)
    return best


def frames(direction: Direction) -> list[Frame]:
    """The STOMP frames of one direction (heart-beat end-of-lines skipped; a frame cut by a
    hole in the capture or by the connection's end is left out)."""
    data, found, position = direction.data, [], 0
    holes = sorted(direction.gaps)
    while position < len(data):
        while position < len(data) and data[position] in (10, 13):
            position += 1
        if position >= len(data):
            break
        ends = [e for e in (data.find(b"\n\n", position), data.find(b"\n\r\n", position))
                if e >= 0]
        if not ends:
            break
        head_end = min(ends)
        body_start = head_end + (2 if data[head_end:head_end + 2] == b"\n\n" else 3)
        lines = data[position:head_end].decode("utf-8", "replace").split("\n")
        command = lines[0].rstrip("\r")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.rstrip("\r").partition(":")
            if command not in ("CONNECT", "CONNECTED"):
                name, value = _unescape(name), _unescape(value)
            headers.setdefault(name, value)
        length = headers.get("content-length", "")
        end = (body_start + int(length) if length.isdigit()
               else data.find(b"\0", body_start))
        if end < 0 or end >= len(data):
            break
        hole = next((h for h in holes if position < h <= end), None)
        if command.encode() not in COMMANDS or hole is not None:
            position = _resync(data, hole if hole is not None else position + 1)
            continue
        found.append(Frame(direction.time_at(end), command, headers, data[body_start:end],
                           data[position:end + 1]))
        position = end + 1
    return found


# -- the report ----------------------------------------------------------------------------------

def _when(moment: float) -> str:
    return datetime.fromtimestamp(moment).strftime("%H:%M:%S.%f")[:-3]


def _short(frame: Frame, most: int = 160) -> str:
    keep = ("destination", "receipt", "receipt-id", "id", "ack", "subscription", "message-id",
            "redelivered", "transaction", "mdb_id", "mdb_maybe_repeat", "message",
            "x-delivery-count")
    headers = " ".join(f"{k}:{v}" for k, v in frame.headers.items() if k in keep)
    body = frame.body[:60].decode("utf-8", "replace")
    return f"{frame.command} {headers}" + (f" body:{body!r}" if body else "")[:most]


@dataclass
class Wire:
    """Every connection of a capture directory, its frames parsed."""

    connections: list[Connection]
    up: dict[int, list[Frame]]  # connection index → frames client to server
    down: dict[int, list[Frame]]  # server to client
    names: dict[str, str]  # client address → who it is

    @classmethod
    def load(cls, directory: Path, ports: Collection[int]) -> Wire:
        packets: list[Packet] = []
        for name in CAPTURES.values():
            if (directory / name).exists():
                packets += read_pcap(directory / name)
        found = connections(packets, ports)
        names: dict[str, str] = {}
        if (directory / "rooms.json").exists():
            names = json.loads((directory / "rooms.json").read_text())
        return cls(found, {i: frames(c.sent) for i, c in enumerate(found)},
                   {i: frames(c.received) for i, c in enumerate(found)}, names)

    def who(self, index: int) -> str:
        connection = self.connections[index]
        return (f"#{index} {connection.name}"
                f" ({self.names.get(connection.client[0], 'this host')})")

    def restarts(self) -> list[tuple[float, int]]:
        """The moments the server ended connections that had carried data, two or more within
        a second (a kill or a stop closes every one), with how many; heart-beat drops of one
        connection are not among them."""
        ends = sorted(c.ended for c in self.connections
                      if c.received.data and c.ended is not None and c.ended_by == "server")
        bursts: list[tuple[float, int]] = []
        for moment in ends:
            if bursts and moment - bursts[-1][0] < 1.0:
                bursts[-1] = bursts[-1][0], bursts[-1][1] + 1
            else:
                bursts.append((moment, 1))
        return [b for b in bursts if b[1] >= 2]

    def summary(self) -> list[str]:
        lines, empty = [], 0
        for index, connection in enumerate(self.connections):
            if not connection.sent.data and not connection.received.data:
                empty += 1  # refused while the broker was down, or a port probe
                continue
            gaps = sum(connection.sent.gaps.values()) + sum(connection.received.gaps.values())
            ended = connection.ended
            lines.append(f"{self.who(index)} {_when(connection.opened)} to "
                         f"{_when(ended) if ended else 'open'} ended by "
                         f"{connection.ended_by}; "
                         f"up {len(self.up[index])} frames, down {len(self.down[index])}"
                         + (f"; {gaps} bytes missing from the capture" if gaps else ""))
        lines.append(f"connections that carried no data (refused, probes): {empty}")
        for moment, count in self.restarts():
            lines.append(f"{_when(moment)} the server ended {count} connections")
        return lines

    def trace(self, message_id: str) -> list[str]:
        """Everything on the wire about ``message_id`` (see the module's docstring)."""
        needle = message_id.encode()
        out: list[str] = []
        events: list[tuple[float, str]] = []
        acks: dict[str, int] = {}  # ack id → connection of its delivery
        receipts: dict[tuple[int, str], str] = {}
        delivered: dict[int, float] = {}  # connection → time of its (last) delivery
        for index in range(len(self.connections)):
            for frame in self.up[index]:
                if needle in frame.raw:
                    events.append((frame.time, f"{self.who(index)} → {_short(frame)}"))
                    if "receipt" in frame.headers:
                        receipts[index, frame.headers["receipt"]] = frame.command
            for frame in self.down[index]:
                if needle in frame.raw:
                    events.append((frame.time, f"{self.who(index)} ← {_short(frame)}"))
                    if frame.command == "MESSAGE" and "ack" in frame.headers:
                        acks[frame.headers["ack"]] = index
                        delivered[index] = frame.time
        for index in range(len(self.connections)):
            transactions = set()
            for frame in self.up[index]:
                if frame.command in ("ACK", "NACK") and frame.headers.get("id") in acks:
                    events.append((frame.time, f"{self.who(index)} → {_short(frame)}"
                                   f"  <-- settles the delivery on #{acks[frame.headers['id']]}"))
                    if "transaction" in frame.headers:
                        transactions.add(frame.headers["transaction"])
            for frame in self.up[index]:
                if (frame.command in ("BEGIN", "COMMIT", "ABORT")
                        and frame.headers.get("transaction") in transactions):
                    events.append((frame.time, f"{self.who(index)} → {_short(frame)}"))
            for frame in self.down[index]:
                if (frame.command == "RECEIPT"
                        and (index, frame.headers.get("receipt-id", "")) in receipts):
                    events.append((frame.time, f"{self.who(index)} ← {_short(frame)}"))
                if frame.command == "ERROR":
                    events.append((frame.time, f"{self.who(index)} ← {_short(frame)}"))
        for moment, count in self.restarts():
            events.append((moment, f"-- the server ended {count} connections"))
            later = [(f.time, i) for i, c in enumerate(self.connections)
                     for f in self.down[i] if f.command == "CONNECTED" and f.time > moment]
            if later:
                first = min(later)
                events.append((first[0], f"-- first CONNECTED after it, {self.who(first[1])}"))
        events.sort()
        out += [f"{_when(t)} {text}" for t, text in events]
        for index, moment in sorted(delivered.items()):
            out.append(f"after the delivery on {self.who(index)}:")
            out += self._after(index, moment)
        if not acks:
            out.append("no MESSAGE frame carried it")
        elif not any("settles" in text for _, text in events):
            out.append(f"no ACK or NACK for its ack ids {sorted(acks)} on any connection")
        return out

    def _after(self, index: int, moment: float, most: int = 12) -> list[str]:
        """What the client of connection ``index`` wrote after ``moment`` (the first and the
        last ``most`` frames, a count of each command), how the connection ended."""
        connection = self.connections[index]
        written = [f for f in self.up[index] if f.time >= moment]
        counts = Counter(f.command for f in written)
        lines = [f"  the client wrote {len(written)} frames: "
                 + ", ".join(f"{c} {n}" for c, n in sorted(counts.items()))]
        shown = (written if len(written) <= 2 * most
                 else [*written[:most], None, *written[-most:]])
        lines += [f"  {_when(f.time)} → {_short(f)}" if f else "  …" for f in shown]
        heard = [f for f in self.down[index] if f.time >= moment]
        lines.append(f"  then: {len(heard)} frames from the server "
                     f"({', '.join(sorted({f.command for f in heard}))})")
        for label, moment_ in (("client FIN", connection.sent.fin),
                               ("client RST", connection.sent.rst),
                               ("server FIN", connection.received.fin),
                               ("server RST", connection.received.rst)):
            if moment_ is not None:
                lines.append(f"  {label} at {_when(moment_)}")
        missing = sum(connection.sent.gaps.values()) + sum(connection.received.gaps.values())
        lines.append(f"  bytes missing from the capture on this connection: {missing}")
        return lines


@dataclass
class Delivery:
    """One MESSAGE frame carrying an ``mdb_id``, and what its client did about it."""

    connection: int
    time: float
    message_id: str
    destination: str
    ack: str
    redelivered: bool
    #: ``ack`` (an ACK the server confirmed: a RECEIPT for it or a later frame of the
    #: connection), ``ack unconfirmed``, ``nack``, ``nack unconfirmed`` or ``none`` (no
    #: ACK or NACK written by any client)
    settled: str = "none"
    again: bool = False  # the same mdb_id delivered again later (on any connection)


def audit(wire: Wire) -> list[str]:
    """Every delivery of the capture and every confirmed SEND accounted for: was it settled,
    did what was not settled come again, did what was confirmed come at all. The loss the
    fault runs look for is a delivery not settled that never came again (``lost held``), or
    a confirmed SEND never delivered (``lost queued``)."""
    deliveries: list[Delivery] = []
    sends: dict[str, tuple[int, float, str, bool]] = {}  # mdb_id → conn, time, dest, confirmed
    settlements: dict[str, str] = {}
    for index in range(len(wire.connections)):
        up, down = wire.up[index], wire.down[index]
        answered = {f.headers.get("receipt-id") for f in down if f.command == "RECEIPT"}
        # The server handles a connection's frames in order: a RECEIPT confirms its frame
        # and every frame written before it.
        confirmed = max((i for i, f in enumerate(up) if f.headers.get("receipt") in answered),
                        default=-1)
        for number, frame in enumerate(up):
            sure = number <= confirmed
            if frame.command == "SEND" and "mdb_id" in frame.headers:
                sends.setdefault(frame.headers["mdb_id"], (
                    index, frame.time, frame.headers.get("destination", ""), sure))
            elif frame.command in ("ACK", "NACK") and "id" in frame.headers:
                kind = frame.command.lower() + ("" if sure else " unconfirmed")
                if settlements.get(frame.headers["id"], "none").endswith("unconfirmed") or \
                        frame.headers["id"] not in settlements:
                    settlements[frame.headers["id"]] = kind
        deliveries += [
            Delivery(index, f.time, f.headers["mdb_id"], f.headers.get("destination", ""),
                     f.headers.get("ack", ""), f.headers.get("redelivered") == "true")
            for f in down if f.command == "MESSAGE" and "mdb_id" in f.headers]
    deliveries.sort(key=lambda d: d.time)
    last: dict[str, float] = {}
    for delivery in deliveries:
        delivery.settled = settlements.get(delivery.ack, "none")
        last[delivery.message_id] = delivery.time
    for delivery in deliveries:
        delivery.again = last[delivery.message_id] > delivery.time
    lines = []
    by_destination: dict[str, list[Delivery]] = {}
    for delivery in deliveries:
        by_destination.setdefault(delivery.destination, []).append(delivery)
    for destination, found in sorted(by_destination.items()):
        counts = Counter(d.settled for d in found)
        ids = {d.message_id for d in found}
        lines.append(f"{destination}: {len(found)} deliveries of {len(ids)} ids, "
                     f"{sum(d.redelivered for d in found)} flagged redelivered; settled: "
                     + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
        for kind in ("none", "ack unconfirmed", "nack", "nack unconfirmed"):
            some = [d for d in found if d.settled == kind]
            if some:
                lines.append(f"  {kind}: {len(some)}, delivered again later "
                             f"{sum(d.again for d in some)}")
        for delivery in found:
            if delivery.settled in ("none", "nack", "nack unconfirmed") and not delivery.again:
                connection = wire.connections[delivery.connection]
                ended = connection.ended
                lines.append(
                    f"  LOST HELD {delivery.message_id}: delivered {_when(delivery.time)} on "
                    f"{wire.who(delivery.connection)} (ack {delivery.ack}, redelivered "
                    f"{str(delivery.redelivered).lower()}), {delivery.settled} settled it, "
                    f"never delivered again; the connection ended "
                    + (f"{_when(ended)} by the {connection.ended_by}" if ended else "never"))
    delivered = {d.message_id for d in deliveries}
    told = {i: s for i, s in sends.items() if s[3]}
    lines.append(f"SENDs with an mdb_id: {len(sends)}, confirmed by a RECEIPT {len(told)}, "
                 f"of those never delivered: {len(told.keys() - delivered)}")
    for message_id in sorted(told.keys() - delivered):
        index, moment, destination, _ = told[message_id]
        lines.append(f"  LOST QUEUED {message_id}: sent {_when(moment)} to {destination} on "
                     f"{wire.who(index)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("stomp_capture", __doc__)
    parser.add_argument("directory", type=Path, help="the --capture DIR of a fault run")
    parser.add_argument("ids", nargs="*", help="mdb ids to trace")
    parser.add_argument("--port", type=int, action="append",
                        help="a broker's STOMP port (default: those in DIR/ports)")
    parser.add_argument("--summary", action="store_true", help="connections and restarts")
    parser.add_argument("--audit", action="store_true",
                        help="account for every delivery and every confirmed SEND")
    args = parser.parse_args(argv)
    ports = args.port or [int(p) for p in (args.directory / "ports").read_text().split()]
    wire = Wire.load(args.directory, ports)
    if args.summary or not (args.ids or args.audit):
        print("\n".join(wire.summary()))
    if args.audit:
        print("\n".join(audit(wire)))
    for message_id in args.ids:
        print(f"== {message_id}")
        print("\n".join(wire.trace(message_id)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
