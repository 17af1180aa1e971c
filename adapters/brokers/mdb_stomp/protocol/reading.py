"""``LoopReading``: a stomp.py connection's socket read on the event loop, not on a thread.

stomp.py reads on a receiver thread of its own; every frame then had to cross to the event loop
(``call_soon_threadsafe``: a pipe write, a second thread woken, the GIL handed over), and the
ACK written from the loop contended for the GIL with the next read. Measured on ActiveMQ, one
message at a time, a hand-written consumer: 91-102 µs of CPU per message acking on the receiver
thread, 132-147 µs when each message crossed to a loop, 82-85 µs reading on the loop
(docs/performance.md). So stomp.py connects, but its receiver thread is never started
(``Transport.override_threading``): the loop watches the socket (``add_reader``) and hands what
it reads to a ``FrameReader`` (``mdb_stomp.protocol.inbound``), which cuts and parses the frames and
hands MESSAGE frames to the subscriptions, the others to stomp.py's ``process_frame``.

Only the loop reads, writes and closes the socket. mdb's own frames are written with ``write``
(on the loop). Frames stomp.py writes (CONNECT on the connecting thread, heart-beats on its
own thread, DISCONNECT on the loop) go through ``Transport.send``, which hands them to the
loop (a TLS connection may not be read and written by two threads at once).
``Transport.disconnect_socket`` called on another thread (a heart-beat timeout) only shuts the
socket down, which ends any read or write blocked on it, and asks the loop to close it: the
loop stops watching a socket before it is closed, or its number, free again, could be another
connection's while the loop still watched it.

Held frames. A frame that surely has another written right behind it (a BEGIN, its first SEND;
a transacted ACK, its COMMIT or ABORT) is written ``held``: kept back and written with the next
frame, half the system calls and TCP segments of a settlement, in the same order.

Sockets. Plain sockets stay blocking: a read the loop was told is ready never blocks, and a
write to a broker that stopped reading blocks the loop until the heart-beat thread shuts the
socket down (as writes did before). stomp.py makes TLS sockets non-blocking and writes them
from its receiver thread's queue; here they are made blocking again, so that its writes are
made at once. A TLS read can then wait for the rest of a record whose start arrived, until the
heart-beat timeout at worst.

Quick acks. A broker whose STOMP connector keeps Nagle's algorithm on (ActiveMQ without
``transport.tcpNoDelay=true``: Debian's stock config, managed brokers) holds a small frame while
an earlier one is not yet acked by TCP, and the kernel here delays that ACK up to ~40 ms when
it has nothing to write: a settlement waiting for a receipt then waited that long (a handler
sending one message, measured 20 msg/s against 180-320 with quick acks, docs/activemq.md). On
Linux each read therefore asks for the next segments to be acked at once (``TCP_QUICKACK``, which
the kernel drops by itself after a while): one system call per read, and no round trip of a
waiting settlement is exposed to the broker's Nagle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket as _socket
import ssl
import threading
from typing import Any

import stomp.exception

from mdb_stomp.protocol.inbound import FrameReader

log = logging.getLogger("mdb_stomp")

#: Bytes asked of the socket per read (stomp.py asks 1,024).
READ_SIZE = 64 * 1024

#: Linux's quick-ack option, re-armed after each read (the kernel drops it by itself): see
#: "Quick acks" in the module docstring.
QUICKACK: int | None = getattr(_socket, "TCP_QUICKACK", None)


class LoopReading:
    """Reads ``transport`` (a stomp.py ``Transport``) on ``loop`` for ``reader``, from when
    stomp.py has connected its socket until it is closed. Made on the loop's thread, before
    stomp.py connects."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Any,
                 reader: FrameReader) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._transport = transport
        self._reader = reader
        self._watched: int | None = None  # the socket's number while the loop watches it
        self._held: list[bytes] = []  # frames written held, for the next write to take along
        self._disconnect = transport.disconnect_socket
        transport.override_threading(self._connected)
        transport.disconnect_socket = self._disconnect_socket
        transport.send = self._send_on_loop

    def _connected(self, _receiver_loop: object) -> None:
        """stomp.py's socket is connected (called on the connecting thread, in place of
        starting its receiver thread, before the CONNECT frame is written)."""
        transport = self._transport
        if not transport.blocking:  # TLS: see the module docstring
            transport.shutdown_queue()
            transport.socket.setblocking(True)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to read for
            self._loop.call_soon_threadsafe(self._watch)

    def _watch(self) -> None:
        sock = self._transport.socket
        if sock is None or not self._transport.running:
            return  # closed meanwhile
        self._watched = sock.fileno()
        self._loop.add_reader(self._watched, self._readable)

    def _unwatch(self) -> None:
        if self._watched is not None:
            self._loop.remove_reader(self._watched)
            self._watched = None

    def _readable(self) -> None:
        """The socket has bytes (or is closed): read them and hand them on."""
        sock = self._transport.socket
        while sock is not None:
            try:
                data = sock.recv(READ_SIZE)
            except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:  # the broker closed the connection, or it was shut down
                self._disconnect_socket()
                return
            if QUICKACK is not None:
                sock.setsockopt(_socket.IPPROTO_TCP, QUICKACK, 1)
            self._reader.read(data)
            # What TLS decrypted beyond this read is not seen by the loop's select.
            sock = self._transport.socket
            if not isinstance(sock, ssl.SSLSocket) or not sock.pending():
                return

    def write(self, frame: bytes, held: bool = False) -> None:
        """Write ``frame`` (encoded) now, with the frames held before it; ``held``: keep it
        back for the next write instead (module docstring, "Held frames"). Loop thread only;
        ``NotConnectedException`` once the socket is closed, or what the write raised."""
        sock = self._transport.socket
        if sock is None:
            raise stomp.exception.NotConnectedException()
        if held:
            self._held.append(frame)
            return
        if self._held:
            frame = b"".join((*self._held, frame))
            self._held.clear()
        sock.sendall(frame)

    def _send_on_loop(self, encoded_frame: bytes) -> None:
        """``Transport.send``: written now on the loop; posted to it from another thread (the
        CONNECT frame from the connecting thread, whose failure the CONNECTED deadline
        notices; a heart-beat, whose failure the reads notice). stomp.py's own guards each
        write with a semaphore, which only one writer needs not."""
        if threading.get_ident() == self._loop_thread:
            self.write(encoded_frame)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(self._send_quietly, encoded_frame)

    def _send_quietly(self, encoded_frame: bytes) -> None:
        try:
            self._send_on_loop(encoded_frame)
        except Exception:
            log.debug("a frame from another thread could not be written", exc_info=True)

    def _disconnect_socket(self) -> None:
        """``Transport.disconnect_socket``, always finished on the loop (module docstring)."""
        if threading.get_ident() == self._loop_thread:
            self._unwatch()
            self._disconnect()
            return
        sock = self._transport.socket
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(_socket.SHUT_RDWR)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(self._disconnect_socket)
