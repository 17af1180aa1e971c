"""Secrets are never shown (docs/security.md, "Secrets"): a broker URL's password, a password
setting's value and a CONNECT frame's passcode stay out of plan tables, errors and logs, DEBUG
included."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings, load_settings
from mdb.container.report import plan_table
from mdb.errors import ConfigurationError
from mdb.listeners.listener import listener, spec_of
from mdb.routing.planning import plan_listeners
from mdb.seam.broker import ConnectionOptions
from mdb.seam.registry import broker_for
from mdb_stomp.broker import StompBroker

SECRET = "s3cr3t-pw"


async def on_order(body: bytes) -> None:
    pass


def test_the_plan_table_masks_a_url_password() -> None:
    spec = spec_of(listener("queue:orders")(on_order))
    assert spec is not None
    settings = Settings(brokers={"main": BrokerSettings(
        url=f"stomp+activemq://admin:{SECRET}@broker.example:61613")})
    table = plan_table(settings, plan_listeners(settings, [spec]))
    assert SECRET not in table
    assert "stomp+activemq://admin:***@broker.example:61613" in table


@pytest.mark.parametrize("url", [
    f"kafka://u:{SECRET}@host:1",                     # no adapter for the scheme
    f"stomp+nothing://u:{SECRET}@host:1",             # no such dialect
    f"stomp+activemq://u:{SECRET}@host:99999",        # invalid port
])
def test_url_errors_mask_the_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        broker_for(ConnectionOptions(url=url))
    assert SECRET not in str(raised.value)


def test_the_stomp_adapter_masks_the_password_of_a_url_it_refuses() -> None:
    with pytest.raises(ConfigurationError) as raised:
        StompBroker(ConnectionOptions(url=f"stomp+activemq://u:{SECRET}@:61613"))
    assert SECRET not in str(raised.value) and "u:***@" in str(raised.value)


@pytest.mark.parametrize("toml", [
    f"[brokers.main]\nurl = 'memory://'\npasword = '{SECRET}'\n",        # misspelt key
    f"[brokers.main]\nurl = 'memory://'\npassword = {len(SECRET)}\n",    # mistyped value
    f"[brokers.main]\nurl = 'memory://'\npassword = ['{SECRET}']\n",
    f"[brokers.main]\nurl = 'stomp+activemq//u:{SECRET}@h:1'\n",         # an invalid url
])
def test_settings_errors_never_echo_a_value(tmp_path: Path, toml: str) -> None:
    (tmp_path / "mdb.toml").write_text(toml)
    with pytest.raises(ConfigurationError) as raised:
        load_settings(tmp_path / "mdb.toml")
    message = str(raised.value)
    assert SECRET not in message and str(len(SECRET)) not in message
    assert "setting brokers.main." in message


@pytest.fixture
def stomp_server() -> Iterator[int]:
    """A STOMP server that answers one CONNECT with CONNECTED and then reads until closed."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        peer, _ = server.accept()
        with peer:
            received = b""
            while b"\x00" not in received:
                received += peer.recv(4096)
            peer.sendall(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00")
            while peer.recv(4096):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.close()
    thread.join(timeout=5)


@pytest.mark.anyio
async def test_debug_logging_never_shows_the_passcode(
        stomp_server: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="mdb")  # stomp.py's records show at mdb's DEBUG
    broker = StompBroker(ConnectionOptions(
        url=f"stomp+activemq://127.0.0.1:{stomp_server}", username="u", password=SECRET,
        heartbeat_ms=0, receipt_timeout=1))
    connection = await broker.connect()
    await connection.close()
    assert any("CONNECT" in r.getMessage() for r in caplog.records), "stomp.py logged no frame"
    assert not [r.getMessage() for r in caplog.records if SECRET in r.getMessage()]


@pytest.mark.anyio
async def test_status_events_and_logs_of_a_down_broker_never_show_its_password(
        caplog: pytest.LogCaptureFixture) -> None:
    from tests.harness.apps.in_process import partitioned_settings, running, unique

    caplog.set_level(logging.DEBUG)
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]  # nothing listens there once closed
    settings = partitioned_settings(
        [f"memory://{unique('a')}", f"stomp+activemq://admin:{SECRET}@127.0.0.1:{port}",
         f"memory://{unique('c')}"], ["topic:prices"])
    settings.brokers["b"] = settings.brokers["b"].model_copy(update={"connect_timeout": 1})

    @listener("topic:prices")
    async def on_price(body: bytes) -> None:
        pass

    async with running(settings, on_price) as container:
        health = container.health()
    assert [b.state for b in health.brokers] == ["up", "down", "up"]
    assert SECRET not in json.dumps(health.to_json())
    assert any("connection-lost: broker b" in r.getMessage() for r in caplog.records)
    assert not [r.getMessage() for r in caplog.records if SECRET in r.getMessage()]
