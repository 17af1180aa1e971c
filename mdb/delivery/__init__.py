"""Delivery: running a listener's handler on what a subscription delivers, and settling it.

The transaction, the redelivery policy and the error destination, in four parts with one job
each:

* ``decision``: what a delivery is (``classify``: fresh, not selected, in doubt, unreadable
  or stuck) and what becomes of it (``decide``: settle, filter, redeliver with a count and a
  delay, move to the error destination with its failure in headers, or, when settling it
  keeps failing outside the handler, hand it to the broker's dead-letter queue or keep it) —
  pure, and where the redelivery contract is written down;
* ``batch``: several deliveries in one transaction, and the one-at-a-time fall-back after a
  failure — where the batch contract is written down;
* ``sends``: a handler's sends, joining the delivery's transaction or held until it ends;
* ``processor``: ``Processor``, the effectful runner the container's pool slots hold, which
  carries each decision out in one place;

beside them ``invoker`` (calling the handler, in its span), ``timeouts`` (the handler
timeout, and the worker threads of plain ``def`` handlers) and ``strikes`` (failures to
settle a message that are the broker's doing, counted in the process). The headers of every
copy are made in ``mdb.messages.copies``. What each listener did is counted in its
``mdb.observability.telemetry.Stats``.
"""

from mdb.delivery.processor import Processor
from mdb.delivery.strikes import Strikes

__all__ = ["Processor", "Strikes"]
