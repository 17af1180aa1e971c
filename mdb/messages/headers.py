"""The names of the headers mdb reads and writes on the messages it sends: its own (``mdb_...``),
the failure an error copy carries, and the body's content type. One name, one constant: every
module imports them from here, by name.
"""

# Header names use '_' rather than '-' so that ActiveMQ selectors can refer to them.
ID = "mdb_id"  # the framework's message id: stable across redeliveries and re-sends
DELIVERY_COUNT = "mdb_delivery_count"  # deliveries before the one carrying this header, plus one
REDELIVERY_OF = "mdb_redelivery_of"  # on a re-sent copy: the logical destination it came from
ORIGINAL_DESTINATION = "mdb_original_destination"  # on a message moved to an error destination
ERROR_TYPE = "mdb_error_type"
ERROR_MESSAGE = "mdb_error_message"
ERROR_LISTENER = "mdb_error_listener"
# Where a handler raised: its traceback's frames (its text is ERROR_MESSAGE), the innermost
# kept; left out of a copy before any other header where the broker's limits leave no room.
ERROR_TRACEBACK = "mdb_error_traceback"
FAILED_AT = "mdb_failed_at"  # on a message moved to an error destination: when, ISO 8601 UTC
# On an error copy: when its original expired or would have (ISO 8601 UTC), for the operator to
# know; the copy itself never expires, it is the failure's evidence (``mdb.messages.copies``).
ORIGINAL_EXPIRY = "mdb_original_expiry"
# On a message replayed from an error destination (``mdb.commands.dlq.failed``): how many times it
# was, and the failure it had, as history under names no failure handling reads.
REPLAYS = "mdb_replays"
LAST_FAILURE = {ERROR_TYPE: "mdb_last_error_type", ERROR_MESSAGE: "mdb_last_error_message",
                ERROR_LISTENER: "mdb_last_error_listener", FAILED_AT: "mdb_last_failed_at",
                ORIGINAL_DESTINATION: "mdb_last_original_destination",
                DELIVERY_COUNT: "mdb_last_delivery_count",
                ERROR_TRACEBACK: "mdb_last_error_traceback"}
HEADERS_DROPPED = "mdb_headers_dropped"  # on a copy: how many of the original's headers it lacks
# On a handler's send whose message may have been processed before: the send may be a repeat,
# with the same mdb_id as the earlier one (``mdb.messages.message.derived_id``).
MAYBE_REPEAT = "mdb_maybe_repeat"
# On every message mdb sends: the proof that mdb made it, a MAC of its mdb_id and content with
# the application's secret (``mdb.messages.identity.Seal``).
PROOF = "mdb_proof"
# The body's content type under two names: STOMP's, which other STOMP clients and RabbitMQ read,
# and one a JMS selector can name (ActiveMQ makes both properties; ``content-type = 'x'`` in a
# selector parses as ``content - type = 'x'`` and silently matches nothing). See docs/interop.md.
CONTENT_TYPE = "content-type"
CONTENT_TYPE_PROPERTY = "mdb_content_type"
