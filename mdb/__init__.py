"""mdb: message-driven beans for Python.

Decorate a handler with ``@listener``, run ``mdb run MODULE``, and the container consumes with
transactions, redelivery and an error destination. See docs/concepts.md.
"""

from mdb.commands.dlq.failed import ErrorDestination
from mdb.commands.dlq.selection import Selection
from mdb.config.database_settings import DatabaseSettings
from mdb.config.settings import Settings, load_settings
from mdb.container.container import Container
from mdb.errors import (
    AcksUnconfirmed,
    BrokerError,
    ConfigurationError,
    ConnectionFailed,
    ConnectionLost,
    CredentialsRefused,
    DatabaseUnavailable,
    DecodeError,
    DispatchPending,
    EncodeError,
    HandlerInterrupted,
    HandlerTimeout,
    IdentityReused,
    ListenerDefinitionError,
    MdbError,
    NoReplyTo,
    QueueLocked,
    ReplyTimeout,
    SelectorError,
    SendOutcomeUnknown,
    SessionMisuse,
    StatementTooLarge,
    SubscriptionFailed,
    TransactionRolledBack,
    UnknownListener,
    UnsupportedMessageKind,
)
from mdb.listeners.context import Context
from mdb.listeners.events import BrokerEvent, EventKind, on_event
from mdb.listeners.listener import ListenerSpec, listener
from mdb.listeners.options import Distribution, Redelivery
from mdb.messages.destinations import Destination
from mdb.routing.brokers import Brokers
from mdb.routing.producer import Producer

__all__ = [
    "AcksUnconfirmed",
    "BrokerError",
    "BrokerEvent",
    "Brokers",
    "ConfigurationError",
    "ConnectionFailed",
    "ConnectionLost",
    "Container",
    "Context",
    "CredentialsRefused",
    "DatabaseSettings",
    "DatabaseUnavailable",
    "DecodeError",
    "Destination",
    "DispatchPending",
    "Distribution",
    "EncodeError",
    "ErrorDestination",
    "EventKind",
    "HandlerInterrupted",
    "HandlerTimeout",
    "IdentityReused",
    "ListenerDefinitionError",
    "ListenerSpec",
    "MdbError",
    "NoReplyTo",
    "Producer",
    "QueueLocked",
    "Redelivery",
    "ReplyTimeout",
    "Selection",
    "SelectorError",
    "SendOutcomeUnknown",
    "SessionMisuse",
    "Settings",
    "StatementTooLarge",
    "SubscriptionFailed",
    "TransactionRolledBack",
    "UnknownListener",
    "UnsupportedMessageKind",
    "listener",
    "load_settings",
    "on_event",
]
