"""TLS, virtual hosts, authentication and authorization on real brokers (docs/security.md, "TLS
and authentication").

Two brokers of their own, shared by the session: an ActiveMQ with a ``stomp+ssl`` connector
that wants a client certificate (mutual TLS) and a RabbitMQ node with a STOMP TLS listener; the
certificates are made at test time (``tests.harness.servers.certificates``). Both require a login,
as every test broker does. An expired certificate and a TLS 1.2-only server are played by a
Python TLS server in a thread: no broker sends either.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from mdb.errors import ConnectionFailed, SubscriptionFailed
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage, new_id
from mdb.routing.links import adapter
from mdb.routing.producer import Producer
from mdb.seam.broker import Connection, SubscriptionRequest
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.servers.certificates import Certificates
from tests.harness.servers.process import BrokerProcess
from tests.harness.servers.rabbitmq import RabbitMQ

pytestmark = [pytest.mark.anyio]

WAIT = 20.0  # a hang guard on every wait, not a timing assertion
QUEUE = Destination.parse("queue:transport")


def _settings(url: str, tls: dict[str, Any] | None = None, **more: Any) -> BrokerSettings:
    return BrokerSettings(url=url, tls=tls, connect_timeout=5, receipt_timeout=5, **more)


async def _connect(url: str, tls: dict[str, Any] | None = None) -> Connection:
    with anyio.fail_after(WAIT):
        return await adapter("main", _settings(url, tls), "transport-test").connect()


async def _refusal(url: str, tls: dict[str, Any] | None = None) -> str:
    with pytest.raises(ConnectionFailed) as refused:
        await _connect(url, tls)
    text = str(refused.value)
    assert "\n" not in text and "broker main" in text
    return text


async def _round_trip(connection: Connection, destination: Destination, body: bytes) -> bytes:
    with anyio.fail_after(WAIT):
        subscription = await connection.subscribe(
            SubscriptionRequest(destination, None, False, None, 1))
        await connection.send(destination, OutgoingMessage(body, {ID: new_id()}))
        delivery = await subscription.receive()
        await connection.ack(delivery)
        await subscription.close()
        return delivery.body


def _mutual(certs: Certificates) -> dict[str, Any]:
    return {"ca_file": certs.ca, "cert_file": certs.client_cert, "key_file": certs.client_key}


@pytest.fixture(params=[pytest.param("activemq_tls", marks=pytest.mark.activemq),
                        pytest.param("rabbitmq_tls", marks=pytest.mark.rabbitmq)])
def tls_broker(request: pytest.FixtureRequest) -> ActiveMQ | RabbitMQ:
    broker: ActiveMQ | RabbitMQ = request.getfixturevalue(request.param)
    return broker


# -- TLS ---------------------------------------------------------------------------------------


async def test_messages_flow_over_tls(tls_broker: ActiveMQ | RabbitMQ,
                                      tls_certificates: Certificates) -> None:
    connection = await _connect(tls_broker.tls_url, _mutual(tls_certificates))
    try:
        assert await _round_trip(connection, QUEUE, b"over tls") == b"over tls"
    finally:
        await connection.close()


async def test_a_wrong_ca_is_one_line_naming_the_broker_and_the_cause(
    tls_broker: ActiveMQ | RabbitMQ, tls_certificates: Certificates,
) -> None:
    tls = dict(_mutual(tls_certificates), ca_file=tls_certificates.other_ca)
    text = await _refusal(tls_broker.tls_url, tls)
    assert "certificate was not accepted" in text and "self-signed" in text


async def test_a_wrong_host_name_is_refused(tls_broker: ActiveMQ | RabbitMQ,
                                            tls_certificates: Certificates) -> None:
    # The server certificate names 127.0.0.1 only.
    text = await _refusal(tls_broker.tls_url.replace("127.0.0.1", "localhost"),
                          _mutual(tls_certificates))
    assert "Hostname mismatch" in text


async def test_plaintext_to_a_tls_port_says_so(tls_broker: ActiveMQ | RabbitMQ) -> None:
    text = await _refusal(tls_broker.tls_url)
    assert "TLS port" in text


async def test_tls_to_a_plaintext_port_says_so(tls_broker: ActiveMQ | RabbitMQ,
                                               tls_certificates: Certificates) -> None:
    text = await _refusal(tls_broker.url, _mutual(tls_certificates))
    assert "plaintext port" in text


@pytest.mark.activemq
async def test_mutual_tls_without_a_client_certificate_is_refused(
    activemq_tls: ActiveMQ, tls_certificates: Certificates,
) -> None:
    text = await _refusal(activemq_tls.tls_url, {"ca_file": tls_certificates.ca})
    assert "client certificate" in text


@pytest.fixture
def fake_tls_server(tls_certificates: Certificates) -> Iterator[Any]:
    """Start a TLS server on a free port with a given certificate and highest version; it
    completes handshakes and answers nothing. Yields ``start(cert, max_version) -> port``."""
    listeners: list[socket.socket] = []

    def start(cert: Path, max_version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED) -> int:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, tls_certificates.server_key)
        context.maximum_version = max_version
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def handshake(client: socket.socket) -> None:
            try:
                with context.wrap_socket(client, server_side=True) as tls_client:
                    tls_client.recv(1)
            except OSError:
                pass

        def serve() -> None:
            while True:
                try:
                    client, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=handshake, args=(client,), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    for listener in listeners:
        listener.close()


async def test_an_expired_certificate_is_refused(fake_tls_server: Any,
                                                 tls_certificates: Certificates) -> None:
    port = fake_tls_server(tls_certificates.expired_cert)
    text = await _refusal(f"stomp+activemq://127.0.0.1:{port}", {"ca_file": tls_certificates.ca})
    assert "certificate has expired" in text


async def test_a_tls_version_below_min_version_is_refused(fake_tls_server: Any,
                                                          tls_certificates: Certificates) -> None:
    port = fake_tls_server(tls_certificates.server_cert, ssl.TLSVersion.TLSv1_2)
    text = await _refusal(f"stomp+activemq://127.0.0.1:{port}",
                          {"ca_file": tls_certificates.ca, "min_version": "1.3"})
    assert "version" in text.lower()


def test_mdb_run_with_a_wrong_ca_exits_3_with_one_line(
    activemq_tls: ActiveMQ, tls_certificates: Certificates, tmp_path: Path,
) -> None:
    (tmp_path / "app_listeners.py").write_text(
        "from mdb import listener\n\n@listener('queue:orders')\n"
        "async def on_order(body: bytes) -> None:\n    pass\n")
    (tmp_path / "mdb.toml").write_text(
        f"[brokers.main]\nurl = '{activemq_tls.tls_url}'\nconnect_timeout = 5\n"
        f"[brokers.main.tls]\nca_file = '{tls_certificates.other_ca}'\n"
        f"cert_file = '{tls_certificates.client_cert}'\n"
        f"key_file = '{tls_certificates.client_key}'\n")
    result = subprocess.run(
        [sys.executable, "-m", "mdb.commands.cli", "run", "app_listeners", "--config", "mdb.toml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 3
    errors = [line for line in result.stderr.splitlines() if line.startswith("mdb:")]
    assert len(errors) == 1
    assert "broker main" in errors[0] and "certificate was not accepted" in errors[0]
    assert activemq_tls.password not in result.stderr


# -- authentication and authorization ------------------------------------------------------


@pytest.fixture(params=[pytest.param("activemq", marks=pytest.mark.activemq),
                        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def any_broker(request: pytest.FixtureRequest) -> BrokerProcess:
    broker: BrokerProcess = request.getfixturevalue(request.param)
    return broker


async def test_test_brokers_refuse_anonymous_connections(any_broker: BrokerProcess) -> None:
    text = await _refusal(any_broker.anonymous_url)
    assert "refused the credentials of user (none)" in text


async def test_wrong_credentials_are_one_clear_error_at_once(any_broker: BrokerProcess) -> None:
    url = any_broker.url.replace(any_broker.password, "wrong-password")
    text = await _refusal(url)
    assert "refused the credentials of user mdb" in text
    assert "wrong-password" not in text


async def test_a_send_with_wrong_credentials_fails_at_once_without_retrying(
    any_broker: BrokerProcess,
) -> None:
    url = any_broker.url.replace(any_broker.password, "wrong-password")
    # A refused login is not waited out like a broker that is down (send_wait_for_reconnect).
    settings = Settings(brokers={"main": _settings(url, send_wait_for_reconnect=600)})
    with anyio.fail_after(WAIT), pytest.raises(ConnectionFailed, match="refused the credentials"):
        async with Producer(settings) as producer:
            await producer.send("queue:transport", b"never sent")


async def test_credentials_from_settings_and_a_password_file(
    any_broker: BrokerProcess, tmp_path: Path,
) -> None:
    secret = tmp_path / "password"
    secret.write_text(any_broker.password + "\n")
    settings = _settings(any_broker.anonymous_url, username="mdb", password_file=secret)
    with anyio.fail_after(WAIT):
        connection = await adapter("main", settings, "transport-test").connect()
    await connection.close()


def _user_without_rights(broker: ActiveMQ | RabbitMQ) -> str:
    """The URL of a user who may connect to ``broker`` but not read ``QUEUE``."""
    if isinstance(broker, ActiveMQ):
        return f"stomp+activemq://outsider:outsider-pw@127.0.0.1:{broker.port}"
    broker.ctl("add_user", "writer", "writer-pw")
    # May declare and write anything, read nothing.
    broker.ctl("set_permissions", "-p", "/", "writer", ".*", ".*", "^$")
    return f"stomp+rabbitmq://writer:writer-pw@127.0.0.1:{broker.port}"


async def test_a_user_that_may_not_read_a_queue_gets_subscription_failed(
    tls_broker: ActiveMQ | RabbitMQ,
) -> None:
    connection = await _connect(_user_without_rights(tls_broker))
    try:
        with anyio.fail_after(WAIT), pytest.raises(SubscriptionFailed) as refused:
            await connection.subscribe(SubscriptionRequest(QUEUE, None, False, None, 1))
        assert "queue:transport" in str(refused.value)
        assert "not authorized" in str(refused.value) or "access_refused" in str(refused.value)
    finally:
        await connection.close()


# -- virtual hosts ---------------------------------------------------------------------------


@pytest.mark.rabbitmq
async def test_two_rabbitmq_vhosts_do_not_see_each_others_messages(
    rabbitmq_tls: RabbitMQ,
) -> None:
    for vhost in ("tenant_a", "tenant_b"):
        rabbitmq_tls.ctl("add_vhost", vhost)
        rabbitmq_tls.ctl("set_permissions", "-p", vhost, "mdb", ".*", ".*", ".*")
    a = await _connect(f"{rabbitmq_tls.url}/tenant_a")
    b = await _connect(f"{rabbitmq_tls.url}/tenant_b")
    try:
        with anyio.fail_after(WAIT):
            # Sent first, to the same queue name: were the vhosts one, b would get it first.
            await a.send(QUEUE, OutgoingMessage(b"for tenant a", {ID: new_id()}))
            assert await _round_trip(b, QUEUE, b"for tenant b") == b"for tenant b"
            subscription = await a.subscribe(SubscriptionRequest(QUEUE, None, False, None, 1))
            delivery = await subscription.receive()
            assert delivery.body == b"for tenant a"
            await a.ack(delivery)
    finally:
        await a.close()
        await b.close()


@pytest.mark.rabbitmq
async def test_a_vhost_the_user_may_not_use_is_refused(rabbitmq_tls: RabbitMQ) -> None:
    text = await _refusal(f"{rabbitmq_tls.url}/no_such_vhost")
    assert "refused the connection" in text and "no_such_vhost" in text
