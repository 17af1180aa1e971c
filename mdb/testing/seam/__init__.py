"""The broker seam's contract (``mdb.seam.broker``) as tests, for an adapter to run on its broker.

The tests are in ``deliveries`` (deliveries and transactions), ``lifetime`` (a connection's
lifetime) and ``queue_tools`` (browse, take, lock), on ``connecting``'s helpers; this module
gathers them, so that one ``import *`` of it brings them all.

In the adapter's test suite, one module::

    import pytest
    from mdb.testing.seam import *  # noqa: F403  (the tests below)

    @pytest.fixture
    def seam_url() -> str:
        return "myscheme://user:pw@localhost:1234"   # a running broker of your adapter

Every test connects with ``broker_for(ConnectionOptions(url=seam_url))`` (the adapter found by
the URL's scheme, as the container finds it), uses destinations of its own and runs under
anyio's pytest plugin (``anyio_backend``, asyncio by default). The rules checked, each in the
docstrings of ``mdb.seam.broker``: a round trip keeps body and headers; a commit makes its acks and
sends take effect together, an abort discards the sends and leaves the delivery unsettled;
a subscription that closes hands its unsettled deliveries back, flagged redelivered; prefetch
bounds what is pushed; ``receive_nowait`` takes from the same stream as ``receive`` and never
waits; the requeue destination reaches its subscription only; after ``close`` every object of
the connection is stale. What the adapter's ``Capabilities`` declare is checked as it says:
a connection's are its broker's; a delivery ``dead_letters`` accepts is settled by
``dead_letter``, another is refused and left unsettled; closing a subscription that holds a
delivery closes its connection only where ``closing_ends_connection`` says so; where the
broker holds delayed sends back, a delayed send is held from its commit and then goes behind
later ones; a browse sees a queue's messages in order and leaves them there, in that order
(where ``browsing`` declares a change, flagged redelivered at most), whatever headers their
producers gave them, and a browse closed early leaves them so; a take ends once nothing is left
for it, whatever another consumer took, and one closed early leaves the rest as they were; a
queue's lock is held by one connection at a time, until it closes.
"""


from __future__ import annotations

from mdb.testing.seam.deliveries import (
    test_a_closed_subscription_hands_unsettled_deliveries_back_flagged,
    test_a_delayed_send_is_held_from_its_commit_then_goes_behind_later_ones,
    test_a_round_trip_keeps_body_and_headers,
    test_abort_discards_sends_and_leaves_the_delivery_unsettled,
    test_an_aborted_ack_is_settled_by_a_later_transaction,
    test_commit_makes_acks_and_sends_take_effect_together,
    test_dead_letter_settles_only_a_delivery_the_capabilities_accept,
    test_prefetch_bounds_the_unsettled_deliveries_pushed,
    test_receive_nowait_takes_from_the_same_stream_and_never_waits,
    test_the_requeue_destination_reaches_its_subscription_only,
)
from mdb.testing.seam.lifetime import (
    test_a_closed_connection_makes_every_object_stale,
    test_a_connection_can_do_what_its_broker_declares,
    test_closing_a_subscription_holding_a_delivery_ends_its_connection_only_where_declared,
)
from mdb.testing.seam.queue_tools import (
    test_a_browse_closed_early_leaves_the_queue_as_it_was,
    test_a_lock_is_held_by_one_connection_until_it_closes,
    test_a_take_closed_early_leaves_the_rest_as_it_was,
    test_a_take_ends_once_nothing_is_left_whatever_another_consumer_took,
    test_browsing_sees_the_messages_in_order_and_leaves_them_there,
)

__all__ = [
    "test_a_browse_closed_early_leaves_the_queue_as_it_was",
    "test_a_closed_connection_makes_every_object_stale",
    "test_a_closed_subscription_hands_unsettled_deliveries_back_flagged",
    "test_a_connection_can_do_what_its_broker_declares",
    "test_a_delayed_send_is_held_from_its_commit_then_goes_behind_later_ones",
    "test_a_lock_is_held_by_one_connection_until_it_closes",
    "test_a_round_trip_keeps_body_and_headers",
    "test_a_take_closed_early_leaves_the_rest_as_it_was",
    "test_a_take_ends_once_nothing_is_left_whatever_another_consumer_took",
    "test_abort_discards_sends_and_leaves_the_delivery_unsettled",
    "test_an_aborted_ack_is_settled_by_a_later_transaction",
    "test_browsing_sees_the_messages_in_order_and_leaves_them_there",
    "test_closing_a_subscription_holding_a_delivery_ends_its_connection_only_where_declared",
    "test_commit_makes_acks_and_sends_take_effect_together",
    "test_dead_letter_settles_only_a_delivery_the_capabilities_accept",
    "test_prefetch_bounds_the_unsettled_deliveries_pushed",
    "test_receive_nowait_takes_from_the_same_stream_and_never_waits",
    "test_the_requeue_destination_reaches_its_subscription_only",
]
