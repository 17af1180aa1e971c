"""The console's failed messages (``mdb.commands.console.failed_pages``) on the memory broker:
the error destinations with their counts per failure type, a page bounded and filtered, one
message whole with every value a producer wrote escaped and its secrets masked, and a replay
and a purge of a selection with ``mdb dlq``'s semantics (``FailedMessages``)."""

from __future__ import annotations

import re
from html import unescape

import pytest

from mdb import Redelivery
from mdb.commands.console.failed_pages import PAGE_SIZE, FailedPages, message_body
from mdb.commands.dlq.failed_message import Failed
from mdb.commands.dlq.failed_messages import FailedMessages
from mdb.config.settings import load_settings
from mdb.errors import ConfigurationError
from mdb.messages.destinations import Destination
from mdb.messages.identity import PROCESS
from mdb.messages.message import OutgoingMessage
from mdb.messages.topology import Member
from mdb.routing.producer import Producer
from mdb.seam.broker import ConnectionOptions, Delivery
from mdb.seam.registry import broker_for
from mdb.testing import SyncRunner
from tests.harness.apps.failing_orders import FailingOrders

pytestmark = pytest.mark.anyio

DLQ = "queue:console_orders.DLQ"
CSRF = '<input type="hidden" name="csrf" value="t0ken">'
orders = FailingOrders("queue:console_orders", Redelivery(limit=0))
on_order = orders.on_order


@pytest.fixture(autouse=True)
def fresh() -> None:
    orders.reset()



def _ids(html: str) -> list[str]:
    """The ids of the checkboxes of a page, in their order."""
    return [unescape(v) for v in re.findall(r'name="ids" value="([^"]*)"', html)]


SCRIPT = "<script>alert(1)</script>"


def test_everything_a_producer_wrote_is_shown_as_text_with_its_secrets_masked() -> None:
    headers = {"mdb_id": "m-1" + SCRIPT, "mdb_error_type": "T" + SCRIPT,
               "mdb_error_message": "cannot reach postgresql://app:hunter2@db/x " + SCRIPT,
               "mdb_error_traceback": f'  File "app.py", line 3, in on_x\n    raise {SCRIPT}',
               "mdb_original_destination": "queue:x" + SCRIPT, "x-api-key": "hunter3",
               "x-note" + SCRIPT: "\u202etext" + SCRIPT}
    delivery = Delivery(Destination.parse("queue:x.DLQ"), (SCRIPT + " body").encode(), headers,
                        None, False, None)
    failed = Failed.of(delivery, Member("default", delivery.destination), PROCESS,
                       assigned=True)
    html = message_body(failed, delivery.destination, CSRF)
    assert "<script" not in html
    shown = "&lt;script&gt;alert(1)&lt;/script&gt;"
    for value in ("m-1", "T", "queue:x", "<th>x-note", "text", "cannot reach "
                  "postgresql://app:***@db/x ", " body"):
        assert (value + shown if value != " body" else shown + value) in html, value
    assert "hunter2" not in html and "hunter3" not in html
    assert "\u202e" not in html and "\\u202e" in html  # shown, not obeyed
    assert "raise &lt;script&gt;" in html.partition("<h2>Traceback</h2>")[2]
    assert "&lt;/script&gt; body" in html.partition("<h2>Body</h2>")[2]
    assert CSRF in html and _ids(html) == ["m-1" + SCRIPT]
    # No session that may act: no form.
    assert "<form" not in message_body(failed, delivery.destination, "")


async def test_the_index_counts_each_failure_type_and_the_page_lists_and_filters(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        bad = [await app.send("queue:console_orders", f"bad {i}") for i in range(3)]
        worse = await app.send("queue:console_orders", "worse 1")
        await app.idle(fail_fast=False)
        pages = FailedPages(FailedMessages([app.error_destination(DLQ)]))

        index = await pages.index(CSRF)
        assert index.status == 200
        row = index.body.partition(DLQ)[2]
        assert "<td>4</td>" in row
        assert re.findall(r">([\w.]+)</a>: (\d+)</li>", row) == [("ValueError", "3"),
                                                                 ("KeyError", "1")]

        page = await pages.destination(DLQ, {}, CSRF)
        assert _ids(page.body) == [*bad, worse]
        assert 'action="/failed/queue%3Aconsole_orders.DLQ/replay"' in page.body
        only = await pages.destination(DLQ, {"error_type": ["KeyError"]}, CSRF)
        assert _ids(only.body) == [worse]
        assert _ids((await pages.destination(DLQ, {"offset": ["2"]}, CSRF)).body) == \
            [bad[2], worse]
        for offset in ("-1", "x", "٣", "99999999999999999999"):  # none breaks the page
            assert (await pages.destination(DLQ, {"offset": [offset]}, CSRF)).status == 200
        read_only = await pages.destination(DLQ, {}, "")
        assert "<form" not in read_only.body and _ids(read_only.body) == []

        shown = await pages.message(DLQ, bad[0], CSRF)
        assert shown.status == 200 and "cannot take bad 0" in shown.body
        assert ", in on_order" in shown.body.partition("<h2>Traceback</h2>")[2]

        assert (await pages.destination("queue:elsewhere.DLQ", {}, CSRF)).status == 404
        assert (await pages.message(DLQ, "nope", CSRF)).status == 404
        assert (await pages.replay(DLQ, [])).status == 400


async def test_a_page_is_bounded_and_links_to_the_next(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        sent = [await app.send("queue:console_orders", f"bad {i}")
                for i in range(PAGE_SIZE + 2)]
        await app.idle(fail_fast=False)
        pages = FailedPages(FailedMessages([app.error_destination(DLQ)]))
        first = await pages.destination(DLQ, {}, CSRF)
        assert _ids(first.body) == sent[:PAGE_SIZE]
        [after] = re.findall(r'href="([^"]*offset=[^"]*)">Next', first.body)
        assert unescape(after).endswith(f"offset={PAGE_SIZE}")
        second = await pages.destination(DLQ, {"offset": [str(PAGE_SIZE)]}, CSRF)
        assert _ids(second.body) == sent[PAGE_SIZE:] and "Next" not in second.body


async def test_a_replay_of_a_selection_from_the_page_processes_each_once_and_leaves_the_rest(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        first = await app.send("queue:console_orders", "bad 1")
        worse = await app.send("queue:console_orders", "worse 1")
        second = await app.send("queue:console_orders", "bad 2")
        await app.idle(fail_fast=False)
        pages = FailedPages(FailedMessages([app.error_destination(DLQ)]))
        orders.broken = False

        done = await pages.replay(DLQ, [first, second])
        assert done.status == 200
        assert "Replayed 2 message(s)." in done.body
        assert "1 not selected went to the back" in done.body
        await app.settled(first)
        await app.settled(second)
        await app.idle(fail_fast=False)
        assert sorted(orders.processed) == ["bad 1", "bad 2"]
        assert _ids((await pages.destination(DLQ, {}, CSRF)).body) == [worse]
        again = await pages.replay(DLQ, [first])  # gone: nothing is sent twice
        assert "Replayed 0 message(s)." in again.body
        assert sorted(orders.processed) == ["bad 1", "bad 2"]


async def test_a_purge_of_a_selection_leaves_the_others(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        sent = [await app.send("queue:console_orders", f"bad {i}") for i in range(3)]
        await app.idle(fail_fast=False)
        pages = FailedPages(FailedMessages([app.error_destination(DLQ)]))
        done = await pages.purge(DLQ, [sent[1]])
        assert "Purged 1 message(s)." in done.body
        # The one before it went to the back on the way (docs/failed-messages.md).
        assert _ids((await pages.destination(DLQ, {}, CSRF)).body) == [sent[2], sent[0]]


async def test_a_message_a_replay_cannot_send_back_is_left_saying_why(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        async with Producer(load_settings(None, brokers={"default": {"url": mdb_runner.url}})
                            ) as producer:
            await producer.send_message(Destination.parse(DLQ), OutgoingMessage(
                b"x", {"mdb_id": "stray" + SCRIPT}))
        pages = FailedPages(FailedMessages([app.error_destination(DLQ)]))
        done = await pages.replay(DLQ, ["stray" + SCRIPT])
        assert "Replayed 0 message(s)." in done.body
        assert "1 left on the error destination" in done.body
        assert "names no original destination" in done.body and "<script" not in done.body
        page = (await pages.destination(DLQ, {}, CSRF)).body
        assert _ids(page) == ["stray" + SCRIPT]
        assert "<li>(none): 1</li>" in page  # no failure type: counted, no filter of its own
        assert "<script" not in page and "stray&lt;script&gt;" in page
        assert "<script" not in (await pages.index(CSRF)).body


async def test_an_error_destination_another_operator_holds_is_a_409_saying_so(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        pages = FailedPages(FailedMessages([app.error_destination(DLQ)]))
        holder = await broker_for(ConnectionOptions(url=mdb_runner.url,
                                                    client_id="operator")).connect()
        try:
            await holder.lock(Destination.parse(DLQ))
            for answer in (await pages.destination(DLQ, {}, CSRF),
                           await pages.replay(DLQ, ["x"]), await pages.purge(DLQ, ["x"])):
                assert answer.status == 409 and "another mdb dlq command" in answer.body
        finally:
            await holder.close()


@pytest.mark.parametrize(("names", "modules", "said"), [
    (["topic:prices"], [], "console.error_destinations: topic:prices: an error destination "
                           "is a queue"),
    (["orders"], [], "console.error_destinations: "),
    ([], ["no_such_module_here"], "console.modules: "),
])
def test_an_error_destination_the_console_cannot_read_is_one_error_naming_the_setting(
        names: list[str], modules: list[str], said: str) -> None:
    settings = load_settings(None, brokers={"default": {"url": "stomp://localhost:1"}})
    with pytest.raises(ConfigurationError) as raised:
        FailedPages.of(settings, names, modules)
    assert str(raised.value).startswith(said)
    assert "\n" not in str(raised.value)
