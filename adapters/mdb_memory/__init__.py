"""The in-memory broker (``memory://NAME``): the embedded default broker of ``mdb run`` and the
fast test double. It keeps the semantics of ActiveMQ Classic with virtual topics — see
``state`` for topics and the test hooks, ``connection`` for transactions and prefetch,
``mdb.selector`` for the supported selectors.
"""

from mdb_memory.broker import MemoryBroker
from mdb_memory.connection import (
    MemoryConnection,
    MemorySubscription,
    MemoryTransaction,
)
from mdb_memory.queue import StoredMessage
from mdb_memory.state import (
    BrokerState,
    QueueStats,
    broker_state,
    reset,
    subscription_queue_name,
)

__all__ = [
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
