"""SIGINT and SIGTERM in every process ``mdb run`` makes (the container, the supervisor of
``--workers N``, the watcher of ``--reload``): the first stops in order, a second while that
stop is under way kills at once (docs/concepts.md, "Exit status")."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Awaitable, Callable

import anyio

from mdb import logs


async def stop_then_kill(stop: Callable[[signal.Signals], None], stopping: Callable[[], bool],
                         killing: str, kill: Callable[[], Awaitable[None]] | None = None,
                         ) -> None:
    """For ever: on SIGINT or SIGTERM call ``stop`` with it, unless ``stopping()`` says a stop
    is under way already: then say ``killing``, await ``kill`` (the children to kill, if any)
    and exit at once with 128 + the signal's number."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if stopping():
                logs.tell(killing, logging.ERROR)
                if kill is not None:
                    await kill()
                os._exit(128 + signum)
            stop(signal.Signals(signum))
