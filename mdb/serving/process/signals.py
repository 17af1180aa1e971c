"""SIGINT and SIGTERM in every process ``mdb run`` makes (the container, the supervisor of
``--workers N``, the watcher of ``--reload``): the first stops in order, a second while that
stop is under way kills at once, and so does any after it ended, while the process ends
(docs/concepts.md, "Exit status")."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Awaitable, Callable

import anyio

from mdb.observability import logs


async def stop_then_kill(stop: Callable[[signal.Signals], None], stopping: Callable[[], bool],
                         killing: str, kill: Callable[[], Awaitable[None]] | None = None,
                         ) -> None:
    """Until cancelled: on SIGINT or SIGTERM call ``stop`` with it, unless ``stopping()`` says
    a stop is under way already: then say ``killing``, await ``kill`` (the children to kill, if
    any) and exit at once with 128 + the signal's number. Once cancelled (the process's work
    is done: it is ending), either signal exits at once with 128 + its number, whenever it
    comes until the process ends."""
    try:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if stopping():
                    logs.tell(killing, logging.ERROR)
                    if kill is not None:
                        await kill()
                    os._exit(128 + signum)
                stop(signal.Signals(signum))
    finally:
        # The receiver gone, a signal is Python's again: SIGINT a KeyboardInterrupt raised
        # wherever the process is ending (the event loop's close, its threads' end, an atexit
        # function), with its traceback. What is left to do is no stop's to finish.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _exit_at_once)


def _exit_at_once(signum: int, _: object) -> None:
    os._exit(128 + signum)
