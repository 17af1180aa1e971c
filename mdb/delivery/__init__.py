"""Delivery: running a listener's handler on what a subscription delivers, and settling it.

The transaction, the redelivery policy and the error destination, in four parts with one job
each:

* ``decision``: what becomes of a delivery (settle, redeliver with a count and a delay, or move
  to the error destination with its failure in headers) — pure, and where the redelivery
  contract is written down;
* ``batch``: several deliveries in one transaction, and the one-at-a-time fall-back after a
  failure — where the batch contract is written down;
* ``sends``: a handler's sends, joining the delivery's transaction or held until it ends;
* ``processor``: ``Processor``, the effectful runner the container's pool slots hold;

beside them ``invoker`` (calling the handler, in its span) and ``stats``.
"""

from mdb.delivery.decision import to_message
from mdb.delivery.processor import Processor
from mdb.delivery.stats import Stats

__all__ = ["Processor", "Stats", "to_message"]
