"""The shop of ``tests.harness.apps.weblogic_app`` migrated by ``mdb migrate weblogic`` and run, as
its team would run it, on three ActiveMQ brokers that replace its three JMS servers: two
servers of the app process each message as the WebLogic deployment promised
(docs/migrating-from-weblogic.md, "The worked example"): once in the app for the queue beans
and the One-Copy-Per-Application topic bean, once on each server for the One-Copy-Per-Server
one, and the transacted bean's sends arrive."""

from __future__ import annotations

import queue
import re
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from mdb import Destination, Producer, Settings, load_settings
from mdb.commands.migrate.command import migrate
from mdb.messages import codec
from mdb.messages.headers import ID
from mdb.messages.topology import Member
from tests.harness.apps.in_process import WAIT
from tests.harness.apps.weblogic_app import BROKERS, write_sources
from tests.harness.processes.container_process import ROOT, ContainerProcess
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.ledger import PER_APP, PER_SERVER, check, views

pytestmark = pytest.mark.activemq

_STUB = re.compile(r"async def (\w+)\(body: str, ctx: Context\) -> None:\n    raise .*\n")


def ported(source: str) -> str:
    """The migrated module with each handler ported as the team would: each records what it
    processed (the ledger of ``tests.harness.apps.topic_ledger_app``); InvoiceBean's sends an
    invoice on, which a listener the team adds records too."""
    def port(stub: re.Match[str]) -> str:
        name = stub[1]
        sends = '    await ctx.send("queue:Invoices", ctx.id)\n' if name == "invoice_bean" else ""
        return (f"async def {name}(body: str, ctx: Context) -> None:\n{sends}"
                f"    await ledger(ctx, listener={name!r})\n")

    return (_STUB.sub(port, source).replace(
        "from mdb import Context, listener\n",
        "from mdb import Context, listener\n"
        "from tests.harness.apps.topic_ledger_app import ledger\n")
        + '\n\n@listener("queue:Invoices")\nasync def invoices(body: str, ctx: Context) -> None:\n'
          '    await ledger(ctx, listener="invoices", source=body)\n')


async def publish(settings: Settings, destination: str,
                  count: int) -> dict[str, Member]:
    """Send ``count`` messages to ``destination``; the member each went to, by its id."""
    stored: dict[str, Member] = {}
    async with Producer(settings) as producer:
        for n in range(count):
            message = codec.outgoing(f"{destination} {n}", None)
            stored[message.headers[ID]] = await producer.send_message(
                Destination.parse(destination), message)
    return stored


def test_the_migrated_shop_processes_each_message_as_weblogic_promised(
        tmp_path: Path, activemq_trio: list[BrokerProcess]) -> None:
    paths = write_sources(tmp_path / "app")
    out = tmp_path / "out"
    out.mkdir()
    migrate([paths["ear"], paths["src"], paths["domain"]], out)
    (out / "listeners.py").write_text(ported((out / "listeners.py").read_text()))
    settings = load_settings(out / "mdb.toml")
    for name, broker in zip(BROKERS, activemq_trio, strict=True):
        settings.brokers[name].url = str(broker.url)  # step 1 of the report's to-do list
    lines: queue.Queue[dict[str, Any]] = queue.Queue()
    servers = [ContainerProcess(settings, "unused", "shop", name, hang=False,
                                module="listeners", lines=lines,
                                env={"PYTHONPATH": f"{out}:{ROOT}"},
                                args=["--config", str(out / "mdb.toml")])
               for name in ("shop_1", "shop_2")]
    with servers[0] as first, servers[1]:
        first.take(2, "ready")
        events = anyio.run(publish, settings, "topic:OrderEvents", 30)
        orders = anyio.run(publish, settings, "queue:Orders", 12)
        requests = anyio.run(publish, settings, "queue:InvoiceRequests", 6)
        # each event once in the app and once on each server; each order and request once
        first.take(30 + 2 * 30 + 12 + 6 + 6, "done")
        for server in servers:
            server.process.send_signal(signal.SIGTERM)
        for server in servers:
            assert server.process.wait(timeout=WAIT) == 0, "\n".join(server.tail)
    done = [e for e in first.seen if e["event"] == "done"]
    by_listener: dict[str, list[dict[str, Any]]] = {}
    for entry in done:
        by_listener.setdefault(entry["listener"], []).append(entry)
    assert {member.broker for member in events.values()} == set(BROKERS)  # all three members
    for listener, told in (("order_audit_bean", events), ("order_intake_bean", orders),
                           ("invoice_bean", requests)):
        verdicts = views(by_listener[listener], PER_APP)
        assert list(verdicts) == ["shop"]
        verdict = check(told, verdicts["shop"])
        assert verdict.ok and verdict.deliveries == len(told), (listener, verdict)
    per_server = views(by_listener["price_cache_bean"], PER_SERVER)
    assert sorted(per_server) == ["shop/shop_1", "shop/shop_2"]
    for view, entries in per_server.items():
        verdict = check(events, entries)
        assert verdict.ok and verdict.deliveries == len(events), (view, verdict)
    # Both servers took their share of what the app shares.
    assert len(Counter(e["server"] for e in by_listener["order_audit_bean"])) == 2
    sent_on = check(requests, [{**e, "id": e["source"]} for e in by_listener["invoices"]])
    assert sent_on.ok and sent_on.deliveries == len(requests), sent_on
