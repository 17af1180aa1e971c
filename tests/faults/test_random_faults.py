"""The random fault run on RabbitMQ (``python -m tests.faults.random_faults --rabbitmq``),
short and seeded, on each topology: a three-node cluster with quorum queues and one node with
classic queues. App ``shop`` is a two-stage pipeline (its topic listener sends each message
on to a queue, its queue listener records it); a producer sends to the topic throughout, and
faults drawn from the seed hit the nodes (kill -9 and restart, SIGSTOP and SIGCONT) and the
container processes (kill -9 and restart, a network partition where there are namespaces).
Then: every message whose send returned was processed by stage 1, stage 2 received each
message stage 1 processed, repeats all flagged under one ``mdb_id``, nothing left in the
queues (``tests.faults.ledger.check_sent_on``).
"""

from __future__ import annotations

import pytest

from tests.conftest import missing
from tests.faults.random_faults import run_rabbitmq
from tests.harness.rabbitmq import rabbitmq_available

pytestmark = pytest.mark.rabbitmq

MINUTES = 0.75  # of faults; a run takes about one more minute: the start, the drain
# Seeds whose first five faults include all four kinds where there are network namespaces.
SEEDS = {"cluster": 3, "node": 6}


@pytest.mark.parametrize("topology", sorted(SEEDS))
def test_a_seeded_random_fault_run_on_rabbitmq_loses_nothing_and_flags_every_repeat(
        topology: str) -> None:
    if not rabbitmq_available():
        missing("RabbitMQ with the STOMP plugin")
    # The table and any finding's ledger lines are in the captured output.
    assert run_rabbitmq(topology, MINUTES, SEEDS[topology], drain=60.0) == 0
