"""A private ActiveMQ Classic broker for tests: its own port, data directory and JVM process.

It runs the Debian package's jar directly (no init script, no service), with the reference
configuration shipped in ``mdb_stomp/activemq.xml`` copied into a per-instance ``conf``
directory::

    broker = ActiveMQ().start()          # blocks until the STOMP port answers a CONNECT
    broker.url                           # 'stomp+activemq://mdb:PASSWORD@127.0.0.1:PORT'
    broker.kill(); broker.restart()      # same data directory and port: messages survive
    broker.pause(); broker.resume()      # SIGSTOP / SIGCONT: a hung broker
    broker.close()                       # stop and delete the temporary directory

The broker requires a login (the reference configuration's ``mdb.user``/``mdb.password``,
written to ``conf/credentials.properties``): ``url`` carries it. ``ActiveMQ(tls=Certificates)``
adds a ``stomp+ssl`` connector that wants a client certificate (``tls_url``);
``ActiveMQ(outsiders={user: password})`` adds users who may connect and nothing else;
``ActiveMQ(confined={user: (password, pattern)})`` users who may read, write and create only
the queues matching an ActiveMQ wildcard (``confined.*``: one segment, so not
``confined.x.DLQ``).

Signals go to the broker's PID only. The lifecycle is
``tests.harness.servers.process.BrokerProcess``'s. Readiness is polled with a STOMP CONNECT against
a deadline, never a fixed sleep. The broker writes its log to ``<base>/data/activemq.log`` and its
console to ``<base>/console.log``; ``log_tail()`` shows both when a start fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from tests.harness.servers.certificates import STORE_PASSWORD, Certificates
from tests.harness.servers.process import BrokerProcess, free_port

__all__ = ["ACTIVEMQ_HOME", "ACTIVEMQ_JAR", "ActiveMQ", "activemq_available", "free_port",
           "reference_config"]

ACTIVEMQ_HOME = Path(os.environ.get("MDB_ACTIVEMQ_HOME", "/usr/share/activemq"))
ACTIVEMQ_JAR = ACTIVEMQ_HOME / "bin" / "activemq.jar"

# ActiveMQ 5.17 from Debian logs through log4j 1.2 (slf4j-log4j12), which reads this from the
# classpath, i.e. the instance's conf directory. Without it the broker logs nothing.
_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, logfile
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
log4j.logger.org.apache.activemq.spring=WARN
log4j.appender.logfile=org.apache.log4j.FileAppender
log4j.appender.logfile.file=${activemq.data}/activemq.log
log4j.appender.logfile.append=true
log4j.appender.logfile.layout=org.apache.log4j.PatternLayout
log4j.appender.logfile.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
"""

def activemq_available() -> bool:
    """True when the ActiveMQ jar and a ``java`` executable exist on this machine."""
    return ACTIVEMQ_JAR.is_file() and shutil.which("java") is not None


def reference_config(name: str = "activemq.xml") -> Path:
    """A reference broker configuration shipped with the ``mdb_stomp`` adapter (``name``:
    ``activemq.xml``, or ``activemq-shared-store.xml`` for a master/slave pair): the source
    tree's copy when running from a checkout, else the installed package's."""
    in_tree = Path(__file__).resolve().parents[3] / "adapters" / "brokers" / "mdb_stomp" / name
    if in_tree.is_file():
        return in_tree
    return Path(str(resources.files("mdb_stomp") / name))


class ActiveMQ(BrokerProcess):
    """One private broker process (a JVM; signals go to its PID only). Not thread-safe; meant
    for test fixtures.

    ``base_dir`` (default: a new temporary directory, deleted by ``close``) holds ``conf/`` and
    ``data/``; ``port`` defaults to a free one and stays the same across ``restart``; ``host``
    (default ``127.0.0.1``) is the address its STOMP connector binds. ``nagle``: its STOMP
    connector without ``transport.tcpNoDelay=true``, as in Debian's stock config and managed
    brokers (docs/activemq.md).
    """

    name = "ActiveMQ"
    scheme = "stomp+activemq"
    vhost = "127.0.0.1"

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        config: Path | str | None = None,
        heap_mb: int = 256,
        startup_timeout: float = 60.0,
        jvm_args: tuple[str, ...] = (),
        tls: Certificates | None = None,
        outsiders: dict[str, str] | None = None,
        host: str | None = None,
        confined: dict[str, tuple[str, str]] | None = None,
        nagle: bool = False,
    ) -> None:
        super().__init__(
            base_dir, port=port, startup_timeout=startup_timeout, dir_prefix="mdb-activemq-",
            host=host,
        )
        self.conf_dir = self.base_dir / "conf"
        self.data_dir = self.base_dir / "data"
        self.log_path = self.data_dir / "activemq.log"
        self._config = Path(config) if config is not None else reference_config()
        self._heap_mb = heap_mb
        self._jvm_args = jvm_args
        self.tls = tls
        self.outsiders = dict(outsiders or {})
        self.confined = dict(confined or {})
        self.nagle = nagle
        self.tls_port = free_port(self.host) if tls is not None else None

    @property
    def tls_url(self) -> str:
        """``url`` for the ``stomp+ssl`` connector (mutual TLS), when started with ``tls``."""
        if self.tls_port is None:
            raise RuntimeError("this broker has no TLS connector (ActiveMQ(tls=...))")
        return f"{self.scheme}://{self.username}:{self.password}@{self.host}:{self.tls_port}"

    def wait_ready(self, timeout: float) -> None:
        """The STOMP port answers, and then the TLS connector listens too: ActiveMQ starts its
        connectors one after another, and a first TLS connect raced the last of them in CI."""
        deadline = time.monotonic() + timeout
        super().wait_ready(timeout)
        while self.tls_port is not None and not _listens(self.host, self.tls_port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: nothing listens on the TLS port "
                                   f"{self.tls_port}:\n{self.log_tail()}")
            time.sleep(self.poll_interval)

    def _prepare(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self._config.read_text()
        if self.nagle:
            config = _replace_once(config, "&amp;transport.tcpNoDelay=true", "")
        if self.tls is not None:
            config = self._with_tls(config, self.tls)
        config = _replace_once(config, "</users>", "".join(
            f'<authenticationUser username="{user}" password="{password}" groups="outsiders"/>'
            for user, password in self.outsiders.items()) + "".join(
            f'<authenticationUser username="{user}" password="{password}" groups="{user}"/>'
            for user, (password, _) in self.confined.items()) + "</users>")
        # Entries add rights (ActiveMQ unites those of every entry that matches): a confined
        # user's group is named only here, on its queues and the advisory topics.
        config = _replace_once(config, "</authorizationEntries>", "".join(
            f'<authorizationEntry queue="{pattern}" read="{user}" write="{user}" admin="{user}"/>'
            f'<authorizationEntry topic="ActiveMQ.Advisory.>" read="{user}" write="{user}" '
            f'admin="{user}"/>'
            for user, (_, pattern) in self.confined.items()) + "</authorizationEntries>")
        (self.conf_dir / "activemq.xml").write_text(config)
        (self.conf_dir / "log4j.properties").write_text(_LOG4J_PROPERTIES)
        # The reference config reads the user from here (kept out of the process list).
        (self.conf_dir / "credentials.properties").write_text(
            f"mdb.user={self.username}\nmdb.password={self.password}\n")

    def _with_tls(self, config: str, tls: Certificates) -> str:
        """``config`` plus a ``stomp+ssl`` connector on ``tls_port`` that requires a client
        certificate signed by the test CA (the snippet of docs/security.md)."""
        keystore, truststore = tls.java_stores()
        context = (
            f'<sslContext><sslContext keyStore="file:{keystore}" '
            f'keyStorePassword="{STORE_PASSWORD}" keyStoreType="pkcs12" '
            f'trustStore="file:{truststore}" trustStorePassword="{STORE_PASSWORD}" '
            f'trustStoreType="pkcs12"/></sslContext>\n        <transportConnectors>'
        )
        connector = (
            f'<transportConnector name="stomp+ssl" uri="stomp+ssl://{self.host}:{self.tls_port}'
            '?needClientAuth=true&amp;transport.tcpNoDelay=true"/>\n        </transportConnectors>'
        )
        config = _replace_once(config, "<transportConnectors>", context)
        return _replace_once(config, "</transportConnectors>", connector)

    def _command(self) -> tuple[list[str], dict[str, str] | None]:
        return [
            shutil.which("java") or "java",
            f"-Xmx{self._heap_mb}m",
            f"-Dactivemq.home={ACTIVEMQ_HOME}",
            f"-Dactivemq.base={self.base_dir}",
            f"-Dactivemq.conf={self.conf_dir}",
            f"-Dactivemq.data={self.data_dir}",
            f"-Dactivemq.classpath={self.conf_dir}",
            f"-Dmdb.stomp.host={self.host}",
            f"-Dmdb.stomp.port={self.port}",
            *self._jvm_args,
            "-jar",
            str(ACTIVEMQ_JAR),
            "start",
            f"xbean:file:{self.conf_dir / 'activemq.xml'}",
        ], None

    def _log_paths(self) -> Iterable[Path]:
        return (self.console_path, self.log_path)


def _replace_once(config: str, old: str, new: str) -> str:
    if config.count(old) != 1:
        raise RuntimeError(f"the ActiveMQ config has not exactly one {old}")
    return config.replace(old, new)


def _listens(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True
