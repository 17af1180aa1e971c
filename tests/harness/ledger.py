"""The ledger of the fault tests: who processed what, checked against what the producer was told;
and the container processes of one or more apps on one topic that keep it (``Fleet``).

The contract after a fault (docs/architecture.md, "Delivery contract", rules 4 and 6):

* every message whose ``Producer.send`` returned (``told``) is processed — once per app in
  ``one-copy-per-app``, by every server in ``one-copy-per-server``;
* a message may be processed again by the same app (or server) only when it was in doubt, and
  then the repeat is flagged: only the first of its deliveries there may have ``redelivered``
  False (one processed unflagged after a flagged one is a stale delivery processed as fresh);
* nothing told-sent is left behind on a broker once the processes stopped.

An app may be a two-stage pipeline (``SEND_TO``, see ``tests.harness.topic_ledger_app``): its
first stage sends each message it processes on to a queue, its second stage records what it
receives. Then, by rule 6 of the contract, every message the first stage processed reaches
the second stage, and every delivery there after the first of its message is flagged: a
delivery of a send made again (a repeat at the first stage) by ``mdb_maybe_repeat``, under the
same ``mdb_id``; a delivery the broker gave again, by ``redelivered`` (``check_sent_on``).

A message whose send raised is not told-sent: it may or may not arrive (``SendOutcomeUnknown``),
so it is neither required nor an error when it is processed (counted as ``unconfirmed``).

``check`` is the pure checker. ``Fleet`` runs container processes of
``tests.harness.topic_ledger_app`` and gathers their ledgers; ``LoadProducer`` sends
continuously from a thread and remembers what it was told; ``left_behind`` browses ActiveMQ
queues for messages still stored.
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
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import stomp

from mdb import Producer, Settings, codec
from mdb.broker_settings import BrokerSettings
from mdb.destinations import Destination
from mdb.errors import MdbError
from mdb.message import ID
from mdb.settings import DestinationSettings, MemberSettings
from tests.harness.container_process import ROOT, ContainerProcess
from tests.harness.process import BrokerProcess

PER_APP, PER_SERVER = "one-copy-per-app", "one-copy-per-server"
WAIT = 60.0  # seconds to wait for something that should happen after a fault
LISTENER = "on_entry"  # the ledger app's listener
SEND_TO = "LEDGER_SEND_TO"  # makes the ledger app a two-stage pipeline through this queue

Entry = Mapping[str, Any]


# -- the checker ---------------------------------------------------------------------------------

@dataclass
class Verdict:
    """One app's (``one-copy-per-app``) or one server's (``one-copy-per-server``) account."""

    told: int  # messages the producer was told were sent
    processed: int  # of those, how many were processed at least once
    deliveries: int  # ``done`` entries, repeats included
    lost: list[str] = field(default_factory=list)  # told-sent, never processed
    flagged: int = 0  # repeats flagged redelivered (or mdb_maybe_repeat)
    unflagged: list[str] = field(default_factory=list)  # ids with a repeat not flagged
    unconfirmed: int = 0  # processed ids the producer was not told were sent
    #: Second stage only: first-stage ids whose sends on arrived under more than one mdb_id.
    renamed: list[str] = field(default_factory=list)

    @property
    def repeats(self) -> int:
        return self.deliveries - self.processed - self.unconfirmed

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unflagged and not self.renamed

    def __str__(self) -> str:
        return (f"told {self.told}, processed {self.processed}, deliveries {self.deliveries}, "
                f"repeats flagged {self.flagged} / unflagged {len(self.unflagged)}, "
                f"lost {len(self.lost)}, unconfirmed processed {self.unconfirmed}"
                + (f"; lost {sorted(self.lost)[:5]}" if self.lost else "")
                + (f"; unflagged {sorted(self.unflagged)[:5]}" if self.unflagged else "")
                + (f"; renamed {sorted(self.renamed)[:5]}" if self.renamed else ""))


def check(told: Collection[str], entries: Iterable[Entry]) -> Verdict:
    """Check the ``done`` entries of one app or one server against the told-sent ids.

    Ledger lines of several processes reach the test through separate pipes, so their order is
    not trusted; the deliveries of one id are put in the order their handlers began
    (``started``, one clock for every process) and each after the first is a repeat, which
    must be flagged. Without ``started`` a repeat counts as flagged unless the id was
    delivered unflagged more than once.

    A delivery marked ``maybe_repeat`` (a second stage's: the send was made again) is a
    flagged repeat whenever it comes; the order applies to the others, the deliveries of the
    first send: only the first of those may be unflagged.
    """
    told_set = set(told)
    by_id: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        if entry.get("event", "done") == "done":
            by_id[entry["id"]].append(entry)
    verdict = Verdict(told=len(told_set), processed=len(told_set & by_id.keys()),
                      deliveries=sum(len(e) for e in by_id.values()))
    verdict.lost = sorted(told_set - by_id.keys())
    verdict.unconfirmed = len(by_id.keys() - told_set)
    for message_id, deliveries in by_id.items():
        first_send = [e for e in deliveries if not e.get("maybe_repeat")]
        if all("started" in e for e in first_send):
            repeats = sorted(first_send, key=lambda e: e["started"])[1:]
            unflagged = sum(1 for e in repeats if not e["redelivered"])
        else:
            unflagged = max(0, sum(1 for e in first_send if not e["redelivered"]) - 1)
        if unflagged:
            verdict.unflagged.append(message_id)
        verdict.flagged += len(deliveries) - 1 - unflagged
    return verdict


def check_sent_on(first: Iterable[Entry], second: Iterable[Entry]) -> Verdict:
    """Check a pipeline's second stage (the ``done`` entries of its queue listener, each with
    the ``source`` it received) against its first (the ``done`` entries of its topic
    listener): each message the first stage processed counts as told-sent to the second, and
    ``check`` judges the second stage's deliveries per ``source``; every delivery of one
    source must carry one ``mdb_id`` (``renamed`` lists the sources that came under more)."""
    processed = {e["id"] for e in first if e.get("event", "done") == "done"}
    received = [e for e in second if e.get("event", "done") == "done"]
    verdict = check(processed, [{**e, "id": e["source"]} for e in received])
    ids: dict[str, set[str]] = defaultdict(set)
    for entry in received:
        ids[entry["source"]].add(entry["id"])
    verdict.renamed = sorted(source for source, found in ids.items() if len(found) > 1)
    return verdict


def views(entries: Iterable[Entry], distribution: str) -> dict[str, list[Entry]]:
    """The entries per app (``one-copy-per-app``) or per app/server (``one-copy-per-server``)."""
    grouped: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        key = entry["app"] if distribution == PER_APP else f"{entry['app']}/{entry['server']}"
        grouped[key].append(entry)
    return grouped


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
LEDGER_APP = "tests.harness.topic_ledger_app"
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
    ``tests.harness.netns`` runs it in a network namespace).
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
                       "MDB_APP": app, "MDB_SERVER": server, "MDB_LOG_LEVEL": "WARNING", **env}
        self.server, self.lines = server, lines
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "mdb.cli", "run", LEDGER_APP, "--config",
             str(config), *args],
            cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        threading.Thread(target=self._read, daemon=True).start()

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
    """Container processes of ``tests.harness.topic_ledger_app`` on ``topic:<topic>``, one ledger.

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
        """SIGKILL one process: a crash with work in flight."""
        process.process.send_signal(signal.SIGKILL)
        process.process.wait(timeout=WAIT)

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


# -- the producer --------------------------------------------------------------------------------

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
