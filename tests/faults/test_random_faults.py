"""The random fault run (``python -m tests.faults.tools.random_faults``), short and seeded.

On RabbitMQ (``--rabbitmq``), on each topology: a three-node cluster with quorum queues and
one node with classic queues. App ``shop`` is a two-stage pipeline (its topic listener sends
each message on to a queue, its queue listener records it); a producer sends to the topic
throughout, and faults drawn from the seed hit the nodes (kill -9 and restart, SIGSTOP and
SIGCONT) and the container processes (kill -9 and restart, a network partition where there
are namespaces). Then: every message whose send returned was processed by stage 1, stage 2
received each message stage 1 processed, repeats all flagged under one ``mdb_id``, nothing
left in the queues (``tests.harness.traffic.ledger.check_sent_on``).

Exactly-once (``--exactly-once``): two exactly-once stages in two container processes of one
app, both stages partitioned over three ActiveMQ brokers, on PostgreSQL and on MariaDB
(``--database mariadb``), fed by a foreign
producer (plain stomp.py: no ``mdb_id``, a business id in the body); faults of the database
(kill -9 of the server, SIGSTOP past the databases' timeout or not) among those of the
brokers and the processes. Then: every business id whose send a broker confirmed has its
effect once in each stage's ledger, nothing is left in the outbox, the queues or the DLQs
(``tests.harness.processes.exactly_once_stages.check_once``).
"""

from __future__ import annotations

import pytest

from tests.faults.tools.random_faults import (
    KNOWN_LOSS,
    exactly_once_missing,
    run_exactly_once,
    run_rabbitmq,
)
from tests.harness.servers.brokers import missing
from tests.harness.servers.rabbitmq import rabbitmq_available

MINUTES = 0.75  # of faults; a run takes about one more minute: the start, the drain
# Seeds whose first five faults include all four kinds where there are network namespaces.
SEEDS = {"cluster": 3, "node": 6}
# Its first five faults, where there are namespaces, are five of the six kinds (a SIGSTOP of
# the database server aside): a broker kill, a kill -9 of the server (the postmaster, or
# mariadbd), a container kill, a partition, a broker pause; those that fit in MINUTES are
# made.
EXACTLY_ONCE_SEED = 9


@pytest.mark.rabbitmq
@pytest.mark.parametrize("topology", sorted(SEEDS))
def test_a_seeded_random_fault_run_on_rabbitmq_loses_nothing_and_flags_every_repeat(
        topology: str) -> None:
    if not rabbitmq_available():
        missing("RabbitMQ with the STOMP plugin")
    # The table and any finding's ledger lines are in the captured output.
    status = run_rabbitmq(topology, MINUTES, SEEDS[topology], drain=60.0)
    if status == KNOWN_LOSS:
        # Only a message in flight at a kill -9 of the lone node was lost, and nothing else
        # went wrong: RabbitMQ's open finding (docs/failover.md, "Known limits"), reported,
        # not hidden; any other loss is a failure.
        pytest.xfail("RabbitMQ lost a message in flight at a kill -9 of its lone node")
    assert status == 0


@pytest.mark.activemq
@pytest.mark.parametrize("database", [
    pytest.param("postgresql", marks=pytest.mark.postgresql),
    pytest.param("mariadb", marks=pytest.mark.mariadb)])
def test_a_seeded_random_fault_run_of_exactly_once_stages_has_every_effect_once(
    database: str,
) -> None:
    lacking = exactly_once_missing(database)
    if lacking:
        missing(lacking)
    # The table, with any offending ids, is in the captured output.
    assert run_exactly_once(MINUTES, EXACTLY_ONCE_SEED, drain=60.0, database=database) == 0
