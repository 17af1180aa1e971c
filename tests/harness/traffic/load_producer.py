"""The loads of the fault tests: producers that send continuously from a thread of their own
while faults happen, and remember which sends returned (``told``: the contract owes those) and
which raised (docs/architecture.md, "Delivery contract"). ``LoadProducer`` is mdb's
``Producer``; the foreign one is ``tests.harness.traffic.foreign.ForeignLoad``."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import Counter
from typing import Self

import anyio

from mdb import Producer, Settings
from mdb.errors import MdbError
from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from tests.harness.processes.fleet import WAIT


class Load(ABC):
    """Sends from a thread of its own (``_send_until_stopped``) until ``stop``, which raises
    again what broke the thread. What it was told: ``told`` maps each send a broker confirmed
    to that broker, ``raised`` each send that raised to why; the thread writes both under
    ``_lock``, the test reads copies."""

    def __init__(self, name: str) -> None:
        self._lock = threading.Lock()
        self._told: dict[str, str] = {}
        self._raised: dict[str, str] = {}
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name=name)

    @property
    def told(self) -> dict[str, str]:
        with self._lock:
            return dict(self._told)

    @property
    def raised(self) -> dict[str, str]:
        with self._lock:
            return dict(self._raised)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = WAIT) -> None:
        """Stop sending; re-raise what broke the thread."""
        self._stopping.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self._thread.name} did not stop"
        if self._error is not None:
            raise AssertionError(f"{self._thread.name} failed: {self._error!r}") from self._error

    def _main(self) -> None:
        try:
            self._send_until_stopped()
        except BaseException as exc:
            self._error = exc

    @abstractmethod
    def _send_until_stopped(self) -> None:
        """Send until ``_stopping`` is set."""


class LoadProducer(Load):
    """``Producer(settings)`` sending to ``topic:<topic>`` (``kind="queue"``: ``queue:<topic>``)
    in a loop, in its own thread, with ``pace`` seconds between sends. ``told`` maps the id of
    every send that returned to the broker that confirmed it; ``raised`` maps the id of every
    send that raised to the error. ``switch`` makes it send with another topology
    (``Brokers.apply``)."""

    def __init__(self, settings: Settings, topic: str, pace: float = 0.01,
                 kind: str = "topic") -> None:
        self.settings, self.destination = settings, Destination.parse(f"{kind}:{topic}")
        self.pace = pace
        super().__init__("the load producer")
        self._changed = threading.Condition(self._lock)  # a send returned or the thread ended
        self._switch: tuple[Settings, threading.Event] | None = None
        self._over = False

    def switch(self, settings: Settings, timeout: float = WAIT) -> None:
        """Send with ``settings``' topology from now on: when this
        returns, no send with the old topology is under way or will be made."""
        switched = threading.Event()
        with self._lock:
            self._switch = settings, switched
        if not switched.wait(timeout):
            self.stop()  # re-raises what broke the producer thread, if anything did
            raise AssertionError(f"the producer did not switch topology in {timeout} s")

    def wait_told(self, count: int, timeout: float = WAIT) -> None:
        """Wait until ``count`` more sends returned (the producer keeps going meanwhile)."""
        with self._changed:
            target = len(self._told) + count
            done = self._changed.wait_for(
                lambda: len(self._told) >= target or self._over, timeout)
            told = len(self._told) - (target - count)
        if self._over:
            self.stop()  # re-raises what broke the producer thread
        if not done:
            raise AssertionError(f"{count} sends in {timeout} s: only {told}; raised "
                                 f"{Counter(self.raised.values())}")

    def _send_until_stopped(self) -> None:
        anyio.run(self._run)

    def _main(self) -> None:
        try:
            super()._main()
        finally:  # a waiter of ``wait_told`` learns that no more sends will return
            with self._changed:
                self._over = True
                self._changed.notify_all()

    async def _run(self) -> None:
        async with Producer(self.settings) as producer:
            number = 0
            while not self._stopping.is_set():
                with self._lock:
                    switch, self._switch = self._switch, None
                if switch is not None:
                    producer.brokers.apply(switch[0], {})
                    switch[1].set()
                message = codec.outgoing(f"m{number}", None)
                number += 1
                try:
                    member = await producer.send_message(self.destination, message)
                except MdbError as exc:
                    with self._lock:
                        self._raised[message.headers[ID]] = type(exc).__name__
                else:
                    with self._changed:
                        self._told[message.headers[ID]] = member.broker
                        self._changed.notify_all()
                await anyio.sleep(self.pace)
