"""Subscription planning and the ActiveMQ mapping of its names: pure functions."""

from __future__ import annotations

import pytest

from mdb import Distribution, listener
from mdb.errors import ConfigurationError, SubscriptionFailed
from mdb.listeners.listener import ListenerSpec, spec_of
from mdb.messages.destinations import Destination
from mdb.messages.topology import Member, Topology
from mdb.routing.planning import plan
from mdb_stomp import ActiveMQDialect, RabbitMQDialect


def spec(destination: str, **options: object) -> ListenerSpec:
    def on_event(body: bytes) -> None:
        pass

    found = spec_of(listener(destination, **options)(on_event))  # type: ignore[arg-type]
    assert found is not None
    return found


ONE_BROKER = Topology({}, default_broker="main")
PARTITIONED = Topology(
    {Destination.parse("topic:orders"): (
        Member("a", Destination.parse("topic:orders")),
        Member("b", Destination.parse("topic:orders")),
        Member("c", Destination.parse("topic:orders_c")),
    )},
    default_broker="a",
)


@pytest.mark.parametrize(
    ("destination", "options", "name", "shared"),
    [
        ("topic:prices", {}, "shop-on_event", True),
        ("topic:prices", {"distribution": Distribution.ONE_COPY_PER_SERVER},
         "shop-web_1-on_event", False),
        ("topic:prices", {"subscription": "legacy-name"}, "legacy-name", True),
        ("topic:prices", {"subscription": "{app}-v2-{listener}"}, "shop-v2-on_event", True),
        ("topic:prices", {"subscription": "{server}-x",
                          "distribution": Distribution.ONE_COPY_PER_SERVER}, "web_1-x", False),
        ("queue:orders", {}, None, True),
    ],
)
def test_subscription_names(destination: str, options: dict[str, object], name: str | None,
                            shared: bool) -> None:
    (planned,) = plan(spec(destination, **options), ONE_BROKER, app="shop", server="web_1")
    assert planned.request.name == name
    assert planned.shared is shared
    assert planned.broker == "main"
    assert planned.request.destination == Destination.parse(destination)


@pytest.mark.parametrize("distribution", list(Distribution))
def test_a_listener_subscribes_every_member_under_one_name(distribution: Distribution) -> None:
    planned = plan(spec("topic:orders", distribution=distribution), PARTITIONED, app="shop",
                   server="web_1")
    assert [(p.broker, str(p.request.destination)) for p in planned] == [
        ("a", "topic:orders"), ("b", "topic:orders"), ("c", "topic:orders_c")]
    assert len({p.request.name for p in planned}) == 1
    assert all(p.shared is (distribution is Distribution.ONE_COPY_PER_APP) for p in planned)


def test_names_are_stable_and_per_server_names_differ_between_servers() -> None:
    per_server = spec("topic:orders", distribution=Distribution.ONE_COPY_PER_SERVER)
    first = plan(per_server, PARTITIONED, app="shop", server="s1")
    assert first == plan(per_server, PARTITIONED, app="shop", server="s1")
    assert {p.request.name for p in first}.isdisjoint(
        p.request.name for p in plan(per_server, PARTITIONED, app="shop", server="s2"))
    per_app = spec("topic:orders")
    assert plan(per_app, PARTITIONED, app="shop", server="s1") == \
        plan(per_app, PARTITIONED, app="shop", server="s2")


def test_a_per_server_name_without_the_server_is_refused() -> None:
    shared_by_all = spec("topic:orders", subscription="fixed",
                         distribution=Distribution.ONE_COPY_PER_SERVER)
    with pytest.raises(ConfigurationError, match=r"no '\{server\}'.*one-copy-per-server"):
        plan(shared_by_all, PARTITIONED, app="shop", server="s1")


def test_an_unknown_placeholder_is_refused_at_decoration() -> None:
    with pytest.raises(ConfigurationError, match="placeholders"):
        spec("topic:orders", subscription="{host}-x")


def test_a_slot_prefetches_its_prefetch_and_at_least_one_batch() -> None:
    (one,) = plan(spec("queue:q"), ONE_BROKER, app="a", server="s")
    assert one.request.prefetch == 1
    (ahead,) = plan(spec("queue:q", prefetch=4), ONE_BROKER, app="a", server="s")
    assert ahead.request.prefetch == 4
    (batched,) = plan(spec("queue:q", max_messages_per_transaction=50, prefetch=4), ONE_BROKER,
                      app="a", server="s")
    assert batched.request.prefetch == 50
    (both,) = plan(spec("queue:q", max_messages_per_transaction=5, prefetch=20), ONE_BROKER,
                   app="a", server="s")
    assert both.request.prefetch == 20


def test_a_per_app_name_never_equals_a_per_server_name() -> None:
    # Parts contain no '-', so the number of dashes tells the modes apart.
    (per_app,) = plan(spec("topic:t", name="s1_x"), ONE_BROKER, app="a", server="s1")
    (per_server,) = plan(spec("topic:t", name="x", distribution=Distribution.ONE_COPY_PER_SERVER),
                         ONE_BROKER, app="a", server="s1")
    assert per_app.request.name != per_server.request.name


def test_senders_take_turns_over_members_and_a_key_always_picks_the_same_one() -> None:
    orders = Destination.parse("topic:orders")
    firsts = [PARTITIONED.candidates(orders)[0].broker for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    keyed = {PARTITIONED.candidates(orders, key="customer-7")[0] for _ in range(5)}
    assert len(keyed) == 1
    assert len({PARTITIONED.candidates(orders, key=f"k{i}")[0] for i in range(50)}) == 3


def test_a_sender_prefers_its_own_broker_and_tries_brokers_that_are_down_last() -> None:
    orders = Destination.parse("topic:orders")
    assert all(PARTITIONED.candidates(orders, prefer="b")[0].broker == "b" for _ in range(4))
    for _ in range(4):
        order = [m.broker for m in PARTITIONED.candidates(orders, down={"a"})]
        assert order[-1] == "a" and sorted(order) == ["a", "b", "c"]
    keyed = PARTITIONED.candidates(orders, key="customer-7")
    moved = PARTITIONED.candidates(orders, key="customer-7", down={keyed[0].broker})
    assert moved[0] == keyed[1] and moved[-1] == keyed[0]


def test_activemq_maps_a_topic_subscription_to_its_virtual_topic_queue() -> None:
    (planned,) = plan(spec("topic:prices"), ONE_BROKER, app="shop", server="s")
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
    (planned,) = plan(spec("topic:prices"), ONE_BROKER, app="shop", server="s")
    subscribe = RabbitMQDialect().subscribe_spec(planned.request)
    assert subscribe.path == "/topic/prices"
    assert subscribe.headers["x-queue-name"] == "Consumer.shop-on_event.prices"
    assert subscribe.headers["durable"] == "true"
    assert str(subscribe.requeue_destination) == "queue:Consumer.shop-on_event.prices"
    assert "x-queue-type" not in subscribe.headers  # the broker's default: classic


def test_rabbitmq_declares_quorum_subscription_queues_when_asked() -> None:
    (planned,) = plan(spec("topic:prices"), ONE_BROKER, app="shop", server="s")
    subscribe = RabbitMQDialect("quorum").subscribe_spec(planned.request)
    # A quorum queue must be durable and not auto-delete: RabbitMQ refuses it otherwise.
    assert {k: subscribe.headers[k] for k in ("x-queue-type", "durable", "auto-delete")} == {
        "x-queue-type": "quorum", "durable": "true", "auto-delete": "false"}
    (queue,) = plan(spec("queue:orders"), ONE_BROKER, app="shop", server="s")
    subscribe = RabbitMQDialect("quorum").subscribe_spec(queue.request)
    assert subscribe.path == "/queue/orders"
    assert subscribe.headers["x-queue-type"] == "quorum"
