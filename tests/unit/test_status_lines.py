"""``mdb run``'s periodic status line (docs/failover.md): on a terminal every
interval; elsewhere (a log collector) only when it changed."""

from __future__ import annotations

import io

import anyio
import pytest

from mdb.container.report import print_status, status_line
from mdb.observability.telemetry import Stats

pytestmark = pytest.mark.anyio


class Captured(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


async def printed(lines: list[str], terminal: bool) -> list[str]:
    """What ``print_status`` prints while its line takes the values of ``lines`` in turn."""
    out = Captured(terminal)
    given = iter(lines)
    done = anyio.Event()

    def line() -> str:
        value = next(given, None)
        if value is None:
            done.set()
            return lines[-1]
        return value

    async with anyio.create_task_group() as tg:
        tg.start_soon(print_status, line, 0.001, out)
        await done.wait()
        tg.cancel_scope.cancel()
    return out.getvalue().splitlines()


async def test_off_a_terminal_a_line_is_printed_when_it_changed() -> None:
    assert await printed(["processed 0", "processed 0", "processed 1", "processed 1"],
                         terminal=False) == ["mdb: processed 0", "mdb: processed 1"]


async def test_on_a_terminal_every_line_is_printed() -> None:
    assert (await printed(["processed 0", "processed 0"], terminal=True))[:2] == [
        "mdb: processed 0", "mdb: processed 0"]


def test_the_line_shows_processed_and_in_flight_and_only_the_other_counters_that_moved() -> None:
    quiet, busy = Stats(processed=3), Stats(processed=2, in_flight=1, redelivered=4,
                                            to_error_destination=1)
    assert status_line([quiet]) == "processed 3, in flight 0"
    assert status_line([quiet, busy]) == (
        "processed 5, in flight 1, redelivered 4, moved to an error destination 1")
