"""An orders listener that fails on purpose, for the tests of the failed-message workflow
(tests/unit/test_failed.py) and of the console's failed messages
(tests/unit/test_failed_pages.py): what reaches its error destination, and what a replay then
processes."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from mdb import Redelivery, listener


class FailingOrders:
    """The listener ``on_order`` of ``destination``: a body starting ``bad`` raises
    ``ValueError`` while ``broken`` (the fix not deployed), one starting ``worse`` always raises
    ``KeyError``; every other body is appended to ``processed``."""

    def __init__(self, destination: str, redelivery: Redelivery) -> None:
        self.broken = True
        self.processed: list[str] = []

        @listener(destination, redelivery=redelivery)
        async def on_order(body: str) -> None:
            if self.broken and body.startswith("bad"):
                raise ValueError(f"cannot take {body}")
            if body.startswith("worse"):
                raise KeyError(body)
            self.processed.append(body)

        self.on_order: Callable[[str], Coroutine[Any, Any, None]] = on_order

    def reset(self) -> None:
        """Broken again and nothing processed: each test starts as the first."""
        self.broken = True
        self.processed.clear()
