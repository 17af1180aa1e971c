"""Container processes of the fault tests: apps of ``tests.harness.apps.topic_ledger_app`` on one
topic, started, killed and stopped by the test, their ledgers gathered in one place (``Fleet``)
and checked by ``tests.harness.traffic.ledger``; the settings of a fault run (``fault_settings``);
and what ActiveMQ brokers still store once the processes stopped (``left_behind``, ``browse``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import string
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import stomp

from mdb import Settings
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import DestinationSettings, MemberSettings
from mdb.messages.headers import ID
from tests.harness.processes.application_secret import ENVIRONMENT as SECRET_ENVIRONMENT
from tests.harness.processes.container_process import ROOT, ContainerProcess
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.ledger import PER_APP, PER_SERVER, Verdict, check, check_sent_on, views

WAIT = 60.0  # seconds to wait for something that should happen after a fault
LISTENER = "on_entry"  # the ledger app's listener
SEND_TO = "LEDGER_SEND_TO"  # makes the ledger app a two-stage pipeline through this queue


# -- settings and brokers ------------------------------------------------------------------------

BROKER_NAMES = tuple(string.ascii_lowercase)  # a, b, c, … in the order of the URLs


def fault_settings(urls: Sequence[str | list[str]], topic: str, heartbeat_ms: int = 1000,
                   **values: object) -> Settings:
    """Settings for fault runs: brokers ``a``, ``b``, ``c``… at ``urls`` (a list: one broker at
    several addresses, e.g. a master/slave pair) with short heartbeats (``heartbeat_ms``) and
    reconnect delays; with several brokers ``topic:<topic>`` is partitioned, one member on
    each broker."""
    brokers = {name: BrokerSettings(url=url, heartbeat_ms=heartbeat_ms, reconnect_delay=0.2,
                                    reconnect_max_delay=1.0, connect_timeout=3.0,
                                    receipt_timeout=5.0)
               for name, url in zip(BROKER_NAMES[:len(urls)], urls, strict=True)}
    destinations = ({} if len(urls) == 1 else {f"topic:{topic}": DestinationSettings(
        members=[MemberSettings(broker=b) for b in brokers])})
    values.setdefault("app", "faults")
    values.setdefault("server", "producer")
    return Settings(brokers=brokers, destinations=destinations, **values)  # type: ignore[arg-type]


# -- container processes -------------------------------------------------------------------------

_CONNECTION_LOST = re.compile(r"connection-lost: broker (\w+)")
_MEMBER_EVENT = re.compile(r"(member-available|member-unavailable): member (\S+)@(\w+)")
_HEALTH = re.compile(r"mdb: health on (http://\S+)")
LEDGER_APP = "tests.harness.apps.topic_ledger_app"
LOG_TAIL = 20  # log lines of each process kept for a failure's message


class LedgerProcess(ContainerProcess):
    """A ``ContainerProcess`` whose reader tolerates log lines of other threads mixed into a
    ledger line (stdout and stderr share one pipe), and that also reports the container's
    ``connection-lost: broker X`` and ``member-(un)available: member D@X`` events (as
    ``{"event": kind, "broker": X, "member": D}``) and its rejected topology changes (as
    ``rejected``), so a test can wait until a process noticed a fault or a topology change.

    With ``config``, the process runs ``mdb run … --config config`` and gets its topology from
    that file only (none in the environment, which would override the file); ``health`` is then
    its health endpoint's URL if the file sets ``health_port``. ``args`` are more options of
    ``mdb run`` (``--workers 2``). ``prefix`` goes before the command (``Namespace.prefix`` of
    ``tests.harness.servers.netns`` runs it in a network namespace).
    """

    def __init__(self, settings: Settings, app: str, server: str, env: Mapping[str, str],
                 lines: queue.Queue[dict[str, Any]], config: Path | None = None,
                 args: Sequence[str] = (), prefix: Sequence[str] = (),
                 log_file: Path | None = None) -> None:
        self.app = app
        self.health: str | None = None
        #: Where every line it prints goes too, after the wall-clock time it was read.
        self.log_file = log_file
        #: The last lines it printed that were not ledger lines (its log), for a failure's
        #: message.
        self.log: deque[str] = deque(maxlen=LOG_TAIL)
        if config is None:
            super().__init__(settings, "unused", app, server, hang=False, module=LEDGER_APP,
                             env=env, lines=lines, args=args, prefix=prefix)
            return
        environment = {**{k: v for k, v in os.environ.items() if not k.startswith("MDB_")},
                       **SECRET_ENVIRONMENT,
                       "MDB_APP": app, "MDB_SERVER": server, "MDB_LOG_LEVEL": "WARNING", **env}
        self.server, self.lines = server, lines
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "mdb.commands.cli", "run", LEDGER_APP, "--config",
             str(config), *args],
            cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def __enter__(self) -> LedgerProcess:
        super().__enter__()
        return self

    def _read(self) -> None:
        assert self.process.stdout is not None
        decoder = json.JSONDecoder()
        pid = self.process.pid
        with (open(self.log_file, "a") if self.log_file else contextlib.nullcontext()) as log:
            if log:
                log.write(f"{time.time():.6f} pid {pid}\n")
            for line in self.process.stdout:
                if log:
                    log.write(f"{time.time():.6f} {line}")
                    log.flush()
                self._take(line, decoder, pid)

    def _take(self, line: str, decoder: json.JSONDecoder, pid: int) -> None:
        """The ledger lines and the events in one printed line."""
        start = line.find('{"event"')
        if start < 0:
            self.log.append(line.rstrip())
        while start >= 0:
            try:
                entry, end = decoder.raw_decode(line, start)
            except json.JSONDecodeError:
                break
            self.lines.put(entry)
            start = line.find('{"event"', end)
        if "mdb: ready" in line:
            self.lines.put({"event": "ready", "server": self.server, "pid": pid})
        if "mdb: stopped" in line:
            self.lines.put({"event": "stopped", "server": self.server, "pid": pid,
                            "line": line})
        for broker in _CONNECTION_LOST.findall(line):
            self.lines.put({"event": "connection-lost", "broker": broker, "pid": pid})
        for kind, member, broker in _MEMBER_EVENT.findall(line):
            self.lines.put({"event": kind, "member": member, "broker": broker, "pid": pid})
        if "topology change rejected" in line:
            self.lines.put({"event": "rejected", "pid": pid, "line": line})
        if health := _HEALTH.search(line):
            self.health = health[1]


class Fleet:
    """Container processes of ``tests.harness.apps.topic_ledger_app`` on ``topic:<topic>``, one
    ledger.

    Every line of every process lands in ``seen`` (in the order the test read them); ``wait``
    reads lines until a condition holds.
    """

    def __init__(self, settings: Settings, topic: str, stack: ExitStack) -> None:
        self.settings, self.topic, self.stack = settings, topic, stack
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.processes: list[LedgerProcess] = []
        self.distribution: dict[str, str] = {}  # app → its distribution
        self.env: dict[str, Mapping[str, str]] = {}  # app → what its processes get
        self.servers: dict[str, set[str]] = defaultdict(set)  # app → every server it ran
        self.app_of: dict[int, str] = {}  # pid → app
        self._by_app: dict[str, set[str]] = defaultdict(set)  # app → ids processed
        self._by_server: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._received: dict[str, set[str]] = defaultdict(set)  # app → sources of stage 2
        #: A new log file per name (``Capture.log_path``): each process started from now on
        #: logs at INFO and every line it prints is kept there.
        self.log_files: Callable[[str], Path] | None = None

    def start(self, app: str, servers: Sequence[str], distribution: str = PER_APP,
              env: Mapping[str, str] | None = None, config: Path | None = None,
              args: Sequence[str] = (), prefix: Sequence[str] = ()) -> list[LedgerProcess]:
        """Start one process per server and wait until each says ``mdb: ready``; with
        ``config``, the processes read their settings from that TOML file (``--config``);
        ``args`` are more options of ``mdb run`` (``--workers 2``); ``prefix`` goes before each
        command (see ``LedgerProcess``)."""
        self.distribution[app] = distribution
        self.env[app] = env or {}
        started = [self.stack.enter_context(LedgerProcess(
            self.settings, app, server,
            env={"LEDGER_TOPIC": self.topic, "LEDGER_DISTRIBUTION": distribution,
                 "MDB_SHUTDOWN_GRACE_PERIOD": "5",
                 **({"MDB_LOG_LEVEL": "INFO"} if self.log_files else {}), **(env or {})},
            lines=self.lines, config=config, args=args, prefix=prefix,
            log_file=self.log_files(f"{app}-{server}") if self.log_files else None))
            for server in servers]
        self.processes += started
        self.servers[app] |= set(servers)
        self.app_of |= {p.process.pid: app for p in started}
        pids = {p.process.pid for p in started}

        def ready(f: Fleet) -> bool:
            if exited := {p.server: p.process.poll() for p in started
                          if p.process.poll() is not None}:
                raise AssertionError(f"{exited} exited before ready; logs "
                                     f"{ {p.server: list(p.log) for p in started} }")
            return pids <= {e["pid"] for e in f.events("ready")}
        self.wait(ready, f"{servers} ready")
        return started

    def wait(self, condition: Callable[[Fleet], bool], what: str, timeout: float = WAIT) -> None:
        """Read ledger lines until ``condition(self)`` holds; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not condition(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logs = {p.server: list(p.log) for p in self.processes}
                raise AssertionError(f"waited {timeout} s for {what}; "
                                     f"last lines {self.seen[-10:]}; logs {logs}")
            try:
                self._add(self.lines.get(timeout=min(remaining, 0.5)))
            except queue.Empty:
                continue
            self.catch_up()  # take everything already there before checking again

    def catch_up(self) -> None:
        """Read every line the processes' readers have queued so far (``wait`` reads only
        until its condition holds)."""
        while True:
            try:
                self._add(self.lines.get_nowait())
            except queue.Empty:
                return

    def hold(self, seconds: float) -> None:
        """Let ``seconds`` pass (a fault's duration, a gap of load), reading the ledger
        meanwhile."""
        until = time.monotonic() + seconds
        self.wait(lambda f: time.monotonic() >= until, "a gap", timeout=seconds + WAIT)

    def _add(self, entry: dict[str, Any]) -> None:
        self.seen.append(entry)
        if entry.get("event") == "done" and "source" in entry:
            self._received[entry["app"]].add(entry["source"])
        elif entry.get("event") == "done":
            self._by_app[entry["app"]].add(entry["id"])
            self._by_server[entry["app"], entry["server"]].add(entry["id"])

    def events(self, event: str, processes: Iterable[LedgerProcess] | None = None,
               ) -> list[dict[str, Any]]:
        pids = None if processes is None else {p.process.pid for p in processes}
        return [e for e in self.seen
                if e.get("event") == event and (pids is None or e.get("pid") in pids)]

    def done(self, app: str | None = None) -> list[dict[str, Any]]:
        """The ``done`` entries (of ``app``), but a pipeline's second stage's (``sent_on``)."""
        return [e for e in self.events("done")
                if (app is None or e["app"] == app) and "source" not in e]

    def sent_on(self, app: str) -> list[dict[str, Any]]:
        """The ``done`` entries of ``app``'s second stage (``SEND_TO``)."""
        return [e for e in self.events("done") if e["app"] == app and "source" in e]

    def consumed_since(self, pid: int, since: int) -> bool:
        """True when process ``pid`` processed a message after the ``since``-th line of
        ``seen``."""
        return any(e.get("event") == "done" and e["pid"] == pid for e in self.seen[since:])

    def processed(self, app: str, server: str | None = None) -> set[str]:
        """The ids ``app`` (or its ``server``) processed so far (a live set: do not change)."""
        return self._by_app[app] if server is None else self._by_server[app, server]

    def received(self, app: str) -> set[str]:
        """The first-stage ids whose sends on ``app``'s second stage processed (a live set)."""
        return self._received[app]

    def kill(self, process: LedgerProcess) -> None:
        """SIGKILL one process: a crash with work in flight. Returns once every line it
        printed before it died is read, so that what it had finished is known."""
        process.process.send_signal(signal.SIGKILL)
        process.process.wait(timeout=WAIT)
        process.reader.join(timeout=WAIT)
        while not self.lines.empty():
            self._add(self.lines.get_nowait())

    def alive(self) -> list[LedgerProcess]:
        return [p for p in self.processes if p.process.poll() is None]

    def stop(self) -> None:
        """SIGTERM every live process; each exits 0 after printing ``mdb: stopped``, so its
        whole ledger is in ``seen``."""
        alive = self.alive()
        for process in alive:
            process.process.send_signal(signal.SIGTERM)
        codes = {p.server: p.process.wait(timeout=WAIT) for p in alive}
        assert all(code == 0 for code in codes.values()), codes
        pids = {p.process.pid for p in alive}
        self.wait(lambda f: pids <= {e["pid"] for e in f.events("stopped")}, "stopped lines")

    def verdicts(self, told: Collection[str]) -> dict[str, Verdict]:
        """The contract per app (``one-copy-per-app``) or per server (``one-copy-per-server``):
        every server a per-server app ever ran is expected to process everything. A pipeline's
        second stage has a verdict of its own, ``"<app> stage 2"`` (``check_sent_on``)."""
        found: dict[str, Verdict] = {}
        for app, distribution in self.distribution.items():
            if SEND_TO in self.env[app]:
                found[f"{app} stage 2"] = check_sent_on(self.done(app), self.sent_on(app))
            grouped = views(self.done(app), distribution)
            if distribution == PER_SERVER:  # a server that processed nothing is still owed all
                for server in self.servers[app]:
                    grouped.setdefault(f"{app}/{server}", [])
            for key, group in grouped.items():
                found[key] = check(told, group)
        return found

    def settle(self, told: Collection[str], brokers: Iterable[BrokerProcess] = (),
               ) -> tuple[dict[str, Verdict], dict[str, list[str]]]:
        """The end of a fault run: wait for ``told`` to be processed (on a timeout the verdicts
        say what is missing), stop the processes in order, then return the ``verdicts`` and
        what ``brokers`` (ActiveMQ) still store of ``told`` (``left_behind``)."""
        self.drain(told)
        self.stop()
        return self.verdicts(told), left_behind(brokers, self, told)

    def drain(self, told: Collection[str], timeout: float = WAIT) -> bool:
        """Wait until everything told-sent is processed (``drained``); False after ``timeout``
        (then ``verdicts`` say what is missing)."""
        try:
            self.wait(lambda f: f.drained(told), "every told-sent message processed", timeout)
        except AssertionError:
            return False
        return True

    def drained(self, told: Collection[str]) -> bool:
        """True when every app (every server of per-server apps) processed every told id, and
        every pipeline's second stage received what its first stage processed."""
        told_set = set(told)
        for app, distribution in self.distribution.items():
            if SEND_TO in self.env[app] and not self.processed(app) <= self.received(app):
                return False
            if distribution == PER_APP and not told_set <= self.processed(app):
                return False
            if distribution == PER_SERVER and not all(
                    told_set <= self.processed(app, server) for server in self.servers[app]):
                return False
        return True


@contextmanager
def fleet(settings: Settings, topic: str) -> Iterator[Fleet]:
    with ExitStack() as stack:
        yield Fleet(settings, topic, stack)


# -- what is left on the brokers -----------------------------------------------------------------

class _Browser(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.ended = threading.Event()

    def on_message(self, frame: Any) -> None:
        if frame.headers.get("browser") == "end":
            self.ended.set()
        else:
            self.ids.append(frame.headers.get(ID) or frame.body)


def browse(broker: BrokerProcess, queue_name: str, timeout: float = WAIT) -> list[str]:
    """The ``mdb_id`` of every message stored in ActiveMQ queue ``queue_name``, or the body
    of one without (a foreign producer's); a STOMP queue browser: the broker sends what the
    queue holds, then a ``browser:end`` frame."""
    connection = stomp.Connection([(broker.host, broker.port)])
    browser = _Browser()
    connection.set_listener("browser", browser)
    connection.connect(broker.username, broker.password, wait=True)
    try:
        connection.subscribe(f"/queue/{queue_name}", id="browse", ack="auto",
                             headers={"browser": "true"})
        assert browser.ended.wait(timeout), f"no browser:end from {queue_name}"
        return browser.ids
    finally:
        connection.disconnect()


def subscription_queues(fleet_: Fleet) -> list[str]:
    """The ActiveMQ queue of every subscription the fleet's apps used (virtual topics; names
    by the documented rule of docs/distribution.md)."""
    names = set()
    for app, distribution in fleet_.distribution.items():
        if distribution == PER_APP:
            names.add(f"{app}-{LISTENER}")
        else:
            names |= {f"{app}-{server}-{LISTENER}" for server in fleet_.servers[app]}
    return sorted(f"Consumer.{n}.VirtualTopic.{fleet_.topic}" for n in names)


def left_behind(brokers: Iterable[BrokerProcess], fleet_: Fleet, told: Collection[str],
                ) -> dict[str, list[str]]:
    """Told-sent messages still stored in a subscription queue (or ActiveMQ.DLQ) of an ActiveMQ
    broker, after the fleet stopped: ``{"<port> <queue>": [ids]}`` for each non-empty one."""
    told_set = set(told)
    found: dict[str, list[str]] = {}
    for broker in brokers:
        for name in [*subscription_queues(fleet_), "ActiveMQ.DLQ"]:
            stored = [i for i in browse(broker, name) if i in told_set]
            if stored:
                found[f"{broker.port} {name}"] = stored
    return found
