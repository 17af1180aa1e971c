"""A careless or hostile operator's settings for the connection itself (docs/security.md, "TLS
and authentication"): broker URLs with parts mdb would ignore, credentials that would inject
CONNECT headers, credentials from a file, and TLS settings that cannot work. These need no
broker; ``test_transport_brokers.py`` covers the same on real brokers (TLS, vhosts, refused
credentials, authorization).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import load_settings
from mdb.errors import ConfigurationError
from mdb.routing.links import adapter
from mdb.seam.broker import ConnectionOptions
from mdb_stomp import StompBroker


def _refused(url: str) -> str:
    with pytest.raises(ConfigurationError) as refused:
        adapter("main", BrokerSettings(url=url), "c")
    return str(refused.value)


@pytest.mark.parametrize(("url", "part"), [
    ("stomp+activemq://h:61613?ssl=true", "query"),
    ("stomp+rabbitmq://h:61613/vhost?ssl=true", "query"),
    ("stomp+activemq://h:61613#frag", "fragment"),
    ("stomp+activemq://h:61613/tenant_a", "path"),
    ("stomp+rabbitmq://h:61613/a/b", "path"),
    ("stomp+activemq://h", "port"),
    ("stomp+rabbitmq://h", "port"),
])
def test_url_parts_mdb_does_not_understand_are_refused(url: str, part: str) -> None:
    text = _refused(url)
    assert "brokers.main.url" in text
    assert part in text


def test_a_refused_url_never_shows_its_password() -> None:
    text = _refused("stomp+activemq://u:hunter2@h:61613?ssl=true")
    assert "hunter2" not in text
    assert "u:***@h:61613" in text


def test_a_rabbitmq_vhost_in_the_url_is_the_connect_host_header() -> None:
    def vhost(url: str) -> str | None:
        broker = adapter("main", BrokerSettings(url=url), "c")
        assert isinstance(broker, StompBroker)
        return broker.vhost

    assert vhost("stomp+rabbitmq://h:61613/tenant_a") == "tenant_a"
    assert vhost("stomp+rabbitmq://h:61613/a%2Fb") == "a/b"
    assert vhost("stomp+rabbitmq://h:61613") == "/"
    assert vhost("stomp+rabbitmq://h:61613/") == "/"
    assert vhost("stomp+rabbitmq://h:61613/%2F") == "/"


@pytest.mark.parametrize("bad", ["u\nx:y", "u\r", "u\x00v"])
def test_connect_header_injection_through_settings_is_refused(bad: str) -> None:
    for field in ("username", "password"):
        with pytest.raises(ConfigurationError) as refused:
            load_settings(brokers={"main": {"url": "stomp+activemq://h:61613", field: bad}})
        assert f"brokers.main.{field}" in str(refused.value)
        assert bad not in str(refused.value)


@pytest.mark.parametrize("userinfo", ["u%0Ax:pw", "u:p%0Dw", "u:p%00w", "u%0A:p"])
def test_connect_header_injection_through_the_url_is_refused(userinfo: str) -> None:
    text = _refused(f"stomp+activemq://{userinfo}@h:61613")
    assert "brokers.main.url" in text
    assert "newline" in text


def test_connect_header_injection_past_settings_is_refused_by_the_adapter() -> None:
    options = ConnectionOptions("stomp+activemq://h:61613", username="u\nx:y", broker="main")
    with pytest.raises(ConfigurationError, match=r"brokers\.main\.username: .*newline"):
        StompBroker(options)


def test_connect_header_injection_through_a_vhost_is_refused() -> None:
    assert "newline" in _refused("stomp+rabbitmq://h:61613/a%0Ahost:x")


def test_url_credentials_are_percent_decoded() -> None:
    broker = adapter("main", BrokerSettings(url="stomp+activemq://u%40x:p%3Aw%40@h:61613"), "c")
    assert isinstance(broker, StompBroker)
    assert (broker.username, broker.password) == ("u@x", "p:w@")


def test_the_password_can_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    settings = load_settings(brokers={"main": {
        "url": "stomp+activemq://h:61613", "username": "mdb", "password_file": str(secret)}})
    password = settings.brokers["main"].password
    assert password is not None and password.get_secret_value() == "s3cret"


def test_a_password_and_a_password_file_together_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("a")
    with pytest.raises(ConfigurationError, match=r"brokers\.main.*password_file"):
        load_settings(brokers={"main": {"url": "stomp+activemq://h:61613", "password": "b",
                                        "password_file": str(secret)}})


def test_a_missing_password_file_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"brokers\.main\.password_file"):
        load_settings(brokers={"main": {"url": "stomp+activemq://h:61613",
                                        "password_file": str(tmp_path / "nope")}})


def test_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDB_BROKERS__MAIN__URL", "stomp+activemq://h:61613")
    monkeypatch.setenv("MDB_BROKERS__MAIN__USERNAME", "mdb")
    monkeypatch.setenv("MDB_BROKERS__MAIN__PASSWORD", "from-env")
    broker = load_settings().brokers["main"]
    assert broker.username == "mdb"
    assert broker.password is not None and broker.password.get_secret_value() == "from-env"


def test_tls_files_that_do_not_exist_are_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"brokers\.main\.tls\.ca_file"):
        load_settings(brokers={"main": {"url": "stomp+activemq://h:61614",
                                        "tls": {"ca_file": str(tmp_path / "nope.pem")}}})


def test_a_client_certificate_needs_its_key_and_the_memory_broker_has_no_tls(
    tmp_path: Path,
) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigurationError, match="key_file"):
        load_settings(brokers={"main": {"url": "stomp+activemq://h:61614",
                                        "tls": {"cert_file": str(cert)}}})
    with pytest.raises(ConfigurationError, match=r"brokers\.main\.tls"):
        adapter("main", BrokerSettings(url="memory://x", tls={}), "c")


def test_tls_settings_reach_the_adapter(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    settings = load_settings(brokers={"main": {
        "url": "stomp+activemq://h:61614",
        "tls": {"ca_file": str(ca), "min_version": "1.3"}}})
    broker = adapter("main", settings.brokers["main"], "c")
    assert isinstance(broker, StompBroker)
    tls = broker.options.tls
    assert tls is not None
    assert (tls.ca_file, tls.min_version) == (str(ca), "1.3")
