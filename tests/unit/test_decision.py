"""The delivery decision and the batch fall-back plan: pure functions, no loop, no broker."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from pydantic import BaseModel, ValidationError

from mdb.delivery.batch import BatchFailure, Ready, Step, fall_back, ready_run
from mdb.delivery.decision import (
    ACK_LOST,
    ALREADY_PROCESSED,
    FILTER,
    FRESH,
    IN_DOUBT,
    MAX_STRIKES,
    NOT_SELECTED,
    SETTLE,
    SETTLE_REPEAT,
    STRUCK,
    AttemptSeen,
    DeadLetter,
    InDoubt,
    Keep,
    MoveToError,
    NotSelected,
    Policy,
    Raised,
    Redeliver,
    Settle,
    Stuck,
    Succeeded,
    Undecodable,
    Unreadable,
    classify,
    decide,
)
from mdb.delivery.strikes import History, Strikes, supersedes
from mdb.errors import AcksUnconfirmed, BrokerError, DecodeError
from mdb.listeners.options import Redelivery
from mdb.messages.copies import ERROR_TEXT_LIMIT, error_text
from mdb.messages.destinations import Destination
from mdb.messages.identity import PROCESS, identity, to_message
from mdb.messages.message import MAX_COUNT, Message, OutgoingMessage
from mdb.seam.broker import Delivery, Problem, ProblemKind
from mdb_memory import MemoryBroker

ORDERS = Destination.parse("queue:orders")
REQUEUE = Destination.parse("queue:Consumer.app.orders")
ERRORS = Destination.parse("queue:orders.DLQ")
POLICY = Policy("on_order", Redelivery(limit=2, delay=1.0, backoff=2.0, max_delay=3.0),
                REQUEUE, ERRORS, MemoryBroker.header_limits)
BROKER_HEADERS = frozenset({"message-id", "subscription", "ack"})


def message_of(d: Delivery) -> Message:
    """``d`` as the handler sees it, known by its identity (``mdb.messages.identity``)."""
    return to_message(d, ORDERS, identity(d, PROCESS, assigned=True))

def message(count: int = 1, **headers: str) -> Message:
    return Message(id="m-1", destination=ORDERS, body=b"{}", headers=headers,
                   redelivered=count > 1, delivery_count=count)


def delivery(headers: Mapping[str, str], *, redelivered: bool = False,
             body: bytes = b"{}") -> Delivery:
    return Delivery(ORDERS, body, headers, "ID:broker-1", redelivered, None)


def test_a_success_is_settled_and_a_message_not_selected_filtered() -> None:
    assert decide(message(3), Succeeded(), POLICY) is SETTLE
    assert decide(message(3), NotSelected(), POLICY) is FILTER


def test_a_failed_handler_is_redelivered_to_the_requeue_destination_with_the_count_raised(
) -> None:
    failure = Raised("ValueError", "no")
    outcome = decide(message(1), failure, POLICY)
    assert outcome == Redeliver(1.0, 2, REQUEUE, {
        "mdb_id": "m-1", "mdb_delivery_count": "2", "mdb_redelivery_of": "queue:orders"},
        failure)


@pytest.mark.parametrize(("count", "delay"), [(1, 1.0), (2, 2.0)])
def test_the_delay_grows_by_the_backoff(count: int, delay: float) -> None:
    outcome = decide(message(count), Raised("ValueError", "no"), POLICY)
    assert isinstance(outcome, Redeliver)
    assert (outcome.delay, outcome.delivery_count) == (delay, count + 1)


def test_the_delay_stops_at_max_delay() -> None:
    policy = Policy("l", Redelivery(limit=10, delay=1.0, backoff=2.0, max_delay=3.0),
                    REQUEUE, ERRORS, MemoryBroker.header_limits)
    outcomes = [decide(message(n), Raised("E", ""), policy) for n in (1, 2, 3, 4)]
    assert [o.delay for o in outcomes if isinstance(o, Redeliver)] == [1.0, 2.0, 3.0, 3.0]


def test_delivery_limit_plus_one_is_the_last() -> None:
    assert isinstance(decide(message(2), Raised("E", ""), POLICY), Redeliver)  # count == limit
    assert isinstance(decide(message(3), Raised("E", ""), POLICY), MoveToError)


def test_a_limit_of_zero_moves_the_first_failure() -> None:
    policy = Policy("l", Redelivery(limit=0), REQUEUE, ERRORS, MemoryBroker.header_limits)
    assert isinstance(decide(message(1), Raised("E", ""), policy), MoveToError)
    assert isinstance(decide(message(1), InDoubt(), policy), MoveToError)


def test_past_the_limit_the_copy_carries_the_failure() -> None:
    failure = Raised("ValueError", "bad order")
    outcome = decide(message(3, region="eu", mdb_redelivery_of="queue:orders"), failure,
                     POLICY)
    assert outcome == MoveToError(ERRORS, {
        "region": "eu", "mdb_id": "m-1", "mdb_delivery_count": "3",
        "mdb_error_type": "ValueError", "mdb_error_message": "bad order",
        "mdb_error_listener": "on_order", "mdb_original_destination": "queue:orders"},
        failure)


def test_the_error_text_is_cut_at_the_limit() -> None:
    outcome = decide(message(1), Undecodable("x" * (ERROR_TEXT_LIMIT + 10)), POLICY)
    assert isinstance(outcome, MoveToError)
    assert outcome.headers["mdb_error_message"] == "x" * ERROR_TEXT_LIMIT


def test_a_delivery_in_doubt_is_redelivered_at_once_and_past_the_limit_says_so() -> None:
    assert decide(message(1), InDoubt(), POLICY) == Redeliver(0.0, 2, REQUEUE, {
        "mdb_id": "m-1", "mdb_delivery_count": "2", "mdb_redelivery_of": "queue:orders"},
        InDoubt())
    moved = decide(message(3), InDoubt(), POLICY)
    assert isinstance(moved, MoveToError)
    assert moved.headers["mdb_error_type"] == "mdb.InDoubt"
    assert "outcome is unknown" in moved.headers["mdb_error_message"]


# -- stuck: settling fails outside the handler ---------------------------------------------------

def test_a_stuck_message_moves_to_the_error_destination_whatever_its_count_says() -> None:
    moved = decide(message(1), Stuck(MAX_STRIKES, dead_letter=True), POLICY)
    assert isinstance(moved, MoveToError)
    assert moved.headers["mdb_error_type"] == "mdb.Stuck"
    assert f"failed {MAX_STRIKES} times outside the handler" in moved.headers["mdb_error_message"]


def test_past_that_it_goes_to_the_brokers_dead_letter_queue_where_the_broker_keeps_it() -> None:
    stuck = Stuck(MAX_STRIKES + 1, dead_letter=True)
    assert decide(message(9), stuck, POLICY) == DeadLetter(stuck)


def test_else_it_is_kept_unchanged_on_its_queue_after_growing_pauses() -> None:
    received = message(3, region="eu", mdb_redelivery_of="queue:orders")
    outcomes = [decide(received, Stuck(MAX_STRIKES + n, dead_letter=False), POLICY)
                for n in (1, 2, 3)]
    assert outcomes[0] == Keep(1.0, REQUEUE, {"region": "eu", "mdb_id": "m-1",
                                              "mdb_delivery_count": "3",
                                              "mdb_redelivery_of": "queue:orders"},
                               Stuck(MAX_STRIKES + 1, dead_letter=False))
    assert [o.delay for o in outcomes if isinstance(o, Keep)] == [1.0, 2.0, 3.0]  # max_delay 3


def test_a_kept_message_never_goes_round_faster_than_once_a_second() -> None:
    eager = Redelivery(delay=0, max_delay=0)
    assert [eager.keep_delay(n) for n in (1, 2, 10**9)] == [1.0, 1.0, 1.0]
    assert Redelivery(delay=2, max_delay=60).keep_delay(10**9) == 60.0


def test_strikes_are_counted_per_message_in_a_bounded_table() -> None:
    strikes = Strikes(capacity=2)
    assert [strikes.strike("a"), strikes.strike("a"), strikes.count("b")] == [1, 2, 0]
    strikes.strike("b")
    strikes.strike("a")  # "b" is now the least recently struck
    strikes.strike("c")
    assert (len(strikes), strikes.count("a"), strikes.count("b")) == (2, 3, 0)


def test_keeps_are_counted_per_message_apart_from_its_strikes() -> None:
    """The first keep of a message is its first round (its WARNING), however many strikes two
    copies of it in two slots gave it first."""
    strikes = Strikes(capacity=2)
    for _ in range(MAX_STRIKES + 2):
        strikes.strike("a")
    assert [strikes.kept("a"), strikes.kept("a"), strikes.kept("b")] == [1, 2, 1]
    strikes.kept("c")
    assert strikes.kept("a") == 1  # forgotten, the least recently kept of three


def test_coming_back_strikes_only_a_delivery_the_broker_confirmed_moved() -> None:
    strikes = Strikes()
    # In doubt after a lost connection: innocent.
    assert strikes.redelivered("m", 2) == History(0, False)
    strikes.moved("m", 2)
    assert strikes.redelivered("m", 3) == History(0, False)  # a later delivery (a copy), lost
    assert strikes.redelivered("m", 2) == History(1, False)  # the moved delivery: the broker lied
    assert strikes.redelivered("m", 2) == History(1, False)  # once per confirmed move
    assert len(strikes) == 1


def test_a_delivery_whose_copies_were_stored_not_its_ack_is_known_when_it_comes_back() -> None:
    strikes = Strikes(capacity=2)
    strikes.copied("m", 1)
    assert strikes.redelivered("m", 2) == History(0, False)  # its retry copy, lost: processed
    assert strikes.redelivered("m", 1) == History(0, True)  # the very delivery: acked unseen
    assert strikes.redelivered("m", 1) == History(0, True)  # again, should that ack be lost in turn
    assert len(strikes) == 0  # never struck
    strikes.copied("a", 1)
    strikes.copied("b", 1)  # "m" is forgotten: bounded as the strikes are
    assert strikes.redelivered("m", 1) == History(0, False)


def test_a_delivery_back_after_its_ack_was_lost_is_settled_unseen_whatever_else_it_is(
) -> None:
    damaged = Problem(ProblemKind.DAMAGED, "cut at a NUL")
    flagged = Delivery(ORDERS, b"", {}, "1", True, None, problem=damaged)
    assert classify(flagged, selected=False, strikes=MAX_STRIKES, copied=True) is ACK_LOST
    assert classify(delivery({}), selected=True, strikes=0, copied=True) is FRESH  # unflagged
    assert decide(message(9), ACK_LOST, POLICY) == Settle(ack_lost=True)


def test_the_rounds_of_a_message_tell_a_second_copy_of_one_round_from_the_first() -> None:
    """Two copies of one round (a retry copy stored while its settlement failed, and the one
    made again when its delivery came back in doubt): the later is told from the first."""
    strikes = Strikes(capacity=2)
    assert (strikes.attempts, strikes.attempt_seen("m", 2)) == (False, AttemptSeen.NEW)
    strikes.handed("m", 2)
    assert strikes.attempt_seen("m", 2) is AttemptSeen.HANDED  # the first copy is with the handler
    assert strikes.attempt_seen("m", 1) is AttemptSeen.DONE  # an earlier round, overtaken
    assert strikes.attempt_seen("m", 3) is AttemptSeen.NEW
    strikes.superseded("m", 3)  # not the round handed: changes nothing
    assert strikes.attempt_seen("m", 2) is AttemptSeen.HANDED
    strikes.superseded("m", 2)
    assert strikes.attempt_seen("m", 2) is AttemptSeen.DONE  # its settlement carried the message on
    strikes.handed("a", 2)
    strikes.handed("b", 2)  # "m" is forgotten: bounded as the strikes are
    assert strikes.attempt_seen("m", 2) is AttemptSeen.NEW
    assert len(strikes) == 0  # never struck


def test_a_second_copy_of_a_round_is_in_doubt_or_settled_unseen_whatever_else_it_is() -> None:
    damaged = Problem(ProblemKind.DAMAGED, "cut at a NUL")
    flagged = Delivery(ORDERS, b"", {}, "1", True, None, problem=damaged)
    plain = delivery({})
    assert classify(flagged, selected=False, strikes=MAX_STRIKES,
                    seen=AttemptSeen.DONE) is ALREADY_PROCESSED
    assert classify(flagged, selected=False, strikes=MAX_STRIKES, copied=True,
                    seen=AttemptSeen.DONE) is ACK_LOST
    assert classify(plain, selected=True, strikes=0, seen=AttemptSeen.HANDED) is IN_DOUBT
    assert classify(plain, selected=True, strikes=1, seen=AttemptSeen.HANDED) is IN_DOUBT
    assert classify(plain, selected=True, strikes=MAX_STRIKES,
                    seen=AttemptSeen.HANDED) == Stuck(MAX_STRIKES, False)
    assert classify(plain, selected=True, strikes=0, seen=AttemptSeen.NEW) is FRESH
    assert decide(message(2), ALREADY_PROCESSED, POLICY) == SETTLE_REPEAT


def test_every_copy_but_a_kept_one_carries_its_message_on() -> None:
    redelivered = decide(message(1), Raised("E", ""), POLICY)
    moved = decide(message(3), Raised("E", ""), POLICY)
    kept = decide(message(1), Stuck(MAX_STRIKES + 1, dead_letter=False), POLICY)
    assert (type(redelivered), type(moved), type(kept)) == (Redeliver, MoveToError, Keep)
    assert [supersedes(o) for o in (SETTLE, redelivered, moved, kept)] == [
        True, True, True, False]


def test_an_undecodable_body_moves_at_once() -> None:
    outcome = decide(message(1), Undecodable("not JSON"), POLICY)
    assert isinstance(outcome, MoveToError)
    assert outcome.headers["mdb_error_type"] == "mdb.DecodeError"
    assert outcome.headers["mdb_delivery_count"] == "1"


def test_protocol_headers_stay_off_the_copy_and_the_applications_stay_on() -> None:
    received = message(1, **{"message-id": "ID:1", "subscription": "s-1", "ack": "a-1",
                             "traceparent": "00-abc", "region": "eu", "mdb_id": "m-1"})
    outcome = decide(received, Raised("E", ""), POLICY, BROKER_HEADERS)
    assert isinstance(outcome, Redeliver)
    assert outcome.headers == {"traceparent": "00-abc", "region": "eu", "mdb_id": "m-1",
                               "mdb_delivery_count": "2", "mdb_redelivery_of": "queue:orders"}
    kept_all = decide(received, Raised("E", ""), POLICY)
    assert kept_all.headers["message-id"] == "ID:1"  # no protocol headers named: all kept


def test_a_failure_names_its_exception_type() -> None:
    assert Raised.of(ValueError("v")) == Raised("ValueError", "v")
    assert Raised.of(DecodeError("d")) == Raised("mdb.errors.DecodeError", "d")


def test_a_delivery_becomes_the_message_the_handler_sees() -> None:
    first = message_of(delivery(PROCESS.sealed(OutgoingMessage(b"{}", {"mdb_id": "m-9"})).headers))
    assert (first.id, first.delivery_count, first.redelivered) == ("m-9", 1, False)
    again = message_of(delivery({"mdb_delivery_count": "3"}))
    assert (again.id, again.delivery_count, again.redelivered) == ("ID:broker-1", 3, True)
    flagged = message_of(delivery({"mdb_delivery_count": "junk"}, redelivered=True))
    assert (flagged.delivery_count, flagged.redelivered) == (1, True)
    assert message_of(delivery({"mdb_delivery_count": "0"})).delivery_count == 1


def test_a_run_ends_at_the_first_delivery_in_doubt_not_selected_struck_or_undecodable(
) -> None:
    def decode(body: bytes) -> bytes:
        if body == b"bad":
            raise DecodeError("bad")
        return body

    def step(d: Delivery, strikes: int = 0) -> Step:
        return Step(d, message_of(d),
                    classify(d, selected="skip" not in d.headers, strikes=strikes))

    good = [step(delivery({"mdb_id": str(n)})) for n in range(3)]
    for stop in (step(delivery({}, redelivered=True)), step(delivery({"skip": "1"})),
                 step(delivery({}, body=b"bad")), step(delivery({}), strikes=1)):
        run = ready_run([*good[:2], stop, good[2]], decode)
        assert [r.delivery for r in run] == [s.delivery for s in good[:2]]
        assert [r.message.id for r in run] == [s.message.id for s in good[:2]]


def test_a_delivery_is_classified_once_stuck_first_then_unreadable_unselected_in_doubt(
) -> None:
    damaged = Problem(ProblemKind.DAMAGED, "cut at a NUL")
    flagged = Delivery(ORDERS, b"", {}, "1", True, None, problem=damaged)
    assert classify(flagged, selected=False, strikes=MAX_STRIKES,
                    dead_letters=lambda d: d is flagged) == Stuck(MAX_STRIKES, True)
    assert classify(flagged, selected=False, strikes=0) == Unreadable(damaged)
    plain = delivery({})
    assert classify(plain, selected=False, strikes=1) is NOT_SELECTED
    assert classify(delivery({}, redelivered=True), selected=True, strikes=0) is IN_DOUBT
    assert classify(plain, selected=True, strikes=MAX_STRIKES - 1) is STRUCK
    assert classify(plain, selected=True, strikes=0) is FRESH


def test_an_unreadable_message_moves_at_once_as_its_problem_says() -> None:
    for kind in ProblemKind:
        failure = Unreadable(Problem(kind, "why"))
        outcome = decide(message(1), failure, POLICY)
        assert outcome == MoveToError(ERRORS, {
            "mdb_id": "m-1", "mdb_delivery_count": "1", "mdb_error_type": kind.value,
            "mdb_error_message": "why", "mdb_error_listener": "on_order",
            "mdb_original_destination": "queue:orders"}, failure)


def test_after_a_failure_a_batch_falls_back_to_one_message_at_a_time() -> None:
    run = [Ready(delivery({"mdb_id": str(n)}), message(1), b"{}") for n in range(4)]
    failure = Raised("ValueError", "third")
    steps = fall_back(run, BatchFailure(2, failure))
    assert [s.delivery for s in steps] == [r.delivery for r in run]
    assert [(s.message.delivery_count, s.message.redelivered, s.kind) for s in steps] == [
        (2, True, FRESH), (2, True, FRESH), (1, False, failure), (1, False, FRESH)]


def test_after_a_held_send_failed_the_whole_batch_runs_again_flagged() -> None:
    run = [Ready(delivery({}), message(1), b"{}") for _ in range(2)]
    steps = fall_back(run, BatchFailure(2, Raised("mdb.errors.ConnectionLost", "down")))
    assert steps == [Step(r.delivery, message(2), FRESH) for r in run]


# -- the delivery count is untrusted input: any producer can write its header -------------------

GENEROUS = Policy("l", Redelivery(limit=10_000, delay=1.0, backoff=2.0, max_delay=60.0),
                  REQUEUE, ERRORS, MemoryBroker.header_limits)


@pytest.mark.parametrize("text", [
    "1030", "99999", str(10**30), "9" * 5000, "-5", "0", "abc", "3.5", "1e3", " 7 ", "",
    "\x00", "inf", "nan", "7\n",
])
def test_any_delivery_count_header_gives_a_bounded_count_and_a_capped_delay(text: str) -> None:
    received = message_of(delivery({"mdb_delivery_count": text}))
    assert 1 <= received.delivery_count <= MAX_COUNT
    outcome = decide(received, Raised("E", "boom"), GENEROUS)
    if isinstance(outcome, Redeliver):
        assert 0.0 <= outcome.delay <= 60.0
        assert int(outcome.headers["mdb_delivery_count"]) == received.delivery_count + 1
    else:
        assert int(outcome.headers["mdb_delivery_count"]) == received.delivery_count


@pytest.mark.parametrize(("text", "count"), [
    (" 7 ", 7), ("7\n", 7), ("-5", 1), ("3.5", 1), ("abc", 1), (str(10**30), MAX_COUNT),
])
def test_a_count_header_is_read_as_a_whole_number_clamped_to_its_range(text: str,
                                                                        count: int) -> None:
    assert message_of(delivery({"mdb_delivery_count": text})).delivery_count == count


def test_the_backoff_arithmetic_never_overflows_and_stops_at_max_delay() -> None:
    steep = Redelivery(limit=10_000, delay=1.0, backoff=10.0, max_delay=60.0)
    assert [steep.delay_before(n) for n in (1, 2, 3, 1030, MAX_COUNT, 10**400)] == \
        [1.0, 10.0, 60.0, 60.0, 60.0, 60.0]
    assert Redelivery(delay=0.0, backoff=10.0).delay_before(MAX_COUNT) == 0.0
    assert Redelivery(delay=5.0, max_delay=2.0).delay_before(1) == 2.0
    assert Redelivery(delay=1.0, backoff=1.0).delay_before(MAX_COUNT) == 1.0


def test_a_forged_count_past_the_limit_moves_the_message_to_the_error_destination() -> None:
    forged = message_of(delivery({"mdb_delivery_count": "99999"}))
    outcome = decide(forged, Raised("E", "boom"), GENEROUS)
    assert isinstance(outcome, MoveToError)
    assert outcome.headers["mdb_delivery_count"] == "99999"


# -- the failure text copied into the error headers fits any frame ------------------------------

def test_the_error_text_has_no_nul_nor_control_characters_and_stays_readable() -> None:
    text = error_text("bad\x00value\x1b[31m red\r\nnext line\ttab\x7f end\u0085")
    assert text == "bad\\x00value\\x1b[31m red\nnext line\ttab\\x7f end\\x85"


def test_the_error_text_is_bounded_in_utf8_bytes_and_stays_valid_utf8() -> None:
    cut = error_text("é" * ERROR_TEXT_LIMIT)
    assert len(cut.encode()) <= ERROR_TEXT_LIMIT
    assert cut == "é" * (ERROR_TEXT_LIMIT // 2)
    emoji = error_text("x" + "😀" * ERROR_TEXT_LIMIT)
    assert len(emoji.encode()) <= ERROR_TEXT_LIMIT and emoji.encode().decode() == emoji


def test_the_error_text_replaces_what_utf8_cannot_carry() -> None:
    text = error_text("lone \udcff surrogate")
    assert text.encode() == "lone \ufffd surrogate".encode()


def test_the_error_headers_carry_sanitised_bounded_text() -> None:
    outcome = decide(message(3), Raised("Weird\x00Type", "line\x00one\r\n" + "é" * 5000), POLICY)
    assert isinstance(outcome, MoveToError)
    assert outcome.headers["mdb_error_type"] == "Weird\\x00Type"
    error = outcome.headers["mdb_error_message"]
    assert "\x00" not in error and "\r" not in error and error.startswith("line\\x00one\né")
    assert len(error.encode()) <= ERROR_TEXT_LIMIT


def test_a_validation_error_raised_by_a_handler_is_described_without_its_input() -> None:
    class Card(BaseModel):
        number: int

    try:
        Card.model_validate({"number": "4111-1111-1111-1111"})
    except ValidationError as exc:
        raised = Raised.of(exc)
    assert "4111" not in raised.text and "input" not in raised.text
    assert "number" in raised.text and "valid integer" in raised.text


def test_what_became_of_a_delivery_is_told_to_its_listeners_strikes_once() -> None:
    """The processor tells ``Strikes`` what became of each delivery (``settled``,
    ``not_settled``): the rules of what that means for the message are there."""
    strikes = Strikes()
    copy = message(2)
    strikes.handing(copy)
    assert strikes.history_of(delivery({"mdb_id": "m-1"}), copy).seen is AttemptSeen.HANDED
    strikes.settled(copy, decide(copy, Raised("E", ""), POLICY))  # a retry copy carries it on
    assert strikes.history_of(delivery({"mdb_id": "m-1"}), copy).seen is AttemptSeen.DONE
    moved = decide(message(3), Raised("E", ""), POLICY)
    assert isinstance(moved, MoveToError)
    strikes.not_settled(message(1), moved, BrokerError("refused"), connection_open=False)
    strikes.not_settled(message(1), SETTLE, BrokerError("lost"), connection_open=False)
    strikes.not_settled(message(1), SETTLE, BrokerError("refused"), connection_open=True)
    assert strikes.count("m-1") == 2  # a failed move, and a refusal on an open connection
    strikes.not_settled(message(1), SETTLE, AcksUnconfirmed("acks lost"), connection_open=False)
    flagged = delivery({"mdb_id": "m-1"}, redelivered=True)
    history = strikes.history_of(flagged, message(1))
    assert (history.strikes, history.copied) == (2, True)
