"""mdb's STOMP 1.2 adapter (stomp.py), registered as ``stomp+activemq`` and ``stomp+rabbitmq``.

``StompBroker`` is the entry point; ``mdb_stomp.dialect`` holds what differs per broker and
``activemq.xml`` (next to this file) is the reference ActiveMQ Classic configuration.
"""

from mdb_stomp.connection import StompBroker, StompConnection, StompSubscription, StompTransaction
from mdb_stomp.dialect import ActiveMQDialect, Dialect, RabbitMQDialect

__all__ = [
    "ActiveMQDialect",
    "Dialect",
    "RabbitMQDialect",
    "StompBroker",
    "StompConnection",
    "StompSubscription",
    "StompTransaction",
]
