"""``Signal``: wake every task waiting for something to change."""

from __future__ import annotations

import anyio


class Signal:
    """Tasks ``wait`` until the next ``notify``. An ``anyio.Event`` exists only while somebody
    waits: an event stays bound to the loop it was awaited on, and a broker outlives loops."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None
        self._waiting = 0

    async def wait(self) -> None:
        """Return at the next ``notify``."""
        event = self._event
        if event is None:
            event = self._event = anyio.Event()
        self._waiting += 1
        try:
            await event.wait()
        finally:
            self._waiting -= 1
            if self._waiting == 0 and self._event is event:
                self._event = None  # cancelled: never keep an event nobody waits on

    def notify(self) -> None:
        """Wake every task in ``wait``."""
        event = self._event
        if event is not None:
            self._event = None
            event.set()
