"""Every error mdb raises, under one root.

Adapters catch their client library's exceptions and raise these instead; the core only
ever catches ``MdbError`` subclasses::

    MdbError
    ├── ConfigurationError          a setting or listener option is invalid (names it and the fix)
    │   ├── ListenerDefinitionError     raised by @listener at decoration time
    │   └── SelectorError               a selector not in the subset mdb.messages.selector evaluates
    ├── DecodeError                 a message body does not match the handler's annotation
    │   └── UnsupportedMessageKind      a message the broker could not carry (a JMS MapMessage...)
    ├── EncodeError (a TypeError)   a body to send is not bytes, str, a model or JSON data
    ├── NoReplyTo                   ``Context.reply`` on a message that names no reply-to
    ├── HandlerInterrupted          a handler raised CancelledError, SystemExit... of its own
    ├── ReplyTimeout (a TimeoutError) ``Producer.request`` got no reply in time
    ├── HandlerTimeout (a TimeoutError) a handler ran past its listener's ``handler_timeout``
    ├── DatabaseUnavailable         an exactly-once listener's database cannot be reached in time
    ├── StatementTooLarge           a statement larger than the database server takes (a setting)
    ├── DispatchPending             an exactly-once run committed; a send waits in the outbox
    ├── IdentityReused              a message came with the identity of another one processed
    ├── SessionMisuse               a handler ended the database transaction that mdb owns
    ├── UnknownListener (a LookupError) a listener name the container does not run (a pause)
    └── BrokerError                 anything that went wrong talking to a broker
        ├── ConnectionFailed            could not connect (refused, timed out, TLS, ...)
        │   └── CredentialsRefused          the broker refused the login (user, password, vhost)
        ├── ConnectionLost              an open connection dropped; its work in flight is stale
        ├── SubscriptionFailed          the broker refused a subscription (bad selector, ...)
        ├── QueueLocked                 another connection holds the lock on a queue (mdb dlq)
        ├── TransactionRolledBack       a commit did not happen; the broker redelivers what it held
        │   └── AcksUnconfirmed             its sends were all stored, its acks perhaps not
        └── SendOutcomeUnknown          a send got no receipt: it may or may not have been stored
"""

from __future__ import annotations

from typing import ClassVar


class MdbError(Exception):
    """Root of every error raised by mdb."""


class ConfigurationError(MdbError):
    """A setting or option is invalid. The message names it and says what would be valid."""


class ListenerDefinitionError(ConfigurationError):
    """``@listener`` was given an invalid option; raised when the function is decorated."""


class SelectorError(ConfigurationError, ValueError):
    """A selector is not in the subset ``mdb.messages.selector`` evaluates; the message says where
    in it and why, and whoever compiled it names the listener or subscription. Also a ``ValueError``
    (the selector's text is a bad value), so either ``except`` catches it."""


class DecodeError(MdbError):
    """A body could not be decoded into the handler's annotated type. Never retried."""


class UnsupportedMessageKind(DecodeError):
    """A message arrived whose content the broker could not carry over the adapter's protocol
    (ActiveMQ hands a JMS MapMessage, ObjectMessage, StreamMessage or plain Message to a STOMP
    client with an empty body): raised by ``Producer.request`` for such a reply rather than
    returning an empty body. A listener moves such a message to its error destination."""


class EncodeError(MdbError, TypeError):
    """A body to send cannot be encoded. Also a ``TypeError``: a body of a type mdb cannot
    send is a programming error, so either ``except`` catches it."""


class NoReplyTo(MdbError):
    """``Context.reply`` was called while handling a message that asks for no reply (it has no
    reply-to). Raised in the handler, it fails the delivery like any handler error."""


class HandlerInterrupted(MdbError):
    """A handler raised a ``BaseException`` that is not an ``Exception`` and not the container
    stopping it: a ``CancelledError`` of its own (a task or call it awaited was cancelled),
    ``SystemExit``, ``KeyboardInterrupt``... It fails the delivery like any handler error
    (``__cause__`` is what the handler raised) instead of ending the container."""


class ReplyTimeout(MdbError, TimeoutError):
    """``Producer.request`` got no reply within its timeout. The request was sent: it may
    still be processed, and its late reply is dropped with the temporary queue."""


class HandlerTimeout(MdbError, TimeoutError):
    """A handler ran past its listener's ``handler_timeout``: the failure of its delivery
    (``mdb_error_type`` ``mdb.errors.HandlerTimeout``), redelivered as any failure is. Raised by
    the container around the handler, never inside it."""


class BrokerError(MdbError):
    """Talking to a broker failed."""


class ConnectionFailed(BrokerError):
    """A connection could not be opened."""


class CredentialsRefused(ConnectionFailed):
    """The broker refused the login. Waiting for it does not help; new credentials may (the
    container still retries a running connection: a password rotation is normal)."""


class ConnectionLost(BrokerError):
    """An open connection dropped. Transactions and unacknowledged deliveries on it are stale."""


class SubscriptionFailed(BrokerError):
    """The broker refused to create a subscription."""


class QueueLocked(BrokerError):
    """Another connection holds the lock on the queue (``Connection.lock``): another operator
    is at work on it. Run again once that one is done."""


class TransactionRolledBack(BrokerError):
    """A commit failed or its outcome is unknown; nothing of the transaction took effect
    that the broker will not redeliver."""


class AcksUnconfirmed(TransactionRolledBack):
    """A commit without atomic transactions (``Capabilities.atomic_transactions``) whose sends
    the broker all confirmed as stored, but not its acks (``Transaction.commit``)."""


class SendOutcomeUnknown(BrokerError):
    """A send got no receipt. The message may have been stored: retrying it elsewhere may
    create a duplicate, which consumers can recognise by its ``mdb_id`` header."""


def error_type(exc: BaseException) -> str:
    """How mdb names ``exc``'s type in error headers and telemetry: a builtin by its bare name
    (``ValueError``), any other qualified by its module (``mdb.errors.DecodeError``). Never
    raises: a class whose names are not plain strings (a metaclass's doing) is ``<unnamed
    exception type>``."""
    cls = type(exc)
    try:
        module, name = cls.__module__, cls.__qualname__
    except BaseException:  # no await in here: not a cancellation, the class's own doing
        return UNNAMED
    # Exactly str: a str subclass's own methods could raise where the name is shown.
    if type(module) is not str or type(name) is not str:
        return UNNAMED
    if module == "builtins":
        return name
    return f"{module}.{name}"


UNNAMED = "<unnamed exception type>"


class DatabaseUnavailable(MdbError):
    """The database of an exactly-once listener cannot be reached, or did not answer in time:
    the delivery is held until it answers, or, at a stop, left unsettled
    (docs/exactly-once.md)."""


class StatementTooLarge(MdbError):
    """The database server dropped the connection of a statement larger than it takes
    (MariaDB's and MySQL's ``max_allowed_packet``): not an outage, which every run of the
    message would meet again, but the delivery's failure, whose text names the setting to
    raise (docs/exactly-once.md, "A bad day of the database")."""


class DispatchPending(MdbError):
    """An exactly-once run committed, but a send it wrote to the outbox could not be
    dispatched (its broker is down): the delivery stays unsettled, and its redelivery, or
    another process's sweep, dispatches the rows (docs/exactly-once.md)."""


class IdentityReused(MdbError):
    """An exactly-once listener's inbox knows the message's identity from another message
    (another body; or, for a message without an id, known by its content, one it cannot be
    told from): it is not a copy of that one, so it is neither settled as one nor run. It
    moves to the error destination (docs/exactly-once.md, "Identity"), whence it is replayed
    as a new message (``mdb.commands.dlq.failed``)."""

    error_type: ClassVar[str] = "mdb.IdentityReused"
    """The ``mdb_error_type`` of its error copy."""


class SessionMisuse(MdbError):
    """A handler called ``commit``, ``rollback`` or ``close`` on the ``AsyncSession`` of an
    exactly-once listener: its transaction is mdb's, which commits it (with the inbox row and
    the outbox) when the handler returns and rolls it back when it raises. Refused at once;
    raised in the handler, it fails the delivery and nothing of the run is kept
    (docs/exactly-once.md)."""


class UnknownListener(MdbError, LookupError):
    """A listener name the container does not run (``Container.pause``, ``Container.resume``,
    ``mdb pause``): the message lists the ones it runs."""


def sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a task group wrapped (through nested groups); the group itself when
    there are several. A task group wraps even a lone exception, which would otherwise reach
    the user as ``ExceptionGroup: unhandled errors in a TaskGroup``."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
        found = found.exceptions[0]
    return found
