"""``mdb run --config FILE``: the file's topology applied live when it changes or on SIGHUP."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import anyio

from mdb.config.settings import load_settings
from mdb.container.container import Container
from mdb.errors import ConfigurationError

log = logging.getLogger("mdb.process.topology_watch")

# How often ``mdb run`` looks at its --config file for a changed topology.
CONFIG_POLL_INTERVAL = 2.0


async def reload_on_change(container: Container, path: Path, app: str | None,
                           server: str | None) -> None:
    """Apply the topology of ``path`` (with the command line's ``--app``/``--server``) when it
    changes (polled) or on SIGHUP; a bad one is rejected with a message and the running one
    stays."""
    seen = _mtime(path)

    async def reload(why: str) -> None:
        try:
            settings = load_settings(path, app=app, server=server)
            await container.apply(settings)
        except ConfigurationError as exc:
            log.error("%s: topology change rejected, the running one stays: %s", why, exc)

    async def on_sighup() -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                await reload("SIGHUP")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(on_sighup)
        while True:
            await anyio.sleep(CONFIG_POLL_INTERVAL)
            if (now := _mtime(path)) != seen:
                seen = now
                await reload(f"{path} changed")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
