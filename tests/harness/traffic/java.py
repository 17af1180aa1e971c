"""ActiveMQ's own Java JMS client as a test peer, and brokers that Java clients can reach.

``JmsTool`` (``tests/interop/java/JmsTool.java``) is compiled once per test session with ``javac``
against the JMS client jars of Debian's ``activemq`` package, and run with ``java``: each call
sends or receives over OpenWire and returns what Java saw, one dict per message (its JMS type as
``kind``, ``text`` or base64 ``bytes``, the JMS headers, ``properties`` as text and
``propertyTypes``, each property's Java class, ``Integer`` or ``String``...)::

    tool = JmsTool("tcp://127.0.0.1:PORT", broker.username, broker.password)
    tool.send("orders", "text", "hello", JMSPriority=8)
    [seen] = tool.receive("orders.DLQ", 1)

``openwire_config`` writes the reference config plus an OpenWire connector, for an ActiveMQ that
Java clients reach (the reference config has none: mdb speaks STOMP).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

from tests.harness.servers.activemq import ACTIVEMQ_HOME, reference_config

JMS_JARS = tuple(ACTIVEMQ_HOME / "lib" / jar for jar in (
    "activemq-client.jar", "geronimo-jms_1.1_spec.jar", "geronimo-j2ee-management-1.1-spec.jar",
    "hawtbuf.jar", "slf4j-api.jar"))
SOURCE = Path(__file__).resolve().parents[2] / "interop" / "java" / "JmsTool.java"
TIMEOUT = 60.0  # seconds one Java call may take, JVM start included


def java_available() -> bool:
    """True when ``javac``, ``java`` and ActiveMQ's JMS client jars are on this machine."""
    return (shutil.which("javac") is not None and shutil.which("java") is not None
            and all(jar.is_file() for jar in JMS_JARS))


@functools.cache
def _compiled() -> Path:
    classes = Path(tempfile.mkdtemp(prefix="mdb-jms-tool-"))
    subprocess.run(["javac", "-d", str(classes), "-cp", _classpath(), str(SOURCE)],
                   check=True, capture_output=True, timeout=TIMEOUT)
    return classes


def _classpath(*more: Path) -> str:
    return ":".join(str(p) for p in (*more, *JMS_JARS))


class JmsTool:
    """The Java peer on one broker (``url``: an OpenWire URL such as ``tcp://127.0.0.1:PORT``)."""

    def __init__(self, url: str, user: str = "", password: str = "") -> None:
        self.url = url
        self.user = user
        self.password = password

    def send(self, queue: str, kind: str, body: str, **options: object) -> dict[str, Any]:
        """Send one message of JMS ``kind`` (text, bytes: base64 ``body``, map, object, stream,
        plain); ``options`` are JMS header fields (``JMSPriority``, ``JMSTimeToLive`` in ms,
        ``JMSDeliveryMode``, ``JMSCorrelationID``, ``JMSType``, ``JMSReplyTo``) or properties:
        strings, or of the type a name ends in (``**{"qty:int": 3}``; ``:long``, ``:boolean``,
        ``:double`` too). Returns the message as Java sent it."""
        [sent] = self._run("send", queue, kind, body,
                           *(f"{key}={value}" for key, value in options.items()))
        return sent

    async def send_from_thread(self, queue: str, kind: str, body: str,
                               **options: object) -> dict[str, Any]:
        """``send`` in a worker thread, for a caller whose event loop runs a container: blocked
        for the JVM's start, the loop would read its broker's heart-beats too late, and mdb
        drops a connection it heard nothing on for longer than they allow (docs/failover.md)."""
        return await anyio.to_thread.run_sync(
            functools.partial(self.send, queue, kind, body, **options))

    def receive(self, queue: str, count: int, timeout: float = 30.0,
                selector: str | None = None) -> list[dict[str, Any]]:
        """Take up to ``count`` messages from ``queue`` (only those matching the JMS
        ``selector``, when given), waiting at most ``timeout`` seconds for each; fewer when one
        did not come."""
        seen = self._run("receive", queue, str(count), str(int(timeout * 1000)),
                         *([selector] if selector is not None else []))
        return [m for m in seen if not m.get("timeout")]

    def request(self, queue: str, text: str, timeout: float = 30.0,
                **options: object) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Send a TextMessage whose JMSReplyTo is a TemporaryQueue (``options`` as for
        ``send``) and wait at most ``timeout`` seconds for the reply; return the request as
        Java sent it and the reply (None when none came)."""
        sent, reply = self._run("request", queue, text, str(int(timeout * 1000)),
                                *(f"{key}={value}" for key, value in options.items()))
        return sent, None if reply.get("timeout") else reply

    def reply_server(self, queue: str, count: int, timeout: float = 30.0,
                     kind: str = "text") -> list[dict[str, Any]]:
        """Answer ``count`` requests from ``queue`` as a JMS replier (a message of JMS ``kind``,
        as for ``send`` but not bytes, holding "reply to <text>", to the JMSReplyTo, with the
        request's JMSCorrelationID, else its JMSMessageID), waiting at most ``timeout``
        seconds for each; return the requests answered."""
        seen = self._run("reply-server", queue, str(count), str(int(timeout * 1000)), kind)
        return [m for m in seen if not m.get("timeout")]

    @contextlib.contextmanager
    def consumer(self, queue: str, rollback_text: str = "") -> Iterator[JavaConsumer]:
        """A Java consumer of ``queue`` while the block runs (``JavaConsumer``), stopped and
        waited for at its end. It rolls back the first delivery of a TextMessage whose text
        is ``rollback_text``, and commits every other."""
        process = subprocess.Popen(self._command("consume", queue, rollback_text),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        consumer = JavaConsumer(process)
        try:
            yield consumer
        finally:
            consumer.stop()
            if process.wait(timeout=TIMEOUT) != 0:
                raise RuntimeError(f"JmsTool consume failed ({process.returncode})")

    def _run(self, command: str, *args: str) -> list[dict[str, Any]]:
        done = subprocess.run(self._command(command, *args),
                              capture_output=True, text=True, timeout=TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"JmsTool {command} failed ({done.returncode}):\n{done.stderr}")
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def _command(self, command: str, *args: str) -> list[str]:
        return ["java", "-cp", _classpath(_compiled()), "JmsTool", command, self.url, self.user,
                self.password, *args]


class JavaConsumer:
    """A running ``JmsTool consume``: a consumer in a transacted session (prefetch 1), given a
    message it rolled back again at once (ActiveMQ's client redelivers it, JMSRedelivered)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = process.stdout

    def messages(self) -> Iterator[dict[str, Any]]:
        """What it did, one message after each commit or rollback, as ``JmsTool.receive``
        describes them plus ``outcome`` ("committed" or "rolled back"); blocks for the next
        one, and ends once the consumer has stopped."""
        return (json.loads(line) for line in self._stdout if line.startswith("{"))

    def stop(self) -> None:
        """Close its standard input: it finishes the message at hand, then exits."""
        if not self._stdin.closed:
            self._stdin.close()


def openwire_config(directory: Path, port: int) -> Path:
    """Write into ``directory`` the reference config plus an OpenWire connector on ``port``
    (127.0.0.1), and return its path, for ``ActiveMQ(config=...)``."""
    connector = f'<transportConnector name="openwire" uri="tcp://127.0.0.1:{port}"/>\n'
    config = directory / "activemq-openwire.xml"
    config.write_text(reference_config().read_text().replace(
        "</transportConnectors>", connector + "        </transportConnectors>", 1))
    return config
