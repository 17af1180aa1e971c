"""The console's durable subscriptions (docs/console.md, "Abandoned subscriptions"): derived
from what the containers reported, abandoned when only containers that no longer answer did,
and their cleanup, refused without the login and for one a running container holds. On real
brokers, with container processes: tests/console/test_subscriptions_console.py."""

from __future__ import annotations

from http import HTTPStatus
from pathlib import Path

import pytest

from mdb.commands.console.poller import Seen
from mdb.commands.console.subscription_pages import Subscriptions, durable_subscriptions
from mdb.config.console_settings import ConsoleSettings
from mdb.config.settings import Settings
from mdb.errors import BrokerError
from mdb.observability.health import Health, ListenerHealth, MemberHealth
from tests.harness.processes.console import Visitor, console
from tests.harness.processes.health import serving

TOKEN = "a-control-token-of-the-fleet"
TOPIC = "topic:prices"


def _reporting(*subscriptions: str) -> Health:
    members = tuple(MemberHealth("default", TOPIC, True, name) for name in subscriptions)
    return Health(live=True, ready=True, listeners=(
        ListenerHealth("on_price", len(members), len(members), 0, 0, destination=TOPIC,
                       mode="one-copy-per-server", member_states=members),
        ListenerHealth("on_order", 1, 1, 0, 0, destination="queue:orders", mode="queue",
                       member_states=(MemberHealth("default", "queue:orders", True),))))


def _fleet() -> list[Seen]:
    return [Seen("http://shop-1", _reporting("shop-s1-on_price")),
            Seen("http://shop-2", _reporting("shop-s2-on_price"), error="refused",
                 down_since=1.0),
            Seen("http://shop-3")]  # never answered: nothing known of it


def test_a_subscription_only_a_container_gone_reported_is_abandoned() -> None:
    found = {s.name: (s.abandoned, s.holders, s.reporters, s.destination, s.listener)
             for s in durable_subscriptions(_fleet())}
    assert found == {  # a queue has no durable subscription
        "shop-s1-on_price": (False, ("http://shop-1",), ("http://shop-1",), TOPIC, "on_price"),
        "shop-s2-on_price": (True, (), ("http://shop-2",), TOPIC, "on_price"),
    }


@pytest.mark.anyio
async def test_the_cleanup_deletes_only_an_abandoned_one_and_forgets_it() -> None:
    deleted: list[tuple[str, str, str]] = []

    async def delete(broker: str, destination: str, name: str) -> None:
        deleted.append((broker, destination, name))

    subscriptions, seen = Subscriptions(delete), _fleet()
    held = await subscriptions.clean_up(seen, "default", TOPIC, "shop-s1-on_price")
    assert held.status == HTTPStatus.CONFLICT and "http://shop-1" in held.body
    unknown = await subscriptions.clean_up(seen, "default", TOPIC, "shop-s9-on_price")
    assert unknown.status == HTTPStatus.NOT_FOUND
    assert deleted == []
    done = await subscriptions.clean_up(seen, "default", TOPIC, "shop-s2-on_price")
    assert done.status == HTTPStatus.OK and "Deleted" in done.body
    assert deleted == [("default", TOPIC, "shop-s2-on_price")]
    assert [s.name for s in subscriptions.of(seen)] == ["shop-s1-on_price"]
    # Its container back, holding it anew: shown again.
    seen[1] = Seen("http://shop-2", _reporting("shop-s2-on_price"))
    assert [s.name for s in subscriptions.of(seen)] == ["shop-s1-on_price", "shop-s2-on_price"]


@pytest.mark.anyio
async def test_a_broker_refusing_the_cleanup_is_shown_with_its_words() -> None:
    async def delete(broker: str, destination: str, name: str) -> None:
        raise BrokerError("ActiveMQ cannot delete queue Consumer.x over STOMP")

    subscriptions, seen = Subscriptions(delete), _fleet()
    refused = await subscriptions.clean_up(seen, "default", TOPIC, "shop-s2-on_price")
    assert refused.status == HTTPStatus.BAD_GATEWAY
    assert "ActiveMQ cannot delete queue Consumer.x over STOMP" in refused.body
    assert [s.name for s in subscriptions.of(seen)] == ["shop-s1-on_price", "shop-s2-on_price"]


async def _no_control(url: str, listener: str, action: str) -> tuple[bool, str]:
    raise AssertionError("no pause or resume here")


def test_the_page_shows_them_and_the_cleanup_needs_the_login(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with serving(_reporting("shop-s1-on_price")) as url:
        settings = Settings(console=ConsoleSettings(containers=[url], port=0, refresh=0.5),
                            control_token_file=token_file)
        with console(settings, _no_control) as base:
            visitor = Visitor(base)
            status, page = visitor.get("/")
            assert status == 200
            assert 'data-name="shop-s1-on_price" data-abandoned="false"' in page
            assert "/subscriptions/delete" not in page  # no form without a login
            fields = [("broker", "default"), ("destination", TOPIC),
                      ("name", "shop-s1-on_price")]
            assert visitor.post("/subscriptions/delete", [("csrf", "guessed"), *fields])[0] == 403
            csrf = visitor.login(TOKEN)
            status, page = visitor.post("/subscriptions/delete", [("csrf", csrf), *fields])
            assert status == 409 and "not deleted" in page
