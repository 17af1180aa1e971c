"""A copy mdb re-sends (for a redelivery, to the error destination) is the same message, on
every broker: its body, its kind (text or bytes), the application's headers, its reply-to and
correlation id; only mdb's own headers are added (docs/concepts.md, "How redelivery works,
and why")."""

from __future__ import annotations

from typing import cast

import pytest

from mdb import Context, Producer, Redelivery, listener
from mdb.messages.headers import CONTENT_TYPE, DELIVERY_COUNT, ERROR_TYPE, ID
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.traffic.messages import read

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("body", ["text é", b"\x00\xffbytes"], ids=["text", "bytes"])
async def test_retry_and_error_copies_keep_the_message(broker_url: str, body: str | bytes) -> None:
    queue, errors, replies = (f"queue:{unique(p)}" for p in ("copied", "copy_errors", "copy_re"))
    calls = Calls()

    @listener(queue, redelivery=Redelivery(limit=1, delay=0), error_destination=errors)
    async def handler(data: bytes, ctx: Context) -> None:
        calls.add("seen", (data, ctx.headers.get("region"), ctx.message.correlation_id,
                           ctx.headers.get(CONTENT_TYPE)))
        raise RuntimeError("refused")

    async with Producer(settings_for(broker_url)) as producer:
        sent = await producer.send(queue, body, {"region": "eu"}, reply_to=replies,
                                   correlation_id="c-1")
    async with running(settings_for(broker_url), handler):
        [moved] = await read(broker_url, errors, 1)
    raw = body.encode() if isinstance(body, str) else body
    first, again = (cast(tuple[object, ...], seen) for seen in calls.of("seen"))
    assert first == again and first[:3] == (raw, "eu", "c-1")
    assert moved.body == raw
    h = moved.headers
    assert (h[ID], h["region"], h[DELIVERY_COUNT], h[ERROR_TYPE]) == (
        sent, "eu", "2", "RuntimeError")
    assert h.get(CONTENT_TYPE) == first[3]
    assert moved.correlation_id == "c-1"
    assert moved.reply_to is not None and replies.split(":", 1)[1] in str(moved.reply_to)
