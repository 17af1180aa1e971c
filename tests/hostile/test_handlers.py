"""Hostile bodies and handlers that must not end a container: a body nested too deep for the
JSON parser, an exception that cannot be rendered or is huge, and a handler that raises
``CancelledError`` or ``SystemExit`` of its own (docs/security.md). Each fails its own delivery
only: the container stays ready, the next message is processed, and the hostile message ends
on its error destination, intact and explained, or is processed on a later delivery. ``mdb
run`` stops only when asked to, and exits non-zero when it stops otherwise."""

from __future__ import annotations

import logging

import pytest

from mdb import Redelivery, listener
from mdb.codec import MAX_TEXT
from mdb.delivery.decision import ERROR_TEXT_LIMIT
from mdb.errors import UNNAMED
from mdb.message import ERROR_MESSAGE, ERROR_TYPE
from tests.contract.support import Calls, read, running, settings_for, unique
from tests.hostile.test_policy import send, still_flowing

pytestmark = pytest.mark.anyio


# -- exceptions that cannot be shown ------------------------------------------------------------

class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class Nameless(type):
    @property
    def __module__(cls) -> str:  # type: ignore[override]  # found before type's own
        raise RuntimeError("no module")


class WeirdError(Exception, metaclass=Nameless):
    pass


async def test_an_exception_that_cannot_be_shown_or_is_huge_fails_only_its_delivery(
        broker_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Rendering an exception whose ``__str__`` raised, or whose class has no name, ended the
    container; one with a 20 MB text wrote a 20 MB log line. Now each is shown as far as it
    can be, bounded alike in logs and error headers."""
    caplog.set_level(logging.INFO, logger="mdb")
    queue = f"queue:{unique('unprintable')}"
    calls = Calls()

    @listener(queue, redelivery=Redelivery(limit=0))
    async def handler(body: str) -> None:
        calls.add("body", body)
        if body == "unprintable":
            raise Unprintable()
        if body == "nameless":
            raise WeirdError("weird")
        if body == "huge":
            raise ValueError("x" * 20_000_000)

    async with running(settings_for(broker_url), handler) as container:
        for body in ("unprintable", "nameless", "huge"):
            await send(broker_url, queue, body)
        moved = {m.body: m for m in await read(broker_url, f"{queue}.DLQ", 3)}
        await still_flowing(broker_url, container, calls, queue)
    unprintable, nameless, huge = (moved[body] for body in (b"unprintable", b"nameless", b"huge"))
    assert unprintable.headers[ERROR_TYPE] == f"{__name__}.Unprintable"
    assert unprintable.headers[ERROR_MESSAGE] == f"<unprintable {__name__}.Unprintable>"
    assert nameless.headers[ERROR_TYPE] == UNNAMED
    assert nameless.headers[ERROR_MESSAGE] == "weird"
    assert huge.headers[ERROR_TYPE] == "ValueError"
    assert huge.headers[ERROR_MESSAGE].startswith("xxx")
    assert len(huge.headers[ERROR_MESSAGE].encode()) <= ERROR_TEXT_LIMIT
    assert "x" * 100 in caplog.text
    assert max(len(r.getMessage()) for r in caplog.records) < MAX_TEXT + 1000
