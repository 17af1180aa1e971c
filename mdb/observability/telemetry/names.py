"""The names telemetry records, after the OpenTelemetry messaging semantic conventions where
they have one, and mdb's own. The testing kit (``mdb.testing.tracker``) reads a ``process``
span back through them to tell how each delivery ended: defined here once, so that a rename
reaches both."""

from __future__ import annotations

PROCESS = "process"  # the CONSUMER span of a delivery is named ``process <destination>``
MESSAGE_ID = "messaging.message.id"
DESTINATION = "messaging.destination.name"
DESTINATION_TEMPLATE = "messaging.destination.template"
REPLY_TO = "(reply-to)"  # the DESTINATION_TEMPLATE that counts every send to a reply address
SUBSCRIPTION = "messaging.destination.subscription.name"
ERROR_TYPE = "error.type"
DELIVERY_COUNT = "mdb.delivery_count"
REDELIVERY_EVENT = "mdb.redelivery"  # re-sent for another delivery (with its DELIVERY_COUNT)
ERROR_DESTINATION_EVENT = "mdb.error_destination"  # moved there (the DESTINATION it went to)
STUCK_EVENT = "mdb.stuck"  # given up on: its OUTCOME says how
OUTCOME = "mdb.outcome"
DEAD_LETTERED = "dead-lettered"  # an OUTCOME: handed to the broker's dead-letter queue
KEPT = "kept"  # an OUTCOME: kept on its own queue, not handled again
ALREADY_PROCESSED = "mdb.already_processed"  # exactly-once: a copy its inbox knew, not run
LISTENER = "mdb.listener"  # the listener a metric's data point is of
