"""The fault tests' checker, on hand-made ledgers (no broker)."""

from __future__ import annotations

from tests.faults.tools.random_faults import in_flight_at, known_loss
from tests.harness.traffic.ledger import PER_APP, PER_SERVER, Verdict, check, check_sent_on, views


def done(message_id: str, redelivered: bool, server: str = "s1") -> dict[str, object]:
    return {"event": "done", "id": message_id, "redelivered": redelivered, "count": 1,
            "pid": 1, "app": "shop", "server": server}


def test_every_told_message_processed_once_is_ok() -> None:
    verdict = check(["a", "b"], [done("a", False), done("b", False)])
    assert verdict.ok and verdict.processed == 2 and verdict.repeats == 0


def test_a_told_message_never_processed_is_lost() -> None:
    verdict = check(["a", "b"], [done("a", False)])
    assert verdict.lost == ["b"] and not verdict.ok


def test_a_repeat_must_be_flagged() -> None:
    flagged = check(["a"], [done("a", False), done("a", True), done("a", True)])
    assert flagged.ok and flagged.flagged == 2 and not flagged.unflagged
    unflagged = check(["a"], [done("a", False), done("a", True), done("a", False)])
    assert unflagged.unflagged == ["a"] and unflagged.flagged == 1 and not unflagged.ok


def test_a_message_whose_send_raised_may_be_processed() -> None:
    verdict = check(["a"], [done("a", False), done("x", False),
                            {"event": "start", "id": "y", "redelivered": False}])
    assert verdict.ok and verdict.unconfirmed == 1 and verdict.deliveries == 2


def test_views_are_per_app_or_per_server() -> None:
    entries = [done("a", False, "s1"), done("a", False, "s2")]
    assert set(views(entries, PER_APP)) == {"shop"}
    assert set(views(entries, PER_SERVER)) == {"shop/s1", "shop/s2"}
    assert not check(["a"], views(entries, PER_APP)["shop"]).ok  # two unflagged in one app


def test_a_delivery_processed_unflagged_after_a_flagged_one_is_an_unflagged_repeat() -> None:
    def at(entry: dict[str, object], started: float) -> dict[str, object]:
        return {**entry, "started": started}

    # A stale frame processed as fresh after the broker redelivered it, flagged, elsewhere.
    stale = check(["a"], [at(done("a", True, "s2"), 1.0), at(done("a", False), 2.0)])
    assert stale.unflagged == ["a"] and stale.flagged == 0 and not stale.ok
    in_order = check(["a"], [at(done("a", True, "s2"), 2.0), at(done("a", False), 1.0)])
    assert in_order.ok and in_order.flagged == 1


def sent_on(message_id: str, source: str, started: float, redelivered: bool = False,
            maybe_repeat: bool = False) -> dict[str, object]:
    return {**done(message_id, redelivered), "source": source, "started": started,
            "maybe_repeat": maybe_repeat}


def test_a_second_stage_owes_what_the_first_processed_once_or_flagged_under_one_id() -> None:
    first = [done("a", False), done("b", False), done("b", True)]
    # b processed twice: its send made again (maybe_repeat) came before the first send, which
    # the broker then gave again (redelivered).
    second = [sent_on("A", "a", 1.0), sent_on("B", "b", 2.0, maybe_repeat=True),
              sent_on("B", "b", 3.0), sent_on("B", "b", 4.0, redelivered=True)]
    verdict = check_sent_on(first, second)
    assert verdict.ok and verdict.told == 2 and verdict.flagged == 2, verdict


def test_a_second_stage_repeat_unflagged_lost_or_under_another_id_fails() -> None:
    first = [done("a", False), done("b", False), done("c", False)]
    verdict = check_sent_on(first, [sent_on("A", "a", 1.0), sent_on("A", "a", 2.0),
                                    sent_on("B", "b", 1.0),
                                    sent_on("X", "b", 2.0, maybe_repeat=True)])
    assert verdict.unflagged == ["a"] and verdict.lost == ["c"] and verdict.renamed == ["b"]


def start(message_id: str, started: float, redelivered: bool = False) -> dict[str, object]:
    return {"event": "start", "id": message_id, "redelivered": redelivered, "count": 1,
            "started": started}


def test_only_a_loss_in_flight_at_a_node_kill_is_rabbitmqs_known_loss() -> None:
    seen = [start("a", 10.0), start("b", 20.1), start("c", 30.0), start("d", 20.2),
            start("d", 25.0, redelivered=True)]
    in_flight = in_flight_at(seen, [20.0])
    assert in_flight == {"b"}  # "d" was delivered again: not lost by the kill
    lost = Verdict(told=3, processed=2, deliveries=2, lost=["b"])
    assert known_loss({"shop stage 2": lost}, {}, ["drain: not everything processed"],
                      in_flight)
    elsewhere = Verdict(told=3, processed=2, deliveries=2, lost=["b", "c"])
    assert not known_loss({"shop stage 2": elsewhere}, {}, [], in_flight)
    never_handled = Verdict(told=3, processed=2, deliveries=2, lost=["x"])
    assert not known_loss({"shop": never_handled}, {}, [], in_flight)
    unflagged = Verdict(told=3, processed=3, deliveries=4, unflagged=["a"])
    assert not known_loss({"shop stage 2": lost, "shop": unflagged}, {}, [], in_flight)
    assert not known_loss({"shop stage 2": lost}, {"q": ["z"]}, [], in_flight)
    assert not known_loss({"shop stage 2": lost}, {}, ["node-kill: not consumed again"],
                          in_flight)
