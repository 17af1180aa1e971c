"""Settings: every source, and every bad setting named with what would be valid."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr

from mdb.config.settings import Settings, load_settings
from mdb.errors import ConfigurationError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mdb.toml"
    path.write_text(text)
    return path


def test_defaults_use_the_embedded_broker(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert [b.url for b in settings.brokers.values()] == ["memory://"]
    assert settings.server


def test_environment_beats_the_file_and_arguments_beat_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    config = write(tmp_path, """
app = "shop"
server = "file"
[brokers.main]
url = "stomp+activemq://broker:61613"
password = "s3cret"
[listeners.on_order]
pool = 4
""")
    monkeypatch.setenv("MDB_LISTENERS__ON_ORDER__POOL", "8")
    monkeypatch.setenv("MDB_SERVER", "env")
    settings = load_settings(config, server="argument")
    assert settings.app == "shop"
    assert settings.server == "argument"
    assert settings.listeners["on_order"].model_dump(exclude_unset=True) == {"pool": 8}
    assert settings.brokers["main"].password is not None
    assert "s3cret" not in repr(settings)


def test_dotenv_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("MDB_APP=from_dotenv\n")
    assert load_settings().app == "from_dotenv"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('app = "has-dash"', r"setting app: .*letters, digits"),
        ('[brokers.main]\nurl = "localhost"', r"setting brokers\.main\.url: .*memory://"),
        ('[brokers.main]\nurll = "memory://"', r"setting brokers\.main\.urll: .*unknown setting"),
        ('[brokers.main]\nheartbeat_ms = -1', r"setting brokers\.main\.heartbeat_ms"),
        ('[destinations."orders"]\nbroker = "default"', r"setting destinations.*queue:NAME"),
        ('[destinations."queue:orders"]\nbroker = "nowhere"',
         r"destinations\.queue:orders\.broker: 'nowhere' is not a broker; valid: default"),
        ("shutdown_grace_period = 'soon'", r"setting shutdown_grace_period"),
        ("app = ", r"settings could not be read"),
        ('[brokers.main]\nurl = []', r"setting brokers\.main\.url: .*list of addresses is empty"),
        ('[brokers.main]\nurl = ["memory://a", 5]',
         r"setting brokers\.main\.url: .*address \[1\] is not a string"),
        ('[brokers.main]\nurl = ["memory://a", "b"]',
         r"setting brokers\.main\.url: .*address \[1\] must look like 'memory://'"),
        ('[brokers.main]\nurl = ["stomp+activemq://h:1", "stomp+rabbitmq://h:2"]',
         r"setting brokers\.main\.url: .*mix schemes \(stomp\+activemq, stomp\+rabbitmq\)"),
        ('[brokers.main]\nurl = 5', r"setting brokers\.main\.url: .*a URL or a list of URLs"),
        ('[brokers.main]\nfailover_cycles = 0', r"setting brokers\.main\.failover_cycles"),
    ],
)
def test_a_bad_setting_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             toml: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match=message):
        load_settings(write(tmp_path, toml))


def test_the_config_file_may_be_named_by_a_str(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, 'app = "shop"\n')
    assert load_settings("mdb.toml").app == "shop"
    with pytest.raises(ConfigurationError, match=r"absent\.toml: no such file"):
        load_settings("absent.toml")


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such file"):
        load_settings(tmp_path / "absent.toml")


def test_a_bad_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MDB_SHUTDOWN_GRACE_PERIOD", "-5")
    with pytest.raises(ConfigurationError, match="setting shutdown_grace_period"):
        load_settings()


def test_a_broker_is_one_url_or_a_list_of_them_in_the_file_and_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    config = write(tmp_path, """
[brokers.one]
url = "stomp+activemq://h1:61613"
[brokers.pair]
url = ["stomp+activemq://h1:61613", "stomp+activemq://h2:61613"]
failover_retries = 2
""")
    brokers = load_settings(config).brokers
    assert brokers["one"].addresses == ("stomp+activemq://h1:61613",)
    assert brokers["pair"].addresses == ("stomp+activemq://h1:61613", "stomp+activemq://h2:61613")
    assert brokers["pair"].failover_retries == 2
    monkeypatch.setenv("MDB_BROKERS__ONE__URL", '["memory://a", "memory://b"]')
    monkeypatch.setenv("MDB_BROKERS__PAIR__URL", "memory://c")
    brokers = load_settings(config).brokers
    assert brokers["one"].addresses == ("memory://a", "memory://b")
    assert brokers["pair"].addresses == ("memory://c",)


def test_the_default_server_name_is_the_host_name_made_valid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A StatefulSet's pod is named <set>-<ordinal>, and its host name with it.
    monkeypatch.delenv("MDB_SERVER", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "orders-1.orders.shop.svc")
    assert load_settings().server == "orders_1"


@pytest.mark.parametrize(("group", "url"), [("brokers", "stomp+activemq://broker:61613"),
                                            ("databases", "postgresql+asyncpg://db:5432/shop")])
def test_a_password_from_a_stronger_source_replaces_a_weaker_ones_password_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, group: str, url: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret").write_text("from-file\n")
    from_file = write(tmp_path, f"[{group}.main]\nurl = '{url}'\npassword_file = 'secret'\n")
    monkeypatch.setenv(f"MDB_{group.upper()}__MAIN__PASSWORD", "from-env")
    main = getattr(load_settings(from_file), group)["main"]
    assert (main.password.get_secret_value(), main.password_file) == ("from-env", None)

    given = write(tmp_path, f"[{group}.main]\nurl = '{url}'\npassword = 'in-toml'\n")
    monkeypatch.delenv(f"MDB_{group.upper()}__MAIN__PASSWORD")
    monkeypatch.setenv(f"MDB_{group.upper()}__MAIN__PASSWORD_FILE", "secret")
    main = getattr(load_settings(given), group)["main"]
    assert main.password.get_secret_value() == "from-file"

    both = write(tmp_path, f"[{group}.main]\nurl = '{url}'\npassword = 'in-toml'\n"
                           "password_file = 'secret'\n")
    monkeypatch.delenv(f"MDB_{group.upper()}__MAIN__PASSWORD_FILE")
    with pytest.raises(ConfigurationError, match="either password or password_file, not both"):
        load_settings(both)  # one source giving both is ambiguous


def test_an_empty_environment_variable_unsets_what_the_file_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret").write_text("from-file\n")
    config = write(tmp_path, """
health_port = 8081
[databases.main]
url = "postgresql+asyncpg://db:5432/shop"
password_file = "secret"
[listeners.on_order]
selector = "region = 'eu'"
pool = 4
""")
    for name in ("MDB_HEALTH_PORT", "MDB_DATABASES__MAIN__PASSWORD_FILE",
                 "MDB_LISTENERS__ON_ORDER__SELECTOR"):
        monkeypatch.setenv(name, "")
    settings = load_settings(config)
    assert settings.health_port is None
    assert (settings.databases["main"].password, settings.databases["main"].password_file) == (
        None, None)
    # No selector override: the code's selector applies.
    assert settings.listeners["on_order"].model_dump(exclude_none=True) == {"pool": 4}


def test_an_empty_environment_variable_for_a_setting_that_needs_a_value_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MDB_SHUTDOWN_GRACE_PERIOD", "")
    with pytest.raises(ConfigurationError, match=r"setting shutdown_grace_period: empty, and it "
                                                 r"needs a value: give one, or leave the "
                                                 r"variable out"):
        load_settings()


def secret_from_its_file(tmp_path: Path, setting: str, file: str, short: str,
                         secret_of: Callable[[Settings], SecretStr | None]) -> Settings:
    """The settings with ``setting`` naming ``file``, once the secret ``secret_of`` gives was
    read from it and kept out of ``repr``; without ``setting`` there is none, and ``short`` in
    the file is refused as fewer than 16 bytes."""
    (tmp_path / file).write_text("0123456789abcdef0123\n")
    settings = load_settings(write(tmp_path, f"{setting} = '{file}'\n"))
    secret = secret_of(settings)
    assert secret is not None
    assert secret.get_secret_value() == "0123456789abcdef0123"
    assert "0123456789" not in repr(settings)
    assert secret_of(load_settings(write(tmp_path, ""))) is None
    (tmp_path / file).write_text(f"{short}\n")
    with pytest.raises(ConfigurationError, match=rf"setting {setting}: .*fewer than "
                                                 r"the 16 bytes"):
        load_settings(write(tmp_path, f"{setting} = '{file}'\n"))
    return settings


def test_the_identity_secret_is_read_from_its_file_and_a_guessable_one_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """docs/security.md, "The identity secret"."""
    monkeypatch.chdir(tmp_path)
    settings = secret_from_its_file(tmp_path, "identity_secret_file", "identity", "guessable",
                                    lambda s: s.identity_secret)
    assert settings.model_copy(update={"app": "other"}).identity_secret == settings.identity_secret


def test_the_control_token_is_read_from_its_file_and_a_bad_one_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """docs/security.md, "The control token"."""
    monkeypatch.chdir(tmp_path)
    secret_from_its_file(tmp_path, "control_token_file", "token", "short",
                         lambda s: s.control_token)
    with pytest.raises(ConfigurationError, match=r"setting control_token_file: .*missing"):
        load_settings(write(tmp_path, "control_token_file = 'missing'\n"))
