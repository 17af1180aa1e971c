"""A careless operator's inputs, and a hostile producer's headers, that need no broker
(docs/security.md): a password in a URL holding '/', '?', '#' or '@'; selectors nested or
negated beyond any reasonable depth, numbers of thousands of digits, in a selector, a header
it reads, or a delivery count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mdb.broker import ConnectionOptions, Delivery
from mdb.broker_settings import BrokerSettings
from mdb.delivery.decision import MAX_DELIVERY_COUNT, to_message
from mdb.destinations import Destination
from mdb.errors import ConfigurationError
from mdb.links import adapter
from mdb.redaction import mask_secrets, redact_url
from mdb.selector import MAX_DEPTH, SelectorError, compile_selector
from mdb_stomp import StompBroker

ROOT = Path(__file__).resolve().parents[2]

LISTENERS = (
    "from mdb import listener\n\n"
    "@listener('topic:inputs_prices')\n"
    "async def on_price(body: bytes) -> None:\n"
    "    pass\n"
)


def mdb(*args: str, cwd: Path, env: dict[str, str] | None = None,
        stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "mdb.cli", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, input=stdin,
                          capture_output=True, timeout=120)


def one_line(stderr: bytes) -> str:
    lines = stderr.decode().strip().splitlines()
    assert "Traceback" not in stderr.decode()
    return lines[-1]


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
    ("9" * 5000, MAX_DELIVERY_COUNT), (str(MAX_DELIVERY_COUNT), MAX_DELIVERY_COUNT),
    (str(MAX_DELIVERY_COUNT + 1), MAX_DELIVERY_COUNT), ("0" * 5000 + "7", 7),
    ("-" + "9" * 5000, 1), ("1e3", 1),
])
def test_a_delivery_count_of_any_length_is_capped_not_reset(text: str, count: int) -> None:
    queue = Destination.parse("queue:q")
    received = to_message(Delivery(queue, b"", {"mdb_delivery_count": text}, "ID:1", False, None),
                          queue)
    assert received.delivery_count == count
