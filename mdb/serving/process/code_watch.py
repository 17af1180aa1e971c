"""``mdb run --reload``: for development, the container restarted whenever a ``.py`` file under
its listener modules' directories changes, as ``faststream run --reload`` and ``uvicorn
--reload`` do. (Not ``mdb.serving.process.topology_watch``, which applies a changed topology to a
running container.)

This process only watches: the container runs as a child, ``mdb run`` without ``--reload``, in
a session of its own, holding a lifeline to this process (``mdb.serving.process.lifeline``): a
watcher that ends without stopping it (SIGKILL, SIGHUP, a crash) leaves no container running on. On
a change the child is stopped in order (SIGTERM: in-flight handlers finish within
``shutdown_grace_period``, then it is killed) and started again, importing the code anew. A
child that ends by itself (a module that no longer imports: exit status 2) is started again at
the next change. SIGINT or SIGTERM stops the child in order and then this process, with the
child's exit status; a second one kills the child.

The watching is ``watchfiles`` (the ``reload`` extra): the operating system's notifications
through a small Rust core, the watcher FastStream and uvicorn use.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
from anyio.abc import ObjectReceiveStream, Process
from anyio.streams.memory import MemoryObjectSendStream

from mdb.errors import ConfigurationError
from mdb.observability import logs
from mdb.observability.redaction import printable
from mdb.serving.process.children import stop_in_order
from mdb.serving.process.signals import stop_then_kill

SHOWN_CHANGES = 5  # changed files a restart's line names; the others it counts


def directories(modules: Sequence[str]) -> list[Path]:
    """The directories of the listener modules, found without running them (their packages'
    ``__init__`` do run), from the current directory too, as ``mdb run`` imports them."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    found = []
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None:
            raise ConfigurationError(f"mdb run --reload: cannot find listener module {name!r} "
                                     f"from {Path.cwd()}")
        found.append(Path(spec.origin).resolve().parent)
    return sorted(set(found))


async def run_reloading(command: Callable[[int], Sequence[str]], watched: Sequence[Path],
                        grace: float) -> int:
    """Run ``command(fd)`` (the container, holding the lifeline ``fd``), again after each change
    of a ``.py`` file under ``watched``, until a signal; return its last exit status."""
    try:
        from watchfiles import PythonFilter, awatch
    except ImportError:
        raise ConfigurationError("mdb run --reload needs watchfiles: pip install "
                                 "'mdb[reload]'") from None
    # watchfiles logs each batch of changes at INFO; the restart line says which files.
    logs.quiet_library("watchfiles.main")
    reloader = _Reloader(grace)
    sending, changes = anyio.create_memory_object_stream[list[str]](1)

    async def watch() -> None:
        async with sending:
            async for batch in awatch(*watched, watch_filter=PythonFilter(),
                                      stop_event=reloader.stop):
                _offer(sending, sorted(path for _, path in batch))

    print(f"mdb: --reload: watching {printable(', '.join(map(str, watched)))}", flush=True)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watch)
        tasks.start_soon(reloader.stop_on_signals)
        while not reloader.stop.is_set():
            await reloader.start(command)
            why = await reloader.first(changes)
            if why == "ended":
                logs.tell(f"mdb: --reload: the container exited with status "
                          f"{reloader.code}; it starts again when a file changes")
                reloader.process = None
                why = await reloader.first(changes)
            else:
                await reloader.stop_container()
            if why != "stop":
                print(f"mdb: --reload: {why} changed; starting the container again",
                      flush=True)
        tasks.cancel_scope.cancel()
    return reloader.code


def _offer(stream: MemoryObjectSendStream[list[str]], paths: list[str]) -> None:
    """Pass a batch of changes on, or drop it when one is already waiting (one restart covers
    both)."""
    with contextlib.suppress(anyio.WouldBlock):
        stream.send_nowait(paths)


def _changed(paths: Sequence[str]) -> str:
    """The changed files, for one line: the names of the first ``SHOWN_CHANGES``, their
    control characters escaped (a file name may hold a line feed, and forge a line), and how
    many more."""
    names = ", ".join(printable(Path(p).name) for p in paths[:SHOWN_CHANGES])
    more = len(paths) - SHOWN_CHANGES
    return f"{names} and {more} more" if more > 0 else names


class _Reloader:
    """The running container (``process``), its last exit status, and the stop."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.stop = anyio.Event()
        self.process: Process | None = None
        self.code = 0
        self._lifeline: socket.socket | None = None

    async def start(self, command: Callable[[int], Sequence[str]]) -> None:
        """Start the container with its end of a new lifeline; this process keeps the other
        end open, never writing to it, until the next start or its own end."""
        ours, theirs = socket.socketpair()
        try:
            with theirs:
                process = await anyio.open_process(
                    list(command(theirs.fileno())), stdin=None, stdout=None, stderr=None,
                    pass_fds=[theirs.fileno()], start_new_session=True)
        except BaseException:
            ours.close()
            raise
        if self._lifeline is not None:
            self._lifeline.close()
        self.process, self._lifeline = process, ours

    async def first(self, changes: ObjectReceiveStream[list[str]]) -> str:
        """What comes first: ``"ended"`` (the container), ``"stop"`` (a signal) or the
        changed files, named."""
        outcome: list[str] = []
        async with anyio.create_task_group() as race:
            async def on_end(process: Process) -> None:
                self.code = await process.wait()
                outcome.append("ended")
                race.cancel_scope.cancel()

            async def on_stop() -> None:
                await self.stop.wait()
                outcome.append("stop")
                race.cancel_scope.cancel()

            async def on_change() -> None:
                paths = await changes.receive()
                outcome.append(_changed(paths))
                race.cancel_scope.cancel()

            if self.process is not None:
                race.start_soon(on_end, self.process)
            race.start_soon(on_stop)
            race.start_soon(on_change)
        return outcome[0]

    async def stop_container(self) -> None:
        """Stop the container in order; kill it past its grace period and a margin."""
        if self.process is not None:
            self.code = await stop_in_order(self.process, self.grace)

    async def stop_on_signals(self) -> None:
        def stop(signum: signal.Signals) -> None:
            logs.tell(f"mdb: --reload: {signum.name}: stopping the container (signal again to "
                      "kill it)")
            self.stop.set()

        async def kill() -> None:
            if self.process is not None and self.process.returncode is None:
                self.process.kill()

        await stop_then_kill(stop, self.stop.is_set,
                             "mdb: --reload: second signal, killing the container", kill)
