"""The in-memory broker (``memory://NAME``): the embedded default broker of ``mdb run`` and the
fast test double. It keeps the semantics of ActiveMQ Classic with virtual topics — see
``state`` for topics and the test hooks, ``connection`` for transactions and prefetch,
``mdb.messages.selector`` for the supported selectors. ``Connection.dead_letter`` keeps a message on
``queue:DLQ`` (``DEAD_LETTER_QUEUE``), as a NACK of a persistent one does on ActiveMQ.

Imports point one way: ``broker`` → ``connection`` → ``subscription`` / ``transaction`` →
``session`` → ``exchange`` (queues, routing, injected failures) → ``queue``; ``state`` (what
tests see) wraps the ``exchange`` and knows no connection.
"""

from mdb_memory.broker import MemoryBroker
from mdb_memory.connection import MemoryConnection
from mdb_memory.queue import StoredMessage
from mdb_memory.state import (
    DEAD_LETTER_QUEUE,
    BrokerState,
    QueueStats,
    broker_state,
    reset,
    subscription_queue_name,
)
from mdb_memory.subscription import MemorySubscription
from mdb_memory.transaction import MemoryTransaction

__all__ = [
    "DEAD_LETTER_QUEUE",
    "BrokerState",
    "MemoryBroker",
    "MemoryConnection",
    "MemorySubscription",
    "MemoryTransaction",
    "QueueStats",
    "StoredMessage",
    "broker_state",
    "reset",
    "subscription_queue_name",
]
