"""mdb's STOMP 1.2 adapter (stomp.py), registered as ``stomp+activemq`` and ``stomp+rabbitmq``.

``StompBroker`` (``broker``) is the entry point; ``connection``, ``subscription`` and
``transaction`` (settled with ``confirmed`` sends where the broker's transactions are not atomic)
are the seam's objects, which share one ``wire`` (the stomp.py connection bridged
into anyio, with its ``receipts``); ``unsettled`` keeps cumulative acks safe; ``frames`` holds the
pure header work; ``dialect`` holds what differs per broker (how each holds a delayed message
back, too), with one module per broker, ``activemq`` and ``rabbitmq``; ``scheduler`` probes
whether an ActiveMQ can; ``browser`` reads a queue without taking it, through the broker's
browser or by taking and handing back; and ``activemq.xml`` (next to this file) is the
reference ActiveMQ Classic configuration, ``activemq-shared-store.xml`` the same for a
shared-store master/slave pair.
"""

try:
    import stomp  # noqa: F401  (imported first, to say which extra brings it)
except ImportError as missing:
    raise ModuleNotFoundError("mdb's STOMP adapter needs stomp.py: pip install 'mdb[stomp]'",
                              name=missing.name) from None

from mdb.logs import quiet_library
from mdb_stomp.activemq import ActiveMQDialect
from mdb_stomp.broker import StompBroker
from mdb_stomp.connection import StompConnection
from mdb_stomp.dialect import Dialect
from mdb_stomp.frame_logs import STOMP_LOGGER, HiddenBodies
from mdb_stomp.rabbitmq import RabbitMQDialect
from mdb_stomp.subscription import StompSubscription
from mdb_stomp.transaction import StompTransaction

# stomp.py's log repeats, once per connection and attempt, what mdb says once per broker, and
# its frames carry the passcode and bodies: shown only at DEBUG, masked (mdb.logs), with each
# body's size instead of the body (mdb_stomp.frame_logs).
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
