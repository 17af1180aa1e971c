"""A Java consumer selects what mdb sends: by mdb's content type, through ``mdb_content_type``
(STOMP's ``content-type`` is no JMS identifier), and by a user's header (docs/interop.md)."""

from __future__ import annotations

import pytest

from mdb import Producer
from tests.harness.apps.in_process import settings_for, unique
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.traffic.java import JmsTool

pytestmark = [pytest.mark.anyio, pytest.mark.activemq]

JavaBroker = tuple[ActiveMQ, JmsTool]


async def test_a_java_selector_reaches_mdbs_content_type(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("typed")
    async with Producer(settings_for(broker.url)) as producer:
        await producer.send(f"queue:{queue}", "plain words")
        await producer.send(f"queue:{queue}", {"id": 7})
    [json] = java.receive(queue, 1, selector="mdb_content_type = 'application/json'")
    [rest] = java.receive(queue, 1)  # the selector left the other one alone
    assert (json["kind"], json["text"], json["properties"]["mdb_content_type"]) == (
        "text", '{"id":7}', "application/json")
    assert (rest["text"], rest["properties"]["mdb_content_type"]) == (
        "plain words", "text/plain; charset=utf-8")


async def test_a_java_selector_reaches_a_user_header(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("regions")
    async with Producer(settings_for(broker.url)) as producer:
        await producer.send(f"queue:{queue}", "for the US", {"region": "us"})
        await producer.send(f"queue:{queue}", "for Europe", {"region": "eu"})
    [seen] = java.receive(queue, 1, selector="region = 'eu'")
    assert seen["text"] == "for Europe"
