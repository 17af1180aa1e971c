"""A private Spark standalone cluster and S3-compatible object store for tests.

``SparkCluster`` runs PySpark's own deploy classes, as an operator would on real machines::

    spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P --webui-port W
    spark-class org.apache.spark.deploy.worker.Worker --cores 1 --memory 768m --work-dir D \\
        spark://127.0.0.1:P                     # twice, each with its own ports and work dir

and ``submit`` runs ``spark-submit --master spark://…`` (client deploy mode: standalone clusters
run a Python application's driver in the submitting process). ``S3Server`` is moto's server
mode: a real HTTP S3 API on a free port that s3fs (and so fsspec ``s3://`` URLs) talks to;
``S3Mount`` mounts one of its buckets as a folder with s3fs-fuse, for what Spark's JVM writes.

Every process gets its own session (process group), free ports and directories, and is stopped
by its PID (SIGTERM, then SIGKILL); anything still running when the interpreter exits is killed
(``atexit``). Readiness is polled against a deadline, never a fixed sleep: the master's JSON
status must list every worker ALIVE; the S3 server must answer HTTP.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

import pyspark

from tests.harness.servers.process import free_port

SPARK_HOME = Path(pyspark.__file__).parent
HOST = "127.0.0.1"
_S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mdb", "AWS_SECRET_ACCESS_KEY": "mdb-secret",
                   "AWS_DEFAULT_REGION": "us-east-1"}
_running: set[Daemon] = set()


class Daemon:
    """One long-running process in its own session, logging to ``log``, stopped by PID."""

    def __init__(self, command: list[str], env: Mapping[str, str], log: Path, cwd: Path) -> None:
        self.log = log
        with log.open("ab") as sink:
            self.process = subprocess.Popen(command, env=dict(env), cwd=cwd, stdout=sink,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        _running.add(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def pause(self) -> None:
        """SIGSTOP the process group: it holds whatever it was doing (its sockets stay open,
        so its peers do not notice) until resumed or killed."""
        os.killpg(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause`` (harmless when running)."""
        if self.alive():
            os.killpg(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the process group: a JVM, a Python driver and its children; a Worker and
        the executor JVMs it started. (PySpark's Python worker daemon makes a group of its
        own; it exits when its JVM is gone, which closes its stdin.)"""
        if self.alive():
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()
        _running.discard(self)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.alive():
            os.killpg(self.pid, signal.SIGTERM)
            self.resume()  # a paused group acts on the SIGTERM only once continued
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        self.kill()

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def _wait(condition: Callable[[], bool], what: str, daemons: list[Daemon],
          timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [d for d in daemons if not d.alive()]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {d.log}\n{d.tail()}" for d in daemons)
            raise RuntimeError(f"{what}: {'exited' if dead else 'timed out'}\n{logs}")
        time.sleep(0.2)


def http_get(url: str) -> bytes | None:
    """The body at ``url``, or None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            body: bytes = answer.read()
            return body
    except OSError:
        return None


class S3Server:
    """moto in server mode on a free port; ``env`` is what a client process needs (endpoint and
    credentials: botocore, hence s3fs, read ``AWS_ENDPOINT_URL``)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.port = free_port(HOST)
        self.endpoint = f"http://{HOST}:{self.port}"
        self.env = {**_S3_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}
        self._daemon: Daemon | None = None

    def start(self, timeout: float = 60.0) -> Self:
        moto = Path(sys.executable).with_name("moto_server")
        self._daemon = Daemon([str(moto), "-H", HOST, "-p", str(self.port)],
                              {**os.environ, **self.env}, self.base_dir / "moto.log",
                              self.base_dir)
        _wait(lambda: http_get(f"{self.endpoint}/moto-api/") is not None, "moto S3 server",
              [self._daemon], timeout)
        return self

    def filesystem(self) -> object:
        """An s3fs filesystem on this server (the listing cache off: tests look for news)."""
        import s3fs

        return s3fs.S3FileSystem(key=_S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                 secret=_S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                 endpoint_url=self.endpoint, use_listings_cache=False)

    def pause(self) -> None:
        """SIGSTOP the server: every request hangs (connections are still accepted)."""
        assert self._daemon is not None
        self._daemon.pause()

    def resume(self) -> None:
        assert self._daemon is not None
        self._daemon.resume()

    def stop(self) -> None:
        if self._daemon is not None:
            self._daemon.stop()


class S3Mount:
    """A bucket of ``server`` mounted as a folder by s3fs-fuse (Debian's ``s3fs``), as an
    operator mounts one on every node: how Spark's JVM writes its checkpoint and the output to
    the object store when the ``hadoop-aws`` jar (``s3a://``) is not at hand. Each file is one
    object; a rename is a server-side copy then a delete, so a file Spark renames into place
    appears whole or not at all, as with ``s3a://``. Needs root (or FUSE rights) and
    ``/dev/fuse``."""

    def __init__(self, server: S3Server, bucket: str, mountpoint: Path) -> None:
        self.server = server
        self.bucket = bucket
        self.mountpoint = mountpoint
        self._daemon: Daemon | None = None

    def start(self, timeout: float = 60.0) -> Self:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        base = self.server.base_dir
        passwd = base / f"{self.bucket}.passwd"
        passwd.write_text(f"{_S3_CREDENTIALS['AWS_ACCESS_KEY_ID']}:"
                          f"{_S3_CREDENTIALS['AWS_SECRET_ACCESS_KEY']}\n")
        passwd.chmod(0o600)  # s3fs refuses a credentials file others can read
        # -f: s3fs stays in the foreground, so it has a PID to stop, and unmounts on SIGTERM.
        self._daemon = Daemon(["s3fs", self.bucket, str(self.mountpoint), "-f",
                               "-o", f"url={self.server.endpoint}", "-o", "use_path_request_style",
                               "-o", f"passwd_file={passwd}"],
                              os.environ, base / f"s3fs-{self.bucket}.log", base)
        _wait(lambda: os.path.ismount(self.mountpoint), f"s3fs mount of bucket {self.bucket}",
              [self._daemon], timeout)
        return self

    def stop(self) -> None:
        if self._daemon is not None:
            self._daemon.stop()
        if os.path.ismount(self.mountpoint):  # s3fs killed, not stopped: its mount stays
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False)


class SparkCluster:
    """A standalone master and ``workers`` workers (1 core, ``worker_memory`` each)."""

    def __init__(self, base_dir: Path, *, workers: int = 2, worker_memory: str = "768m") -> None:
        self.base_dir = base_dir
        self.port = free_port(HOST)
        self.ui_port = free_port(HOST)
        self.master_url = f"spark://{HOST}:{self.port}"
        self._workers = workers
        self._worker_memory = worker_memory
        self.master: Daemon | None = None
        self.workers: list[Daemon] = []
        self._worker_ports: dict[int, int] = {}

    def env(self) -> dict[str, str]:
        """The environment of every process of the cluster. Not this one's ``PYTHONPATH``: the
        code a job imports comes from its ``--py-files`` (and the installed environment)."""
        inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return {**inherited, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": HOST,
                "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(self.base_dir / "logs"),
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}

    def _spark_class(self, name: str, *args: str) -> list[str]:
        return [str(SPARK_HOME / "bin" / "spark-class"), name, *args]

    def start(self, timeout: float = 120.0) -> Self:
        self.master = Daemon(self._spark_class(
            "org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(self.port),
            "--webui-port", str(self.ui_port)), self.env(), self.base_dir / "master.log",
            self.base_dir)
        self.workers = [self._worker(index) for index in range(self._workers)]
        self._wait_for_workers(timeout)
        return self

    def restart_dead_workers(self, timeout: float = 120.0) -> None:
        """Start again each worker that is not running (a test killed it), with its old work
        dir and a new port; return once the master lists the running ones, and only them,
        ALIVE."""
        self.workers = [worker if worker.alive() else self._worker(index)
                        for index, worker in enumerate(self.workers)]
        self._wait_for_workers(timeout)

    def _worker(self, index: int) -> Daemon:
        work = self.base_dir / f"worker{index}"
        work.mkdir(parents=True, exist_ok=True)
        port = free_port(HOST)
        self._worker_ports[index] = port
        return Daemon(self._spark_class(
            "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", str(port),
            "--webui-port", str(free_port(HOST)), "--cores", "1", "--memory",
            self._worker_memory, "--work-dir", str(work), self.master_url), self.env(),
            self.base_dir / f"worker{index}.log", work)

    def _wait_for_workers(self, timeout: float) -> None:
        assert self.master is not None
        _wait(lambda: self._alive_ports() == set(self._worker_ports.values()),
              f"a Spark master with {self._workers} ALIVE workers",
              [self.master, *self.workers], timeout)

    def _alive_ports(self) -> set[int]:
        """The ports of the workers the master lists ALIVE (a killed one stays listed, DEAD)."""
        status = http_get(f"http://{HOST}:{self.ui_port}/json/")
        try:
            workers = json.loads(status or b"{}").get("workers", [])
        except ValueError:  # a master still starting has answered with an empty page
            return set()
        return {int(w["port"]) for w in workers if w.get("state") == "ALIVE"}

    def submit(self, script: Path, args: list[str], *, py_files: Path, env: Mapping[str, str],
               log: Path, conf: Mapping[str, str] | None = None) -> Daemon:
        """``spark-submit --master spark://… --py-files PY_FILES SCRIPT ARGS`` with ``env`` in
        the driver and, through ``spark.executorEnv.*``, in every executor.

        ``PY_FILES`` is also the driver's ``PYTHONPATH``: the Python process the driver's JVM
        starts for a streaming data source (where the source's ``latestOffset`` and receiver
        run) does not get ``--py-files`` on its path, only the executors' workers do."""
        settings = {"spark.executor.memory": "512m", "spark.executor.cores": "1",
                    "spark.cores.max": str(self._workers), "spark.driver.memory": "512m",
                    "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                    "spark.pyspark.python": sys.executable,
                    **{f"spark.executorEnv.{k}": v for k, v in env.items()}, **(conf or {})}
        command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.master_url,
                   "--py-files", str(py_files)]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        return Daemon([*command, str(script), *args],
                      {**self.env(), **env, "PYTHONPATH": str(py_files)}, log, self.base_dir)

    def stop(self) -> None:
        for daemon in [*self.workers, *([self.master] if self.master else [])]:
            daemon.stop()
        self.workers = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def shipped_code(root: Path, zip_path: Path) -> Path:
    """Zip the packages a job imports from this checkout (``mdb``, the STOMP and Spark
    adapters) for ``--py-files``: the executors import exactly this version. Third-party
    dependencies (anyio, stomp.py, pydantic, pyarrow, s3fs: some compiled) cannot travel in a
    zip; they come from the Python environment on every node (``spark.pyspark.python``)."""
    packages = [root / "mdb", root / "adapters" / "brokers" / "mdb_stomp",
                root / "adapters" / "integrations" / "mdb_spark"]
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in packages:
            for path in sorted(package.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, path.relative_to(package.parent))
    return zip_path


@atexit.register
def _kill_leftovers() -> None:
    # A test run that dies half-way must not leave JVMs or servers behind.
    for daemon in list(_running):
        daemon.kill()
