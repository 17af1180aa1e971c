"""Subscription planning and the ActiveMQ mapping of its names: pure functions."""

from __future__ import annotations

import pytest

from mdb import Distribution, listener
from mdb.destinations import Destination
from mdb.errors import SubscriptionFailed
from mdb.listener import ListenerSpec, spec_of
from mdb.planning import plan
from mdb_stomp.dialect import ActiveMQDialect, RabbitMQDialect


def spec(destination: str, **options: object) -> ListenerSpec:
    def on_event(body: bytes) -> None:
        pass

    found = spec_of(listener(destination, **options)(on_event))  # type: ignore[arg-type]
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("destination", "options", "name", "shared"),
    [
        ("topic:prices", {}, "shop-on_event", True),
        ("topic:prices", {"distribution": Distribution.ONE_COPY_PER_SERVER},
         "shop-web_1-on_event", False),
        ("topic:prices", {"subscription": "legacy-name"}, "legacy-name", True),
        ("queue:orders", {}, None, True),
    ],
)
def test_subscription_names(destination: str, options: dict[str, object], name: str | None,
                            shared: bool) -> None:
    planned = plan(spec(destination, **options), app="shop", server="web_1", broker="main")
    assert planned.request.name == name
    assert planned.shared is shared
    assert planned.broker == "main"
    assert planned.request.destination == Destination.parse(destination)


def test_a_slot_prefetches_one_batch() -> None:
    assert plan(spec("queue:q"), app="a", server="s", broker="b").request.prefetch == 1
    batched = spec("queue:q", max_messages_per_transaction=50)
    assert plan(batched, app="a", server="s", broker="b").request.prefetch == 50


def test_a_per_app_name_never_equals_a_per_server_name() -> None:
    # Parts contain no '-', so the number of dashes tells the modes apart.
    per_app = plan(spec("topic:t", name="s1_x"), app="a", server="s1", broker="b")
    per_server = plan(spec("topic:t", name="x",
                           distribution=Distribution.ONE_COPY_PER_SERVER),
                      app="a", server="s1", broker="b")
    assert per_app.request.name != per_server.request.name


def test_activemq_maps_a_topic_subscription_to_its_virtual_topic_queue() -> None:
    planned = plan(spec("topic:prices"), app="shop", server="s", broker="b")
    subscribe = ActiveMQDialect().subscribe_spec(planned.request)
    assert subscribe.path == "/queue/Consumer.shop-on_event.VirtualTopic.prices"
    assert ActiveMQDialect().send_path(Destination.parse("topic:prices")) == \
        "/topic/VirtualTopic.prices"


@pytest.mark.parametrize("dialect", [ActiveMQDialect(), RabbitMQDialect()])
def test_a_name_that_is_not_one_segment_is_refused(
    dialect: ActiveMQDialect | RabbitMQDialect,
) -> None:
    with pytest.raises(SubscriptionFailed, match="one segment"):
        dialect.subscription_queue(Destination.parse("topic:t"), "a.b")


def test_rabbitmq_maps_a_topic_subscription_to_a_named_durable_queue() -> None:
    planned = plan(spec("topic:prices"), app="shop", server="s", broker="b")
    subscribe = RabbitMQDialect().subscribe_spec(planned.request)
    assert subscribe.path == "/topic/prices"
    assert subscribe.headers["x-queue-name"] == "Consumer.shop-on_event.prices"
    assert subscribe.headers["durable"] == "true"
    assert str(subscribe.requeue_destination) == "queue:Consumer.shop-on_event.prices"
