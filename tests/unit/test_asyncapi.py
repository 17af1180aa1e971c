"""``mdb asyncapi``: the listeners' AsyncAPI 3.0 document, valid against the published AsyncAPI
3.0.0 JSON Schema (tests/asyncapi/asyncapi-3.0.0.json, from @asyncapi/specs; see the README
there), with the payload schemas, modes and error destinations of the listeners."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mdb.commands.asyncapi import document
from mdb.config.settings import load_settings
from mdb.container.wiring import find_listeners, import_modules

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests" / "asyncapi" / "asyncapi-3.0.0.json").read_text())

APP = '''
from pydantic import BaseModel

from mdb import listener


class Line(BaseModel):
    sku: str
    quantity: int


class Basket(BaseModel):
    """A customer's basket."""

    id: str
    lines: list[Line]


@listener("queue:baskets", pool=3, error_destination="queue:baskets.failed")
async def on_basket(basket: Basket) -> None:
    """Price a basket.

    More words that are not the summary."""


@listener("topic:prices", distribution="one-copy-per-server", selector="region = 'eu'")
async def on_price(lines: list[Line]) -> None:
    pass


@listener("topic:prices", name="audit_prices")
def audit(text: str) -> None:
    pass


@listener("queue:raw")
async def on_raw(body: bytes) -> None:
    pass
'''


def valid(doc: dict[str, Any]) -> dict[str, Any]:
    jsonschema.Draft7Validator(SCHEMA).validate(doc)
    return doc


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "contract_app.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MDB_SERVER", raising=False)
    return tmp_path


def test_the_document_of_a_module_is_valid_asyncapi_3(app: Path) -> None:
    (app / "mdb.toml").write_text('app = "shop"\nserver = "s1"\n'
                                  '[brokers.main]\nurl = "stomp+activemq://mdb:pw@mq:61613"\n')
    doc = valid(document(load_settings(app / "mdb.toml"),
                         find_listeners(import_modules(["contract_app"]))))
    assert doc["asyncapi"] == "3.0.0" and doc["info"]["title"] == "shop"
    assert doc["servers"] == {"main": {"host": "mq:61613", "protocol": "stomp", "title": "main",
                                       "x-mdb-broker": "activemq"}}  # no credentials
    channels, operations = doc["channels"], doc["operations"]

    basket = operations["on_basket"]
    assert basket["action"] == "receive" and basket["summary"] == "Price a basket."
    assert basket["channel"] == {"$ref": "#/channels/queue_baskets"}
    assert basket["x-mdb-pool"] == 3 and basket["x-mdb-error-destination"] == (
        "queue:baskets.failed")
    assert channels["queue_baskets"]["address"] == "baskets"
    message = channels["queue_baskets"]["messages"]["on_basket"]
    assert message["contentType"] == "application/json"
    assert message["payload"] == {"$ref": "#/components/schemas/Basket"}
    schemas = doc["components"]["schemas"]
    assert schemas["Basket"]["properties"]["lines"]["items"] == {
        "$ref": "#/components/schemas/Line"}
    assert schemas["Line"]["required"] == ["sku", "quantity"]

    # The error destination: mdb sends there, with the failure in headers.
    failed = operations["on_basket.error_destination"]
    assert failed["action"] == "send"
    assert failed["channel"] == {"$ref": "#/channels/queue_baskets.failed"}
    assert "mdb_error_type" in channels["queue_baskets.failed"]["messages"][
        "on_basket.failed"]["headers"]["properties"]

    # Two listeners on one topic: one channel, a message each, their modes and subscriptions.
    prices = channels["topic_prices"]
    assert set(prices["messages"]) == {"on_price", "audit_prices"}
    assert prices["messages"]["on_price"]["payload"] == {
        "type": "array", "items": {"$ref": "#/components/schemas/Line"}}
    assert prices["messages"]["audit_prices"]["contentType"].startswith("text/plain")
    assert operations["on_price"]["x-mdb-distribution"] == "one-copy-per-server"
    assert operations["on_price"]["x-mdb-subscriptions"] == ["shop-s1-on_price"]
    assert operations["on_price"]["x-mdb-selector"] == "region = 'eu'"
    assert operations["audit_prices"]["x-mdb-distribution"] == "one-copy-per-app"
    assert channels["queue_raw"]["messages"]["on_raw"]["payload"] == {
        "type": "string", "format": "binary"}


ONCE_APP = '''
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Context, listener


@listener("queue:payments", exactly_once="main")
async def on_payment(payment_id: str, ctx: Context, session: AsyncSession) -> None:
    await ctx.send("queue:receipts", payment_id)
'''


def test_an_exactly_once_listener_says_so_and_how_its_sends_go(app: Path) -> None:
    (app / "once_app.py").write_text(ONCE_APP)
    (app / "mdb.toml").write_text('[databases.main]\nurl = "sqlite+aiosqlite:///app.db"\n')
    doc = valid(document(load_settings(app / "mdb.toml"),
                         find_listeners(import_modules(["once_app", "contract_app"]))))
    channels, operations = doc["channels"], doc["operations"]
    payment = operations["on_payment"]
    assert payment["x-mdb-exactly-once"] == "main"
    assert "outbox" in payment["description"] and "mdb_id" in payment["description"]
    assert "x-mdb-exactly-once" not in operations["on_basket"]
    # A sender may repeat a message with its mdb_id: the listener runs it once.
    message = channels["queue_payments"]["messages"]["on_payment"]
    assert "mdb_id" in message["headers"]["properties"]
    assert "headers" not in channels["queue_baskets"]["messages"]["on_basket"]
    # A send of its handler that the broker refuses goes to its error destination too.
    failed = channels["queue_payments.DLQ"]["messages"]
    assert set(failed) == {"on_payment.failed", "on_payment.refused_send"}
    refused = failed["on_payment.refused_send"]["headers"]["properties"]
    assert {"mdb_original_destination", "mdb_error_type"} <= set(refused)
    assert len(operations["on_payment.error_destination"]["messages"]) == 2


def test_a_partitioned_topic_lists_its_members_and_their_brokers() -> None:
    settings = load_settings(ROOT / "examples" / "orders" / "partitioned.toml")
    doc = valid(document(settings, find_listeners(import_modules(["examples.orders.listeners"]))))
    events = doc["channels"]["topic_order_events"]
    assert len(events["x-mdb-members"]) == 3
    assert len(events["servers"]) == len(doc["servers"]) == 3


def test_the_schema_refuses_a_broken_document(app: Path) -> None:
    # The check can fail: an operation that names no channel is not AsyncAPI.
    doc = document(load_settings(), find_listeners(import_modules(["contract_app"])))
    del doc["operations"]["on_raw"]["channel"]
    with pytest.raises(jsonschema.ValidationError):
        valid(doc)


def test_mdb_asyncapi_writes_the_document(app: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mdb.commands.cli", "asyncapi", "contract_app", "--output",
         "api.json",
         "--api-version", "2.1.0"], cwd=app, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = valid(json.loads((app / "api.json").read_text()))
    assert doc["info"]["version"] == "2.1.0"
    assert doc["servers"]["default"]["protocol"] == "memory"
