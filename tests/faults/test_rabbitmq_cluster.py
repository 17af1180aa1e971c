"""A three-node RabbitMQ cluster: the node the containers are connected to killed under load.

One broker ``a`` at the three nodes' addresses, with quorum queues
(``tests.faults.tools.node_loss.cluster_settings``). App ``shop`` runs two container processes that
share a topic subscription (``one-copy-per-app``) and compete on a queue; one producer sends to
the topic, another to the queue, with the same settings. The node everything is connected to
(the first address) is killed (kill -9): the processes and the producers go on through the next
node. The killed node restarts and rejoins; then the node they moved to is killed too. After
that: every message whose send returned was processed by the app, every repeat was flagged
redelivered, a send that raised said so (``SendOutcomeUnknown``, or ``ConnectionFailed`` after
waiting for the reconnect), and the cluster's queues are empty.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.faults.tools.node_loss import cluster_settings, kill_node, left_behind, next_node
from tests.harness.apps.in_process import unique
from tests.harness.processes.fleet import Fleet, fleet
from tests.harness.servers.brokers import missing
from tests.harness.servers.rabbitmq import rabbitmq_available
from tests.harness.servers.rabbitmq_cluster import RabbitMQCluster
from tests.harness.traffic.ledger import PER_APP, check
from tests.harness.traffic.load_producer import LoadProducer

pytestmark = pytest.mark.rabbitmq

LOAD = 40  # messages of each producer processed before the first kill
RESUMED = 5  # messages of each producer sent after a kill and processed, before going on
AFTER = 40  # messages told-sent by each producer at the end


@pytest.fixture(scope="module")
def cluster() -> Iterator[RabbitMQCluster]:
    if not rabbitmq_available():
        missing("RabbitMQ with the STOMP plugin")
    with RabbitMQCluster() as started:
        yield started


def sent_since(producers: Sequence[LoadProducer], app: str, count: int,
               ) -> Callable[[Fleet], bool]:
    """A condition: ``app`` processed ``count`` messages of each producer sent from now on."""
    before = [set(p.told) for p in producers]

    def condition(f: Fleet) -> bool:
        return all(len((set(p.told) - sent) & f.processed(app)) >= count
                   for p, sent in zip(producers, before, strict=True))
    return condition


def test_the_node_a_container_is_connected_to_killed_under_load(
        cluster: RabbitMQCluster) -> None:
    topic, queue = unique("ha"), unique("haq")
    settings = cluster_settings(cluster, topic)
    with fleet(settings, topic) as processes:
        shop = unique("shop")
        processes.start(shop, ["s1", "s2"], PER_APP, env={"LEDGER_QUEUE": queue})
        with LoadProducer(settings, topic) as to_topic, \
                LoadProducer(settings, queue, kind="queue") as to_queue:
            producers = [to_topic, to_queue]
            for producer in producers:
                producer.wait_told(LOAD)
            processes.wait(lambda f: len(f.processed(shop)) >= 2 * LOAD, "load")
            first = kill_node(cluster, 0, processes, shop)
            processes.wait(sent_since(producers, shop, RESUMED), "sending through node 1")
            cluster.nodes[first.killed].restart()  # it rejoins the cluster
            cluster.wait_members(len(cluster.nodes))
            second = kill_node(cluster, next_node(cluster, 0), processes, shop)
            processes.wait(sent_since(producers, shop, RESUMED), "sending through node 2")
            for producer in producers:
                producer.wait_told(AFTER)
        told = {f"topic:{topic}": to_topic.told, f"queue:{queue}": to_queue.told}
        every_told = [message for sent in told.values() for message in sent]
        processes.drain(every_told)
        processes.stop()
        verdicts = {destination: check(sent, [e for e in processes.done(shop)
                                              if e["destination"] == destination])
                    for destination, sent in told.items()}
    raised = {**to_topic.raised, **to_queue.raised}
    # Taken before the verdicts are asserted: a message the app never processed is either still
    # in a queue (delivered nowhere until the fleet's connections closed) or gone.
    left = left_behind(cluster.nodes, [topic, queue], every_told)
    for destination, verdict in verdicts.items():
        assert verdict.ok, f"{destination}: {verdict}; left in the queues: {left}"
    assert set(raised.values()) <= {"SendOutcomeUnknown", "ConnectionFailed"}, raised
    assert not left
    print(f"{first}; {second};", {k: str(v) for k, v in verdicts.items()}, "raised:", raised)

