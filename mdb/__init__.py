"""mdb: message-driven beans for Python.

Decorate a handler with ``@listener``, run ``mdb run MODULE``, and the container consumes with
transactions, redelivery and an error destination. See docs/concepts.md.
"""

from mdb.container import Container
from mdb.context import Context
from mdb.destinations import Destination
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
    ReplyTimeout,
    SelectorError,
    SendOutcomeUnknown,
    SessionMisuse,
    SubscriptionFailed,
    TransactionRolledBack,
    UnsupportedMessageKind,
)
from mdb.events import BrokerEvent, EventKind, on_event
from mdb.listener import ListenerSpec, listener
from mdb.options import Distribution, Redelivery
from mdb.producer import Producer
from mdb.settings import Settings, load_settings

__all__ = [
    "AcksUnconfirmed",
    "BrokerError",
    "BrokerEvent",
    "ConfigurationError",
    "ConnectionFailed",
    "ConnectionLost",
    "Container",
    "Context",
    "CredentialsRefused",
    "DatabaseUnavailable",
    "DecodeError",
    "Destination",
    "DispatchPending",
    "Distribution",
    "EncodeError",
    "EventKind",
    "HandlerInterrupted",
    "HandlerTimeout",
    "IdentityReused",
    "ListenerDefinitionError",
    "ListenerSpec",
    "MdbError",
    "NoReplyTo",
    "Producer",
    "Redelivery",
    "ReplyTimeout",
    "SelectorError",
    "SendOutcomeUnknown",
    "SessionMisuse",
    "Settings",
    "SubscriptionFailed",
    "TransactionRolledBack",
    "UnsupportedMessageKind",
    "listener",
    "load_settings",
    "on_event",
]
