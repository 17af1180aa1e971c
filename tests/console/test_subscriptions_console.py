"""The console's durable subscriptions on real brokers (docs/console.md, "Abandoned
subscriptions"): a container process with a one-copy-per-server topic listener holds its
subscription; stopped, it leaves the subscription abandoned on the broker, and the console
shows it so; its cleanup is refused without the login, and with it runs ``mdb subscriptions
--delete``'s implementation: RabbitMQ deletes the queue, ActiveMQ refuses over STOMP and the
page says so in its words (docs/activemq.md, "Deleting subscriptions")."""

from __future__ import annotations

import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from mdb.config.broker_settings import BrokerSettings
from mdb.config.console_settings import ConsoleSettings
from mdb.config.settings import Settings
from tests.harness.processes.console import Visitor, console
from tests.harness.processes.container_process import ContainerProcess
from tests.harness.servers.brokers import private_brokers
from tests.harness.servers.process import free_port
from tests.harness.servers.rabbitmq import RabbitMQ

TOKEN = "the-fleet's-control-token"
WAIT = 60.0


async def _no_control(url: str, listener: str, action: str) -> tuple[bool, str]:
    raise AssertionError("no pause or resume here")


def _shown(visitor: Visitor, name: str, abandoned: bool) -> str:
    """The overview once it shows subscription ``name`` so (the console reads again every
    refresh)."""
    wanted = f'data-name="{name}" data-abandoned="{str(abandoned).lower()}"'
    deadline = time.monotonic() + WAIT
    while True:
        status, page = visitor.get("/")
        if status == 200 and wanted in page:
            return page
        assert time.monotonic() < deadline, f"never shown: {wanted}\n{page}"
        time.sleep(0.5)  # the console's refresh: nothing to wait on from here


@pytest.mark.parametrize("kind", [pytest.param("activemq", marks=pytest.mark.activemq),
                                  pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def test_a_subscription_left_by_a_stopped_container_is_shown_abandoned_and_cleaned_up(
        kind: str, tmp_path: Path) -> None:
    token = tmp_path / "control-token"
    token.write_text(TOKEN + "\n")
    topic, port = f"prices_{uuid.uuid4().hex[:8]}", free_port()
    name = "shop-shop_1-on_entry"  # <app>-<server>-<listener>
    with private_brokers(kind) as [broker]:
        container = ContainerProcess(
            broker.url, "", "shop", "shop_1", hang=False,
            module="tests.harness.apps.topic_ledger_app",
            env={"LEDGER_TOPIC": topic, "LEDGER_DISTRIBUTION": "one-copy-per-server",
                 "MDB_HEALTH_PORT": str(port), "MDB_CONTROL_TOKEN_FILE": str(token)})
        settings = Settings(brokers={"default": BrokerSettings(url=broker.url)},
                            console=ConsoleSettings(containers=[f"http://127.0.0.1:{port}"],
                                                    port=0, refresh=0.5),
                            control_token_file=token)
        with container, console(settings, _no_control) as base:
            container.take(1, "ready")
            visitor = Visitor(base)
            page = _shown(visitor, name, abandoned=False)
            assert f"held</span> by http://127.0.0.1:{port}" in page

            container.process.send_signal(signal.SIGTERM)
            assert container.process.wait(timeout=WAIT) == 0
            _shown(visitor, name, abandoned=True)
            if isinstance(broker, RabbitMQ):
                assert any(name in queue for queue in broker.stored())

            fields = [("broker", "default"), ("destination", f"topic:{topic}"), ("name", name)]
            assert visitor.post("/subscriptions/delete", [("csrf", "guessed"), *fields])[0] == 403
            csrf = visitor.login(TOKEN)
            page = _shown(visitor, name, abandoned=True)
            assert re.search(r'action="/subscriptions/delete">.*?name="name" value="'
                             + re.escape(name), page)
            status, page = visitor.post("/subscriptions/delete", [("csrf", csrf), *fields])
            if kind == "activemq":
                assert status == 502 and "ActiveMQ cannot delete queue" in page
                _shown(visitor, name, abandoned=True)  # still there, still offered
                return
            assert status == 200 and f"Deleted subscription {name}" in page
            assert isinstance(broker, RabbitMQ)
            assert not any(name in queue for queue in broker.stored())
            assert f'data-name="{name}"' not in visitor.get("/")[1]
