"""The child processes of ``mdb run``: the workers of ``--workers N``
(``mdb.serving.process.supervisor``) and the container of ``--reload``
(``mdb.serving.process.code_watch``), each ``mdb run`` again. How a parent stops one in order."""

from __future__ import annotations

import signal

import anyio
from anyio.abc import Process

KILL_MARGIN = 10.0  # seconds past shutdown_grace_period before a stopping child is killed


async def stop_in_order(process: Process, grace: float) -> int:
    """Stop ``process`` as SIGTERM stops ``mdb run`` (in-flight handlers get ``grace``
    seconds, its ``shutdown_grace_period``); kill it when it has not ended ``KILL_MARGIN``
    seconds after that. Its exit status."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    with anyio.move_on_after(grace + KILL_MARGIN):
        return await process.wait()
    process.kill()
    return await process.wait()
