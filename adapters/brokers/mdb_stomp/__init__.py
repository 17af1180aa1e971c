"""mdb's STOMP 1.2 adapter (stomp.py), registered as ``stomp+activemq`` and ``stomp+rabbitmq``.

``StompBroker`` (``broker``) is the entry point; ``connection``, ``transaction`` (settled with
``dialects.confirmed`` sends where the broker's transactions are not atomic) and ``temporary``
are the seam's objects, at the top. Below them, by concern: ``protocol/``, STOMP 1.2 on one
connection (``wire``: the stomp.py connection bridged into anyio, its ``receipts``, heart-beats,
frames, TLS, limits); ``dialects/``, what differs per broker (``activemq``, ``rabbitmq``, and
``scheduler``, which probes whether an ActiveMQ holds delayed messages back);
``subscriptions/``, one SUBSCRIBE and what it holds (``subscription``, ``unsettled``, which keeps
cumulative acks safe); ``queues/``, what the operator's tools do to a whole queue (``browser``,
``read_through`` where there is no browser, ``take`` with its ``end_marker``, ``lock``).
``activemq.xml`` (next to this file) is the reference ActiveMQ Classic configuration,
``activemq-shared-store.xml`` the same for a shared-store master/slave pair.
"""

try:
    import stomp  # noqa: F401  (imported first, to say which extra brings it)
except ImportError as missing:
    raise ModuleNotFoundError("mdb's STOMP adapter needs stomp.py: pip install 'mdb[stomp]'",
                              name=missing.name) from None

from mdb.observability.logs import quiet_library
from mdb_stomp.broker import StompBroker
from mdb_stomp.connection import StompConnection
from mdb_stomp.dialects.activemq import ActiveMQDialect
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.dialects.rabbitmq import RabbitMQDialect
from mdb_stomp.protocol.frame_logs import STOMP_LOGGER, HiddenBodies
from mdb_stomp.subscriptions.subscription import StompSubscription
from mdb_stomp.transaction import StompTransaction

# stomp.py's log repeats, once per connection and attempt, what mdb says once per broker, and
# its frames carry the passcode and bodies: shown only at DEBUG, masked (mdb.observability.logs),
# with each body's size instead of the body (mdb_stomp.protocol.frame_logs).
quiet_library(STOMP_LOGGER, HiddenBodies())

__all__ = [
    "ActiveMQDialect",
    "Dialect",
    "RabbitMQDialect",
    "StompBroker",
    "StompConnection",
    "StompSubscription",
    "StompTransaction",
]
