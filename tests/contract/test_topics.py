"""Topics: subscriptions named by app, server and listener; redelivery stays in one subscription."""

from __future__ import annotations

import pytest

from mdb import Context, Destination, Distribution, Producer, Redelivery, listener
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.traffic.messages import send_all

pytestmark = pytest.mark.anyio


async def test_one_copy_per_app_shares_and_one_copy_per_server_copies(broker_url: str) -> None:
    topic = f"topic:{unique('prices')}"
    calls = Calls()

    @listener(topic, pool=2)
    async def per_app(body: str, ctx: Context) -> None:
        calls.add("app", body)

    @listener(topic, distribution=Distribution.ONE_COPY_PER_SERVER)
    async def per_server(body: str, ctx: Context) -> None:
        calls.add("server", body)

    app = unique("app")
    async with (
        running(settings_for(broker_url, app=app, server="s1"), per_app, per_server),
        running(settings_for(broker_url, app=app, server="s2"), per_app, per_server),
    ):
        await send_all(broker_url, topic, [f"p{n}" for n in range(10)])
        await calls.wait(lambda c: len(c.of("app")) >= 10 and len(c.of("server")) >= 20)
    assert sorted(calls.of("app")) == sorted(f"p{n}" for n in range(10))  # type: ignore[type-var]
    assert sorted(calls.of("server")) == sorted(f"p{n}" for n in range(10) for _ in "12")  # type: ignore[type-var]


async def test_two_apps_each_get_their_copy(broker_url: str) -> None:
    topic = f"topic:{unique('news')}"
    calls = Calls()

    @listener(topic)
    async def reader(body: str, ctx: Context) -> None:
        calls.add(ctx.listener, body)

    async with (
        running(settings_for(broker_url, app=unique("a")), reader),
        running(settings_for(broker_url, app=unique("b")), reader),
    ):
        await send_all(broker_url, topic, ["n1", "n2"])
        await calls.wait(lambda c: len(c.of("reader")) >= 4)
    assert sorted(calls.of("reader")) == ["n1", "n1", "n2", "n2"]  # type: ignore[type-var]


async def test_a_redelivery_goes_only_to_the_failing_subscription(broker_url: str) -> None:
    topic = f"topic:{unique('events')}"
    calls = Calls()

    @listener(topic, redelivery=Redelivery(limit=2, delay=0))
    async def flaky(body: str, ctx: Context) -> None:
        calls.add("flaky", (ctx.delivery_count, ctx.destination))
        if ctx.delivery_count == 1:
            raise RuntimeError("first delivery fails")

    @listener(topic)
    async def steady(body: str, ctx: Context) -> None:
        calls.add("steady", ctx.delivery_count)

    async with running(settings_for(broker_url), flaky, steady):
        await send_all(broker_url, topic, ["e1"])
        await calls.wait(lambda c: len(c.of("flaky")) >= 2 and len(c.of("steady")) >= 1)
        await send_all(broker_url, topic, ["e2"])  # steady sees e2 next, not a copy of e1
        await calls.wait(lambda c: len(c.of("steady")) >= 2)
    dest = Destination.parse(topic)
    assert calls.of("flaky")[:2] == [(1, dest), (2, dest)]
    assert calls.of("steady") == [1, 1]


async def test_a_durable_subscription_keeps_messages_while_no_process_runs(
    broker_url: str,
) -> None:
    topic = f"topic:{unique('orders')}"
    calls = Calls()

    @listener(topic)
    async def keeper(body: str) -> None:
        calls.add("kept", body)

    settings = settings_for(broker_url)
    async with running(settings, keeper):
        pass  # creates the durable subscription, then stops
    await send_all(broker_url, topic, ["while away"])
    async with running(settings, keeper):
        await calls.wait(lambda c: bool(c.of("kept")))
    assert calls.of("kept") == ["while away"]


async def test_durable_subscription_deletion_deletes_the_servers_subscription_on_stop(
    broker_url: str,
) -> None:
    topic = f"topic:{unique('quotes')}"
    calls = Calls()

    @listener(topic, distribution=Distribution.ONE_COPY_PER_SERVER,
              durable_subscription_deletion=True)
    async def quotes(body: str) -> None:
        calls.add("seen", body)

    settings = settings_for(broker_url)
    async with running(settings, quotes):
        pass  # creates the subscription, then stops and deletes it
    await send_all(broker_url, topic, ["while away"])  # kept by no subscription
    async with running(settings, quotes):
        await send_all(broker_url, topic, ["fresh"])
        await calls.wait(lambda c: "fresh" in c.of("seen"))
    if broker_url.startswith("stomp+activemq:"):
        # No STOMP frame deletes an ActiveMQ queue: the deletion fails (logged) and the
        # subscription kept the message, as a durable one does.
        assert calls.of("seen") == ["while away", "fresh"]
    else:
        assert calls.of("seen") == ["fresh"]


async def test_a_selector_filters_a_topic_subscription(broker_url: str) -> None:
    # The container evaluates a topic listener's selector on every broker (ActiveMQ would keep
    # what does not match in the subscription's queue, RabbitMQ ignores selectors) and settles
    # what does not match without running the handler.
    topic = f"topic:{unique('paint')}"
    calls = Calls()

    @listener(topic, selector="colour = 'red'")
    async def reds(body: str, ctx: Context) -> None:
        calls.add("red", body)

    async with running(settings_for(broker_url), reds), Producer(settings_for(broker_url)) as p:
        for body, colour in [("b1", "blue"), ("r1", "red"), ("b2", "blue"), ("r2", "red")]:
            await p.send(topic, body, {"colour": colour})
        await calls.wait(lambda c: "r2" in c.of("red"))
    assert calls.of("red") == ["r1", "r2"]  # in order: a blue one would have come before r2
