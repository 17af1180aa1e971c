"""The foreign producer of the exactly-once fault tests: messages sent with plain stomp.py, as
a Java service or any producer that is not mdb sends them (docs/interop.md): persistent,
with no ``mdb_id`` and no other header of mdb's, each body a business id (``m17``). mdb
knows such a message only by what its broker says of it (docs/exactly-once.md, "What
happens to a message").

``ForeignProducer`` sends one message at a time to a ``Member`` (a STOMP destination on
one broker) and returns once that broker's receipt came; ``ForeignLoad`` sends ``m0``,
``m1``, … from a thread, spread over the members, and remembers which sends each broker
confirmed and which it may or may not have stored.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import stomp
from stomp.exception import NotConnectedException, StompException

from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.load_producer import Load

RECEIPT_TIMEOUT = 5.0  # seconds for a CONNECTED or a RECEIPT: a paused broker sends neither
BACK_OFF = 1.0  # seconds a load leaves a broker alone after it took no connection


@dataclass(frozen=True)
class Member:
    """A member of a distributed destination as a foreign producer addresses it: its STOMP
    destination (``path``) on ``broker``, whose name in the settings is ``name``."""

    name: str
    broker: BrokerProcess
    path: str


class Unreachable(Exception):
    """The broker took no connection: nothing was sent."""


class SendFailed(Exception):
    """A message was sent and no receipt came: the broker may have stored it or not."""


class _Frames(stomp.ConnectionListener):  # type: ignore[misc]
    """What one connection heard: CONNECTED, the receipts, its end."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.connected = False
        self.lost: str | None = None
        self.receipts: set[str] = set()

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: done() or self.lost is not None, timeout)

    def _note(self, change: Callable[[], None]) -> None:
        with self.changed:
            change()
            self.changed.notify_all()

    def on_connected(self, frame: Any) -> None:
        self._note(lambda: setattr(self, "connected", True))

    def on_receipt(self, frame: Any) -> None:
        self._note(lambda: self.receipts.add(frame.headers["receipt-id"]))

    def on_error(self, frame: Any) -> None:
        self._note(lambda: setattr(self, "lost", f"ERROR {frame.headers.get('message')}"))

    def on_disconnected(self) -> None:
        self._note(lambda: setattr(self, "lost", "disconnected"))


class ForeignProducer:
    """One stomp.py connection per broker, made when first needed and made again after it
    failed. Not thread-safe."""

    def __init__(self, timeout: float = RECEIPT_TIMEOUT) -> None:
        self._timeout = timeout
        self._connections: dict[BrokerProcess, tuple[stomp.Connection12, _Frames]] = {}

    def send(self, member: Member, body: str) -> None:
        """Send ``body`` to ``member``, persistent, and wait for the broker's receipt.
        ``Unreachable`` when its broker takes no connection, ``SendFailed`` when the receipt
        does not come (the connection is then dropped)."""
        connection, frames = self._connection(member.broker)
        receipt = uuid.uuid4().hex
        try:
            connection.send(member.path, body, headers={"persistent": "true",
                                                        "receipt": receipt})
        except NotConnectedException as exc:
            self._drop(member.broker)
            raise Unreachable(f"{member.name}: not connected") from exc
        except (StompException, OSError) as exc:
            self._drop(member.broker)
            raise SendFailed(f"{member.name}: {exc!r}") from exc
        if not frames.wait(lambda: receipt in frames.receipts, self._timeout):
            self._drop(member.broker)
            raise SendFailed(f"{member.name}: no receipt in {self._timeout:g} s")
        if receipt not in frames.receipts:
            self._drop(member.broker)
            raise SendFailed(f"{member.name}: {frames.lost} before the receipt")

    def close(self) -> None:
        for broker in list(self._connections):
            self._drop(broker)

    def __enter__(self) -> ForeignProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self, broker: BrokerProcess) -> tuple[stomp.Connection12, _Frames]:
        found = self._connections.get(broker)
        if found is not None and found[1].lost is None:
            return found
        self._drop(broker)
        connection = stomp.Connection12([(broker.host, broker.port)], vhost=broker.vhost,
                                        reconnect_attempts_max=1)
        frames = _Frames()
        connection.set_listener("foreign", frames)
        try:
            # Not wait=True: stomp.py would wait for a paused broker's CONNECTED for ever.
            connection.connect(broker.username, broker.password, wait=False)
        except (StompException, OSError) as exc:
            raise Unreachable(f"{broker.url}: {exc!r}") from exc
        if not frames.wait(lambda: frames.connected, self._timeout) or not frames.connected:
            connection.transport.disconnect_socket()
            raise Unreachable(f"{broker.anonymous_url}: no CONNECTED ({frames.lost})")
        self._connections[broker] = connection, frames
        return connection, frames

    def _drop(self, broker: BrokerProcess) -> None:
        # The socket, not a DISCONNECT: a paused broker would never answer it.
        found = self._connections.pop(broker, None)
        if found is not None:
            found[0].transport.disconnect_socket()


class ForeignLoad(Load):
    """A ``ForeignProducer`` sending ``m0``, ``m1``, … in its own thread, ``pace`` seconds
    apart: ``mN`` to member N modulo their number, or, while that one's broker takes no
    connection (tried again ``BACK_OFF`` seconds later), to the next. ``told`` maps each
    body a broker confirmed to its name, ``raised`` each body sent without a receipt to why
    (stored or not: no one knows)."""

    def __init__(self, members: Sequence[Member], pace: float) -> None:
        super().__init__("the foreign producer")
        self._members, self._pace = members, pace
        self._down_until: dict[str, float] = {}  # member name → monotonic time

    def _send_until_stopped(self) -> None:
        with ForeignProducer() as producer:
            number = 0
            while not self._stopping.is_set():
                if self._send(producer, number):
                    number += 1
                self._stopping.wait(self._pace)

    def _send(self, producer: ForeignProducer, number: int) -> bool:
        """Send ``m<number>``; False when no broker took a connection (nothing sent)."""
        body, count = f"m{number}", len(self._members)
        for member in (self._members[(number + i) % count] for i in range(count)):
            if self._down_until.get(member.name, 0.0) > time.monotonic():
                continue
            try:
                producer.send(member, body)
            except Unreachable:
                self._down_until[member.name] = time.monotonic() + BACK_OFF
                continue
            except SendFailed as exc:
                with self._lock:
                    self._raised[body] = str(exc)
            else:
                with self._lock:
                    self._told[body] = member.name
            return True
        return False
