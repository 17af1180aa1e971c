"""One path to a broker: adapters from settings, the brokers of a process, member failover, and
the plan ``mdb subscriptions`` prints. No broker is reached: failover runs on fake sends."""

from __future__ import annotations

import anyio
import pytest

from mdb import listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import DestinationSettings, MemberSettings, Settings
from mdb.container.report import plan_table
from mdb.errors import ConfigurationError, ConnectionFailed, ConnectionLost, CredentialsRefused
from mdb.listeners.events import BrokerEvent, EventKind, Events
from mdb.messages.destinations import Destination
from mdb.messages.headers import PROOF
from mdb.messages.identity import PROOF_SIZE, room_for_the_proof
from mdb.messages.topology import Member
from mdb.routing.brokers import MAX_CONNECTIONS, Brokers, Skipped, connections_for
from mdb.routing.links import adapter, adapters, backed_off, round_failed, round_order
from mdb.routing.planning import plan_listeners, slots_per_broker
from mdb.seam.registry import system_of
from mdb_memory import MemoryBroker
from mdb_stomp import StompBroker
from mdb_stomp.protocol.limits import HEADER_LIMITS
from tests.harness.apps.in_process import specs

ORDERS = Destination.parse("queue:orders")


def _settings(**brokers: BrokerSettings) -> Settings:
    return Settings(
        app="shop", server="s1", brokers=brokers,
        destinations={"queue:orders": DestinationSettings(
            members=[MemberSettings(broker=name) for name in brokers])})


def _quick(url: str, wait: float = 0.0) -> BrokerSettings:
    return BrokerSettings(url=url, reconnect_delay=0.01, reconnect_max_delay=0.04,
                          send_wait_for_reconnect=wait)


def test_a_brokers_messaging_system_is_the_last_part_of_its_scheme() -> None:
    assert system_of("memory://x") == "memory"
    assert system_of("stomp+activemq://h:1") == "activemq"
    assert system_of("stomp+rabbitmq://u:p@h:1/vhost") == "rabbitmq"


def test_what_a_process_sends_keeps_to_the_header_limits_of_every_adapter_of_its_brokers(
) -> None:
    """A STOMP broker writes ``:`` in a value as two bytes; the embedded broker does not. What
    a message's own headers keep to leaves room for its proof (``mdb.messages.identity``)."""
    assert Brokers(_settings(a=_quick("memory://x"))).header_limits \
        == room_for_the_proof(MemoryBroker.header_limits)
    stomp = Brokers(_settings(a=_quick("stomp+activemq://h:1"), b=_quick("stomp+rabbitmq://h:2")))
    assert stomp.header_limits == room_for_the_proof(HEADER_LIMITS)
    mixed = Brokers(_settings(a=_quick("memory://x"), b=_quick("stomp+activemq://h:1")))
    assert mixed.header_limits.size("k", "a:b") == HEADER_LIMITS.size("k", "a:b") == 6
    assert MemoryBroker.header_limits.size("k", "a:b") == 5
    proof = HEADER_LIMITS.size(PROOF, "0" * PROOF_SIZE)
    assert (mixed.header_limits.count, mixed.header_limits.line, mixed.header_limits.total) \
        == (511, 8_192, 262_144 - proof)
    with pytest.raises(ConfigurationError, match="no adapter for scheme"):
        _ = Brokers(_settings(a=_quick("nosuch://h:1"))).header_limits


def test_queue_type_is_a_rabbitmq_setting_refused_elsewhere() -> None:
    quorum = BrokerSettings(url=["stomp+rabbitmq://h:1", "stomp+rabbitmq://h:2"],
                            queue_type="quorum")
    assert isinstance(adapter("b", quorum, "c"), StompBroker)
    for url, why in (("stomp+activemq://h:1", "ActiveMQ has no queue types"),
                     ("memory://x", "the memory broker has one kind of queue")):
        with pytest.raises(ConfigurationError, match=f"setting brokers.b.queue_type: .*{why}"):
            adapter("b", BrokerSettings(url=url, queue_type="classic"), "c")
    with pytest.raises(ConfigurationError, match="no adapter for scheme 'kafka'"):
        adapter("b", BrokerSettings(url="kafka://h:1"), "c")


def test_every_address_of_a_broker_is_checked_by_its_adapter() -> None:
    pair = BrokerSettings(url=["stomp+activemq://u:secret@h1:61613", "stomp+activemq://h2"])
    with pytest.raises(ConfigurationError, match=r"setting brokers\.b\.url "
                                                 r"\(stomp\+activemq://h2\): the port is required"):
        adapters("b", pair, "c")
    assert len(adapters("b", BrokerSettings(url=["memory://x", "memory://y"]), "c")) == 2


def test_a_round_tries_each_address_its_retries_in_a_row_from_the_active_one() -> None:
    once = BrokerSettings()
    assert round_order(1, 0, once) == [0]  # one address: one attempt per round, as before
    assert round_order(3, 0, once) == [0, 1, 2]
    assert round_order(3, 1, once) == [1, 2, 0]
    qpid = BrokerSettings(failover_retries=1, failover_cycles=2)
    assert round_order(2, 1, qpid) == [1, 1, 0, 0, 1, 1, 0, 0]


def test_a_failed_round_raises_the_credentials_error_only_when_every_address_refused_it(
) -> None:
    alone = ConnectionFailed("broker main (h1:61613): could not connect")
    assert round_failed("main", {0: alone}) is alone  # one address: its own error, as before
    login = {0: CredentialsRefused("broker main (h1:61613) refused the credentials"),
             1: CredentialsRefused("broker main (h2:61613) refused the credentials")}
    refused = round_failed("main", login)
    assert isinstance(refused, CredentialsRefused)
    assert str(refused) == ("broker main answered on none of its 2 addresses: broker main "
                            "(h1:61613) refused the credentials; broker main (h2:61613) "
                            "refused the credentials")
    mixed = round_failed("main", {**login, 1: alone})
    assert type(mixed) is ConnectionFailed  # one node misconfigured; the other may come back


def test_connections_per_broker_one_per_four_slots_at_most_eight() -> None:
    assert [connections_for(n) for n in (1, 4, 5, 16, 100)] == [1, 1, 2, 4, MAX_CONNECTIONS]


def test_backoff_doubles_up_to_the_maximum() -> None:
    settings = BrokerSettings(reconnect_delay=1, reconnect_max_delay=3)
    assert [backed_off(d, settings) for d in (0.5, 1, 2)] == [1, 2, 3]


def test_a_failed_broker_is_skipped_for_longer_each_time_until_it_succeeds() -> None:
    settings = BrokerSettings(reconnect_delay=1, reconnect_max_delay=3)
    skipped = Skipped()
    skipped.failed("a", settings, now=100)
    assert skipped.at(100.5) == {"a"} and skipped.at(101) == set()
    skipped.failed("a", settings, now=101)
    assert skipped.at(102.9) == {"a"} and skipped.at(103) == set()
    skipped.failed("a", settings, now=103)
    assert skipped.at(105.9) == {"a"}  # at most reconnect_max_delay
    skipped.succeeded("a")
    assert skipped.at(103) == set()
    skipped.failed("a", settings, now=200)
    assert skipped.at(200.5) == {"a"} and skipped.at(201) == set()  # from the start again


@pytest.mark.anyio
async def test_failover_tries_the_next_member_and_then_skips_the_failed_broker() -> None:
    brokers = Brokers(_settings(a=_quick("memory://a"), b=_quick("memory://b")))
    tried: list[str] = []

    async def attempt(member: Member) -> None:
        tried.append(member.broker)
        if member.broker == "a":
            raise ConnectionFailed("a is down")

    assert (await brokers.failover(ORDERS, attempt, prefer="a")).broker == "b"
    assert tried == ["a", "b"]
    tried.clear()
    assert (await brokers.failover(ORDERS, attempt, prefer="a")).broker == "b"
    assert tried == ["b"]  # a is skipped while its reconnect delay runs


@pytest.mark.anyio
async def test_failover_waits_for_a_member_to_come_back_then_gives_up() -> None:
    brokers = Brokers(_settings(a=_quick("memory://a", wait=5)))
    failures = [ConnectionFailed("refused"), ConnectionLost("dropped")]

    async def recovering(member: Member) -> None:
        if failures:
            raise failures.pop(0)

    with anyio.fail_after(5):
        assert (await brokers.failover(ORDERS, recovering)).broker == "a"
    impatient = Brokers(_settings(a=_quick("memory://a", wait=0)))

    async def down(member: Member) -> None:
        raise ConnectionLost("dropped")

    with pytest.raises(ConnectionLost):
        await impatient.failover(ORDERS, down)


def test_watched_brokers_report_events_and_the_others_do_not() -> None:
    seen: list[BrokerEvent] = []
    brokers = Brokers(_settings(a=_quick("memory://a"), b=_quick("memory://b")),
                      Events([seen.append]))
    brokers.watch("a")
    brokers.status("a").down("gone")
    brokers.status("b").down("gone")
    assert [(e.kind, e.broker) for e in seen] == [(EventKind.CONNECTION_LOST, "a")]
    assert [s.name for s in brokers.watched()] == ["a"]


def test_apply_retires_the_connections_of_a_moved_broker_and_watches_new_ones() -> None:
    settings = _settings(a=_quick("memory://a"), b=_quick("memory://b"))
    brokers = Brokers(settings)
    brokers.apply(settings, brokers.prepare(settings, {"a": 5, "b": 1}, "c", lambda _: []))
    assert {name: len(links) for name, links in brokers.pools.items()} == {"a": 2, "b": 1}
    moved = _settings(a=_quick("memory://a"), b=_quick("memory://elsewhere"))
    pools = brokers.prepare(moved, {"a": 1, "b": 1}, "c", lambda _: [])
    assert list(pools) == ["b"]  # a is unchanged and connected already
    retired = brokers.apply(moved, pools)
    assert [link.settings.url for link in retired] == ["memory://b"]
    assert brokers.pools["b"][0].settings.url == "memory://elsewhere"
    assert brokers.status("b") is brokers.pools["b"][0].status
    assert brokers.broker_states() == [("a", "memory", False), ("b", "memory", False)]


def test_the_plan_is_printed_from_the_planner_with_the_connections_a_container_opens() -> None:
    @listener("queue:orders", pool=6)
    async def on_order(body: bytes) -> None:
        pass

    settings = _settings(a=_quick("memory://a"), b=_quick("memory://b"))
    plans = plan_listeners(settings, specs(on_order))
    assert slots_per_broker((s, p) for s, planned in plans for p in planned) == {"a": 6, "b": 6}
    lines = plan_table(settings, plans).splitlines()
    assert lines[0].split() == ["listener", "destination", "member", "subscription", "kind",
                                "pool", "broker"]
    assert lines[1].endswith("a (memory://a, 2 connections)")
    assert lines[2].endswith("b (memory://b, 2 connections)")
    standby = _settings(a=BrokerSettings(url=["stomp+activemq://u:secret@h1:61613",
                                              "stomp+activemq://u:secret@h2:61613"]))
    lines = plan_table(standby, plan_listeners(standby, specs(on_order))).splitlines()
    assert lines[1].endswith("a (stomp+activemq://u:***@h1:61613 | "
                             "stomp+activemq://u:***@h2:61613, 2 connections)")
    with pytest.raises(ConfigurationError, match="no such listener; listeners are: on_order"):
        plan_listeners(settings.model_copy(update={"listeners": {"nope": {}}}), specs(on_order))


def test_a_round_that_fails_after_another_link_connected_is_not_a_new_outage() -> None:
    """A round that began while the broker was starting again fails after another link of the
    broker connected: the restored broker is not reported lost again (seen once in five runs of
    the one-line-per-outage test)."""
    seen: list[BrokerEvent] = []
    brokers = Brokers(_settings(a=_quick("memory://a")), Events([seen.append]))
    status = brokers.watch("a")
    status.up(0)
    status.down("gone")
    began = status.connections  # a link's round begins
    status.up(0)  # another link connects
    status.round_failed("could not connect", began)
    again = status.connections  # a round that begins once the broker is up and fails
    status.round_failed("could not connect", again)
    assert [e.kind for e in seen] == [EventKind.CONNECTION_LOST, EventKind.CONNECTION_RESTORED,
                                      EventKind.CONNECTION_LOST]
