"""A shared-store master/slave pair of private ActiveMQ brokers for tests.

Two ``ActiveMQ`` processes run the reference ``mdb_stomp/activemq-shared-store.xml`` with one
KahaDB directory between them, each with its own STOMP port, base directory and log. The one
holding the store's lock file serves (the master); the other retries the lock every second and
opens no connector (the slave)::

    with SharedStorePair() as pair:       # the first serves, then the second waits as slave
        pair.urls                         # both addresses, the master's first
        old = pair.kill_master()          # kill -9 of whichever serves now
        new = pair.wait_master()          # the slave took the lock and answers STOMP
        old.start()                       # back as the waiting one (``waiting`` is True)

Both brokers log in the same user with the same password, as a client moving from one to the
other needs. A broker's ``start`` returns once it serves or once its log (since this start)
says it is waiting for the lock, never after a fixed sleep. Signals go to the brokers' PIDs only.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.harness.servers.activemq import ActiveMQ, reference_config
from tests.harness.servers.process import stomp_answers

__all__ = ["SharedStoreBroker", "SharedStorePair"]

# SharedFileLocker's line when another process holds the lock (ActiveMQ 5.17).
_WAITING_FOR_LOCK = "is locked by another server. This broker is now in slave mode"


class SharedStoreBroker(ActiveMQ):
    """One broker of a pair: ``ActiveMQ`` on the shared-store config with ``store_dir`` as its
    KahaDB directory. ``start`` returns once it serves (``serving``) or waits for the lock
    (``waiting``); ``RuntimeError`` if neither happens within ``startup_timeout``."""

    def __init__(self, base_dir: Path, store_dir: Path, password: str | None = None,
                 host: str | None = None) -> None:
        super().__init__(base_dir, config=reference_config("activemq-shared-store.xml"),
                         jvm_args=(f"-Dmdb.store.dir={store_dir}",), host=host)
        if password is not None:
            self.password = password
        self._log_offset = 0  # where this start's log begins

    @property
    def serving(self) -> bool:
        """True when the broker runs and its STOMP port answers a CONNECT (it is the master)."""
        return self.running and stomp_answers(self.host, self.port, self.stomp_connect, 1.0)

    @property
    def waiting(self) -> bool:
        """True when the broker runs, does not serve, and logged since its start that another
        server holds the lock (it is the slave)."""
        return self.running and self._logged_waiting() and not self.serving

    def _prepare(self) -> None:
        super()._prepare()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0

    def wait_ready(self, timeout: float) -> None:
        """Poll until the broker serves or waits for the lock; ``RuntimeError`` after
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while not (self._logged_waiting() or self.serving):
            if not self.running:
                raise RuntimeError(f"{self.name} exited during startup:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.name} neither served on port {self.port} nor waited "
                                   f"for the lock within {timeout}s:\n{self.log_tail()}")
            time.sleep(self.poll_interval)

    def _logged_waiting(self) -> bool:
        if not self.log_path.exists():
            return False
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            return _WAITING_FOR_LOCK.encode() in log.read()


class SharedStorePair:
    """Two ``SharedStoreBroker`` on one store in a temporary directory (deleted by ``close``),
    listening on ``host`` (default ``127.0.0.1``; see ``ActiveMQ``). Not thread-safe; meant for
    test fixtures."""

    def __init__(self, host: str | None = None) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix="mdb-activemq-pair-"))
        store = self.base_dir / "store"
        first = SharedStoreBroker(self.base_dir / "a", store, host=host)
        self.brokers = (first, SharedStoreBroker(self.base_dir / "b", store, first.password,
                                                 host=host))

    @property
    def urls(self) -> list[str]:
        """Both brokers' URLs (credentials included), in the order the pair was made."""
        return [b.url for b in self.brokers]

    def start(self) -> Self:
        """Start the first broker and wait until it serves, then the second and wait until it
        waits for the lock."""
        first, second = self.brokers
        first.start()
        if not first.serving:
            raise RuntimeError(f"the first broker of the pair does not serve:\n{first.log_tail()}")
        self.start_as_slave(second)
        return self

    def start_as_slave(self, broker: SharedStoreBroker) -> None:
        """Start ``broker`` (stopped) while the other serves: it must come up waiting."""
        broker.start()
        if not broker.waiting:
            raise RuntimeError(f"broker on port {broker.port} did not wait for the lock:\n"
                               f"{broker.log_tail()}")

    def master(self) -> SharedStoreBroker:
        """The broker that serves now; ``RuntimeError`` when none does."""
        for broker in self.brokers:
            if broker.serving:
                return broker
        raise RuntimeError("no broker of the pair serves")

    def kill_master(self) -> SharedStoreBroker:
        """kill -9 the broker that serves now and return it."""
        master = self.master()
        master.kill()
        return master

    def wait_master(self, timeout: float = 60.0) -> SharedStoreBroker:
        """Wait until a broker serves (after a master died: the takeover) and return it."""
        deadline = time.monotonic() + timeout
        while True:
            for broker in self.brokers:
                if broker.serving:
                    return broker
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no broker of the pair served within {timeout}s:\n"
                                   + "\n".join(b.log_tail() for b in self.brokers))
            time.sleep(SharedStoreBroker.poll_interval)

    def close(self) -> None:
        """Stop both (the waiting one first, so the master's stop is no takeover) and delete
        the directory."""
        for broker in sorted(self.brokers, key=lambda b: b.serving):
            broker.close()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
