"""The producer of the fault tests: it sends continuously from a thread of its own while faults
happen, and remembers which sends returned (``told``: the contract owes those) and which
raised (docs/architecture.md, "Delivery contract")."""

from __future__ import annotations

import threading
from collections import Counter

import anyio

from mdb import Producer, Settings, codec
from mdb.destinations import Destination
from mdb.errors import MdbError
from mdb.message import ID
from tests.harness.fleet import WAIT


class LoadProducer:
    """``Producer(settings)`` sending to ``topic:<topic>`` (``kind="queue"``: ``queue:<topic>``)
    in a loop, in its own thread, with ``pace`` seconds between sends. ``told`` maps the id of
    every send that returned to the broker that confirmed it; ``raised`` maps the id of every
    send that raised to the error. ``switch`` makes it send with another topology
    (``Brokers.apply``)."""

    def __init__(self, settings: Settings, topic: str, pace: float = 0.01,
                 kind: str = "topic") -> None:
        self.settings, self.destination = settings, Destination.parse(f"{kind}:{topic}")
        self.pace = pace
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a send returned or the thread ended
        self._told: dict[str, str] = {}
        self._raised: dict[str, str] = {}
        self._stopping = threading.Event()
        self._switch: tuple[Settings, threading.Event] | None = None
        self._error: BaseException | None = None
        self._ended = False
        self._thread = threading.Thread(target=self._main, daemon=True, name="load-producer")

    def __enter__(self) -> LoadProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sending; re-raise what broke the producer thread (anything not an MdbError)."""
        self._stopping.set()
        self._thread.join(timeout=WAIT)
        assert not self._thread.is_alive(), "the producer did not stop"
        if self._error is not None:
            raise AssertionError(f"the producer failed: {self._error!r}") from self._error

    @property
    def told(self) -> dict[str, str]:
        with self._lock:
            return dict(self._told)

    @property
    def raised(self) -> dict[str, str]:
        with self._lock:
            return dict(self._raised)

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
                lambda: len(self._told) >= target or self._ended, timeout)
            told = len(self._told) - (target - count)
        if self._ended:
            self.stop()  # re-raises what broke the producer thread
        if not done:
            raise AssertionError(f"{count} sends in {timeout} s: only {told}; raised "
                                 f"{Counter(self.raised.values())}")

    def _main(self) -> None:
        try:
            anyio.run(self._run)
        except BaseException as exc:
            self._error = exc
        finally:
            with self._changed:
                self._ended = True
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
