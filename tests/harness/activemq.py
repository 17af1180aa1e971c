"""A private ActiveMQ Classic broker for tests: its own port, data directory and JVM process.

It runs the Debian package's jar directly (no init script, no service), with the reference
configuration shipped in ``mdb_stomp/activemq.xml`` copied into a per-instance ``conf``
directory::

    broker = ActiveMQ().start()          # blocks until the STOMP port answers a CONNECT
    broker.url                           # 'stomp+activemq://127.0.0.1:PORT'
    broker.kill(); broker.restart()      # same data directory and port: messages survive
    broker.pause(); broker.resume()      # SIGSTOP / SIGCONT: a hung broker
    broker.close()                       # stop and delete the temporary directory

Signals go to the broker's PID only. The lifecycle is ``tests.harness.process.BrokerProcess``'s.
Readiness is polled with a STOMP CONNECT against a
deadline, never a fixed sleep. The broker writes its log to ``<base>/data/activemq.log`` and its
console to ``<base>/console.log``; ``log_tail()`` shows both when a start fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from tests.harness.process import BrokerProcess, free_port
from tests.harness.process import stomp_answers as _stomp_answers

__all__ = ["ACTIVEMQ_HOME", "ACTIVEMQ_JAR", "ActiveMQ", "activemq_available", "free_port",
           "reference_config", "stomp_answers"]

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

_STOMP_CONNECT = b"CONNECT\naccept-version:1.2\nhost:127.0.0.1\n\n\x00"


def activemq_available() -> bool:
    """True when the ActiveMQ jar and a ``java`` executable exist on this machine."""
    return ACTIVEMQ_JAR.is_file() and shutil.which("java") is not None


def reference_config() -> Path:
    """The reference broker configuration shipped with the ``mdb_stomp`` adapter: the source
    tree's copy when running from a checkout, else the installed package's."""
    in_tree = Path(__file__).resolve().parents[2] / "adapters" / "mdb_stomp" / "activemq.xml"
    if in_tree.is_file():
        return in_tree
    return Path(str(resources.files("mdb_stomp") / "activemq.xml"))


def stomp_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if ``host:port`` answers a STOMP CONNECT with CONNECTED within ``timeout``."""
    return _stomp_answers(host, port, _STOMP_CONNECT, timeout)


class ActiveMQ(BrokerProcess):
    """One private broker process (a JVM; signals go to its PID only). Not thread-safe; meant
    for test fixtures.

    ``base_dir`` (default: a new temporary directory, deleted by ``close``) holds ``conf/`` and
    ``data/``; ``port`` defaults to a free one and stays the same across ``restart``.
    """

    name = "ActiveMQ"
    scheme = "stomp+activemq"
    stomp_connect = _STOMP_CONNECT

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        config: Path | str | None = None,
        heap_mb: int = 256,
        startup_timeout: float = 60.0,
        jvm_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            base_dir, port=port, startup_timeout=startup_timeout, dir_prefix="mdb-activemq-"
        )
        self.conf_dir = self.base_dir / "conf"
        self.data_dir = self.base_dir / "data"
        self.log_path = self.data_dir / "activemq.log"
        self._config = Path(config) if config is not None else reference_config()
        self._heap_mb = heap_mb
        self._jvm_args = jvm_args

    def _prepare(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._config, self.conf_dir / "activemq.xml")
        (self.conf_dir / "log4j.properties").write_text(_LOG4J_PROPERTIES)

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
