"""A careless operator's inputs, and a hostile producer's headers, that need no broker
(docs/security.md): a password in a URL holding '/', '?', '#' or '@'; a body file or a password
file without end; selectors nested or negated beyond any reasonable depth, numbers of
thousands of digits, in a selector, a header it reads, or a delivery count."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mdb.config.broker_settings import MAX_SECRET_BYTES, BrokerSettings
from mdb.errors import ConfigurationError
from mdb.messages.destinations import Destination
from mdb.messages.identity import PROCESS, identity, to_message
from mdb.messages.message import MAX_BODY_BYTES, MAX_COUNT
from mdb.messages.selector import MAX_DEPTH, SelectorError, compile_selector
from mdb.observability.redaction import mask_secrets, redact_url
from mdb.routing.links import adapter
from mdb.seam.broker import ConnectionOptions, Delivery
from mdb_stomp import StompBroker
from tests.harness.processes.cli import mdb, one_line
from tests.harness.servers.process import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]

LISTENERS = (
    "from mdb import listener\n\n"
    "@listener('topic:inputs_prices')\n"
    "async def on_price(body: bytes) -> None:\n"
    "    pass\n"
)


# -- a password that holds URL delimiters -----------------------------------------------------

PASSWORDS = ["ab+/cd==", "12/cd", "p?x", "p#x", "p@x", "a/b?c#d@e", "s3cr3t@"]


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("host", ["mq:61613", "mq:6161x", "[::1]:61613/vhost", ""])
def test_a_url_never_shows_its_password_whatever_it_holds(password: str, host: str) -> None:
    url = f"stomp+rabbitmq://bob:{password}@{host}"
    for shown in (redact_url(url), redact_url(f"bob:{password}@{host}"),
                  mask_secrets(f"connecting to {url} failed")):
        assert password not in shown and "bob:***@" in shown


@pytest.mark.parametrize("password", ["ab+/cd==", "12/cd", "p?x", "p#x"])
@pytest.mark.parametrize("scheme", ["stomp+activemq", "stomp+rabbitmq"])
def test_an_unencoded_delimiter_in_a_url_password_is_refused_saying_how_to_write_it(
        password: str, scheme: str, tmp_path: Path) -> None:
    (tmp_path / "inputs_listeners.py").write_text(LISTENERS)
    url = f"{scheme}://bob:{password}@mq:61613"
    result = mdb("subscriptions", "inputs_listeners", cwd=tmp_path,
                 env={"MDB_BROKERS__DEFAULT__URL": url})
    assert result.returncode == 2
    shown = (result.stdout + result.stderr).decode()
    assert password not in shown
    line = one_line(result.stderr)
    assert "brokers.default.url" in line and "%2F" in line and "password_file" in line
    # The adapter refuses it too when given the URL past the settings (mdb.testing, the seam).
    with pytest.raises(ConfigurationError) as refused:
        StompBroker(ConnectionOptions(url=url))
    assert password not in str(refused.value) and "%2F" in str(refused.value)


def test_a_percent_encoded_url_password_reaches_the_broker_whole() -> None:
    url = "stomp+rabbitmq://bob:ab+%2Fcd%3F%23%40==@mq:61613/tenant"
    broker = adapter("main", BrokerSettings(url=url), "c")
    assert isinstance(broker, StompBroker)
    assert (broker.username, broker.password, broker.vhost) == ("bob", "ab+/cd?#@==", "tenant")
    assert redact_url(url) == "stomp+rabbitmq://bob:***@mq:61613/tenant"


# -- files without end ------------------------------------------------------------------------

def test_mdb_send_refuses_a_body_file_past_its_bound_in_one_line(tmp_path: Path) -> None:
    large = tmp_path / "large.bin"
    with large.open("wb") as sparse:
        sparse.truncate(MAX_BODY_BYTES + 1)
    for source, stdin in ((str(large), None), ("/dev/zero", None),
                          ("-", b"x" * (MAX_BODY_BYTES + 1))):
        result = mdb("send", "queue:inputs", "--file", source, cwd=tmp_path, stdin=stdin)
        assert result.returncode == 2
        assert one_line(result.stderr) == (
            f"mdb: configuration error: mdb send --file {source}: more than 64 MiB, the "
            "largest body mdb send sends")


@pytest.mark.rabbitmq
def test_a_body_file_at_its_bound_is_sent(tmp_path: Path, rabbitmq: BrokerProcess) -> None:
    # RabbitMQ: the test harness's ActiveMQ has too small a heap for a 64 MiB message.
    exact = tmp_path / "exact.bin"
    with exact.open("wb") as sparse:
        sparse.truncate(MAX_BODY_BYTES)
    result = mdb("send", "queue:inputs", "--file", str(exact), cwd=tmp_path,
                 env={"MDB_BROKERS__DEFAULT__URL": str(rabbitmq.url)})
    assert result.returncode == 0, result.stderr


def test_a_password_file_must_be_a_small_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes it: reading it blocking would wait for ever
    large = tmp_path / "large"
    large.write_text("x" * (MAX_SECRET_BYTES + 1))
    for path, why in ((fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file"),
                      (tmp_path, "not a regular file"), (large, "too large")):
        with pytest.raises(ValueError, match=why):
            BrokerSettings(password_file=path)
    exact = tmp_path / "exact"
    exact.write_text("p" * (MAX_SECRET_BYTES - 1) + "\n")
    assert BrokerSettings(password_file=exact).password is not None


def test_a_fifo_password_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "inputs_listeners.py").write_text(LISTENERS)
    os.mkfifo(tmp_path / "secret")
    result = mdb("subscriptions", "inputs_listeners", cwd=tmp_path,
                 env={"MDB_BROKERS__DEFAULT__PASSWORD_FILE": str(tmp_path / "secret")})
    assert result.returncode == 2
    assert "brokers.default.password_file" in result.stderr.decode()
    assert "not a regular file" in one_line(result.stderr)


# -- selectors and numbers ----------------------------------------------------------------------

def test_a_selector_nested_too_deep_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "inputs_listeners.py").write_text(LISTENERS)
    nested = "(" * 200 + "a = 1" + ")" * 200
    result = mdb("subscriptions", "inputs_listeners", cwd=tmp_path,
                 env={"MDB_LISTENERS__ON_PRICE__SELECTOR": nested})
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "listener 'on_price': selector" in line and f"more than {MAX_DEPTH} deep" in line


def test_selectors_within_the_depth_and_any_number_of_nots_work() -> None:
    deepest = "(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH
    assert compile_selector(deepest)({"a": "1"}) is True
    with pytest.raises(SelectorError, match="deep"):
        compile_selector("(" + deepest + ")")
    chained = "a = 1"
    for _ in range(MAX_DEPTH):
        chained = f"b = 2 OR NOT ({chained})"
    assert compile_selector(chained)({"a": "1", "b": "2"}) is True
    assert compile_selector("NOT " * 5000 + "a = 1")({"a": "1"}) is True
    assert compile_selector("NOT " * 5001 + "a = 1")({"a": "1"}) is False
    assert compile_selector("NOT " * 5001 + "a = 1")({}) is False  # unknown stays unknown


def test_numbers_of_any_length_compare_exactly() -> None:
    small, large = "1" * 5000, "1" * 4999 + "2"
    assert compile_selector(f"a < {large}")({"a": small}) is True
    assert compile_selector(f"a = {small}")({"a": large}) is False
    assert compile_selector(f"a = {small}")({"a": small}) is True
    assert compile_selector(f"{small} < {large}")({}) is True
    assert compile_selector("a = 0.1")({"a": "0.10"}) is True
    assert compile_selector("a > 9007199254740992")({"a": "9007199254740993"}) is True
    assert compile_selector("a = 7E3")({"a": "7000"}) is True
    assert compile_selector("a < 1e400")({"a": "1e399"}) is True


@pytest.mark.parametrize("value", [
    "9" * 100_000, "1e999999999999999999999", "-1e-999999999999999999999", "nan", "inf",
    "Infinity", "1_000", "(" * 10_000, "NOT " * 10_000, "\x00",
])
def test_any_header_value_is_evaluated_without_error(value: str) -> None:
    for selector in ("a > 5", "a = 5", "a <> 'x'", "a", "a IS NULL", "NOT a < 5"):
        assert compile_selector(selector)({"a": value}) in (True, False)


@pytest.mark.parametrize(("text", "count"), [
    ("9" * 5000, MAX_COUNT), (str(MAX_COUNT), MAX_COUNT),
    (str(MAX_COUNT + 1), MAX_COUNT), ("0" * 5000 + "7", 7),
    ("-" + "9" * 5000, 1), ("1e3", 1),
])
def test_a_delivery_count_of_any_length_is_capped_not_reset(text: str, count: int) -> None:
    queue = Destination.parse("queue:q")
    forged = Delivery(queue, b"", {"mdb_delivery_count": text}, "ID:1", False, None)
    received = to_message(forged, queue, identity(forged, PROCESS, assigned=True))
    assert received.delivery_count == count
