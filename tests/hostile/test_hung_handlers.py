"""Hung handlers cannot hang a container (second hostile round): a handler past its listener's
``handler_timeout`` fails its delivery (an ``async def`` one cancelled), a plain ``def`` one
that cannot be cancelled is counted stuck and named by the health endpoint, and a stop ends
the process even when a handler thread never returns, with its message unacknowledged.
See docs/concepts.md#handler-timeouts."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest

from mdb import Context, Redelivery, listener
from mdb.container.report import status_report
from mdb.messages.headers import DELIVERY_COUNT, ERROR_TYPE
from mdb.observability.health import Health
from mdb.serving.http.routes import HealthServer
from tests.harness.apps.in_process import WAIT, Calls, running, settings_for, unique
from tests.harness.processes.health import get
from tests.harness.processes.mdb_run import MdbRun
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.messages import read, send

# A module run by ``mdb run``: a plain def handler that never returns. With $SEED set it puts
# the message on the process's own embedded broker as it is imported.
STUCK_APP = """\
import os, threading, time

import anyio

from mdb import Producer, Settings, listener

QUEUE = os.environ["STUCK_QUEUE"]


@listener(QUEUE)
def on_stuck(body: str) -> None:
    os.write(1, b"handler started\\n")
    time.sleep(10**6)


async def _seed() -> None:
    async with Producer(Settings()) as producer:
        await producer.send(QUEUE, "stuck")

if os.environ.get("SEED"):  # modules are imported on the container's loop: seed on another
    seeding = threading.Thread(target=anyio.run, args=(_seed,))
    seeding.start()
    seeding.join()
"""


@pytest.fixture
def warnings() -> Iterator[Calls]:
    """The WARNING lines of ``mdb.delivery``, as they are logged (on the event loop)."""
    seen = Calls()

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.WARNING:
                seen.add("warning", record.getMessage())

    recorder = Recorder()
    logger = logging.getLogger("mdb.delivery")
    logger.addHandler(recorder)
    try:
        yield seen
    finally:
        logger.removeHandler(recorder)


@pytest.mark.anyio
async def test_an_async_handler_past_its_timeout_is_cancelled_redelivered_then_moved() -> None:
    url, name = f"memory://{unique('hung')}", unique("hung")
    calls = Calls()

    @listener(f"queue:{name}", handler_timeout=0.05, redelivery=Redelivery(limit=1, delay=0))
    async def on_hung(body: str, ctx: Context) -> None:
        calls.add("delivery", ctx.delivery_count)
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            calls.add("cancelled", ctx.delivery_count)
            raise

    async with running(settings_for(url), on_hung) as container:
        await send(url, f"queue:{name}", "hangs")
        [moved] = await read(url, f"queue:{name}.DLQ", 1)
        assert container.health().ready
    assert calls.of("delivery") == calls.of("cancelled") == [1, 2]
    assert moved.headers[ERROR_TYPE] == "mdb.errors.HandlerTimeout"
    assert moved.headers[DELIVERY_COUNT] == "2" and moved.body == b"hangs"


@pytest.mark.anyio
async def test_a_stop_cancelling_a_handler_is_not_a_timeout() -> None:
    """The container's own cancellation at the end of the grace period leaves the message
    unsettled: back on its queue, not failed as timed out."""
    url, name = f"memory://{unique('stop')}", unique("stop")
    calls = Calls()

    @listener(f"queue:{name}", handler_timeout=600, redelivery=Redelivery(limit=0))
    async def on_slow(body: str) -> None:
        calls.add("started", body)
        await anyio.sleep_forever()

    async with running(settings_for(url, shutdown_grace_period=0.01), on_slow):
        await send(url, f"queue:{name}", "slow")
        await calls.wait(lambda c: bool(c.of("started")))
    [back] = await read(url, f"queue:{name}", 1)
    assert back.body == b"slow" and back.broker_redelivered


@pytest.mark.anyio
async def test_stuck_plain_handlers_turn_readiness_false_and_status_names_them(
        warnings: Calls) -> None:
    url, name = f"memory://{unique('stuck')}", unique("stuck")
    release = threading.Event()
    calls = Calls()

    @listener(f"queue:{name}", pool=2, handler_timeout=0.05,
              redelivery=Redelivery(limit=1, delay=0))
    def on_stuck(body: str, ctx: Context) -> None:
        if ctx.delivery_count == 1:
            release.wait(WAIT)
        else:
            anyio.from_thread.run_sync(calls.add, "done", body)

    async with running(settings_for(url), on_stuck) as container:
        server = HealthServer(container.health, "127.0.0.1", 0)
        server.start()
        base = f"http://127.0.0.1:{server.port}"
        try:
            first = await send(url, f"queue:{name}", "first")
            await warnings.wait(lambda w: len(w.of("warning")) == 1)
            [health] = container.health().listeners
            assert container.health().ready  # one slot of two is stuck: it still takes work
            assert [h.message_id for h in health.stuck] == [first]

            second = await send(url, f"queue:{name}", "second")
            await warnings.wait(lambda w: len(w.of("warning")) == 2)
            status, ready = await anyio.to_thread.run_sync(get, f"{base}/health/ready")
            assert status == 503 and ready["listeners_stuck"] == [
                {"name": "on_stuck", "stuck": 2, "slots": 2}]
            status, body = await anyio.to_thread.run_sync(get, f"{base}/status")
            snapshot = Health.from_json(body)
            assert status == 200 and not snapshot.ready
            [listener_health] = snapshot.listeners
            assert {h.message_id for h in listener_health.stuck} == {first, second}
            report = status_report(snapshot, base)
            assert "because listener on_stuck has all 2 slots stuck" in report
            [table] = [part for part in report.split("\n\n") if part.startswith("stuck handler")]
            assert {tuple(row.split()[:2]) for row in table.splitlines()[1:]} == {
                ("on_stuck", first), ("on_stuck", second)}
            assert all("handler_timeout of 0.05 s on message" in str(w)
                       for w in warnings.of("warning"))

            release.set()  # they return: timed out, redelivered, and done the second time
            await calls.wait(lambda c: set(c.of("done")) == {"first", "second"})
            assert container.health().ready
            assert container.health().listeners[0].stuck == ()
        finally:
            release.set()
            server.close()


def test_a_stop_ends_the_process_though_a_handler_thread_never_returns(tmp_path: Path) -> None:
    """No handler_timeout at all: the grace period alone ends the wait, and the process."""
    run = MdbRun(tmp_path, {"STUCK_QUEUE": f"queue:{unique('stuck')}", "SEED": "1"}, STUCK_APP)
    run.wait_for("handler started")
    assert run.stop() == 0, "".join(run.seen)
    [said] = [line for line in run.seen if "exiting without waiting" in line]
    assert "listener on_stuck, message " in said and "come back in doubt" in said


@pytest.mark.activemq
def test_a_stuck_handler_leaves_its_message_unacknowledged_to_come_back(
        activemq: BrokerProcess, tmp_path: Path) -> None:
    url, name = str(activemq.url), f"queue:{unique('stuck')}"
    sent = anyio.run(send, url, name, "stuck")
    run = MdbRun(tmp_path, {"STUCK_QUEUE": name, "MDB_BROKERS__DEFAULT__URL": url,
                            "MDB_LISTENERS__ON_STUCK__HANDLER_TIMEOUT": "0.1"}, STUCK_APP)
    run.wait_for("a plain def cannot be cancelled")
    assert run.stop() == 0, "".join(run.seen)
    assert any("listener on_stuck, message " + sent in line for line in run.seen), run.seen
    [back] = anyio.run(read, url, name, 1)
    assert back.headers["mdb_id"] == sent and back.broker_redelivered
