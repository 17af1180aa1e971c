"""Listener options, each declared once: ``ListenerOptions`` holds every option's name, type,
bounds, default and description. Derived from it: ``@listener``'s validation (its typed keyword
parameters are checked against it by a unit test), ``ListenerOverrides`` (what settings may
change per listener, the deployment descriptor) and the configuration reference
(``mdb.config.reference``)."""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from mdb.errors import ConfigurationError
from mdb.messages.destinations import Destination

MAX_LIMIT = 10_000
"""The most redeliveries a listener may ask for."""
MAX_WAIT = 86_400
"""The longest redelivery delay, in seconds (a day)."""
MAX_BACKOFF = 10
"""The steepest redelivery backoff factor."""


class Distribution(enum.StrEnum):
    """How copies of a topic's messages are spread over the processes of an application."""

    ONE_COPY_PER_APP = "one-copy-per-app"
    """All processes of the app share one subscription: each message is processed once app-wide."""
    ONE_COPY_PER_SERVER = "one-copy-per-server"
    """Each process (server) has its own subscription: every server processes every message."""


class Redelivery(BaseModel):
    """When a handler raises: deliver again ``delay`` seconds later (times ``backoff`` for each
    further failure, at most ``max_delay``), at most ``limit`` times; then move the message to
    the error destination. The broker holds the message back meanwhile where it can, and the
    pool slot takes the next message; where it cannot, the slot waits (docs/concepts.md).
    Every number is finite and bounded: a limit nobody reaches is a poison message looping."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True,
                              allow_inf_nan=False)

    limit: int = Field(default=5, ge=0, le=MAX_LIMIT)
    """redeliveries after the first delivery before the message moves to the error
    destination (bounded: past a few thousand failures a message is poison, not unlucky)"""
    delay: float = Field(default=1.0, ge=0, le=MAX_WAIT)
    """seconds before the first redelivery: the broker holds the message back meanwhile, or,
    where it cannot, the message's pool slot waits (bounded: a longer wait belongs to a
    scheduler)"""
    backoff: float = Field(default=2.0, ge=1, le=MAX_BACKOFF)
    """factor applied to the delay for each further redelivery (bounded: 10 turns one second
    into a day by the sixth redelivery)"""
    max_delay: float = Field(default=60.0, ge=0, le=MAX_WAIT)
    """the longest delay, in seconds (bounded as `delay`)"""

    def delay_before(self, delivery_count: int) -> float:
        """Seconds to wait before delivering again after delivery ``delivery_count`` failed:
        ``delay * backoff ** (delivery_count - 1)``, at most ``max_delay``. Defined for any
        count (one read from a header may be forged): the arithmetic never overflows."""
        first = min(self.delay, self.max_delay)
        steps = min(max(delivery_count - 1, 0), 2**62)  # an int a float can hold
        if first == 0 or self.backoff == 1 or steps == 0:
            return first
        # Compare exponents rather than compute a power that may overflow a float.
        if steps * math.log(self.backoff) >= math.log(self.max_delay / first):
            return self.max_delay
        return min(first * self.backoff ** steps, self.max_delay)

    def keep_delay(self, times: int) -> float:
        """Seconds before a stuck message is kept on its queue for the ``times``-th time
        (``mdb.delivery.decision.Keep``): ``delay`` doubled each time, at most ``max_delay``,
        and never under a second, whatever the settings (a kept message must not go round its
        queue in a tight loop)."""
        first, cap = max(self.delay, 1.0), max(self.max_delay, 1.0)
        return min(first * 2.0 ** min(max(times - 1, 0), 64), cap)


class ListenerOptions(BaseModel):
    """Every option of ``@listener`` except the destination and the name. Each field's
    docstring is its description in the configuration reference."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    distribution: Distribution = Distribution.ONE_COPY_PER_APP
    """how a topic's messages are spread over the app's processes: `one-copy-per-app` (one
    shared subscription: each message is processed once in the app) or `one-copy-per-server`
    (one subscription per process: every process gets every message). A queue delivers each
    message once; `one-copy-per-server` is refused there"""
    pool: int = Field(default=1, ge=1, le=1024)
    """concurrent handler invocations in this process per member of the destination; times
    `prefetch`, the most unsettled messages the process holds for this listener on each
    member"""
    transacted: bool = True
    """true: the ack and the handler's sends commit together; false: ack after the handler
    returned, sends go at once (see docs/concepts.md)"""
    selector: str | None = None
    """JMS selector on headers. On a queue the broker evaluates it: ActiveMQ (its full syntax;
    an invalid one fails startup) and the embedded broker (the `mdb.messages.selector` subset);
    RabbitMQ has none, so startup fails. On a topic the container evaluates it on every broker (the
    `mdb.messages.selector` subset, parentheses at most 50 deep; an invalid one fails startup) and
    acknowledges a message it does not select without running the handler
    (docs/distribution.md)"""
    redelivery: Redelivery = Redelivery()
    """what happens when the handler raises (table below)"""
    error_destination: str | None = None
    """where messages go that failed more than `redelivery.limit` times or do not decode
    (default `queue:<destination name>.DLQ`)"""
    durable: bool = True
    """a topic subscription keeps messages while no process is attached; false (it ends with
    its last subscriber) only on the embedded broker: ActiveMQ and RabbitMQ refuse it at
    startup"""
    subscription: str | None = None
    """replaces the derived topic subscription name (letters, digits, _ and -, and the
    placeholders `{app}`, `{server}`, `{listener}`; one-copy-per-server needs `{server}`)"""
    durable_subscription_deletion: bool = False
    """on an orderly stop, delete this process's topic subscriptions and what they hold
    (one-copy-per-server only; WebLogic's option of the same name). ActiveMQ cannot delete
    them over STOMP: the failure is logged, see docs/distribution.md"""
    max_messages_per_transaction: int = Field(default=1, ge=1, le=1000)
    """most messages one pool slot processes in one transaction (transacted listeners: the
    broker's; exactly-once listeners: the database's, docs/exactly-once.md#batches);
    `prefetch` is at least this. A batch is what has already arrived, never waited for; if a
    handler raises, the batch is processed again one message at a time"""
    prefetch: int = Field(default=1, ge=1, le=1000)
    """most messages the broker hands each pool slot before it settled them (its
    subscriptions' prefetch; `max_messages_per_transaction` raises it). A slot handles them
    in order, one after the other: a prefetched message waits behind the slot's current one,
    and on a stop or a lost connection goes back to the broker and returns flagged
    redelivered, handled as in doubt (re-sent with its delivery count one higher; with
    `redelivery.limit` 0, moved to the error destination unhandled). 1, the default, holds
    nothing ahead, so an orderly stop hands nothing back, but the slot waits a broker round
    trip for each next message; 2 to 4 hide it for a handler that waits on I/O
    (docs/concepts.md#pools-and-prefetch)"""
    handler_timeout: float = Field(0.0, ge=0, le=MAX_WAIT)
    """seconds a handler may take on one message (WebLogic's transaction timeout); 0, the
    default, sets none. Past it an `async def` handler is cancelled; a plain `def` one cannot
    be: it is reported at WARNING and its pool slot counted stuck until it returns (not ready
    while every slot of the listener is). Either way the delivery then fails with
    `mdb.errors.HandlerTimeout` and `redelivery` applies (docs/concepts.md#handler-timeouts)"""

    exactly_once: str | None = None
    """the name of a database (a key of `databases`): the handler's writes through its
    injected `AsyncSession`, its sends and the message commit together, and a copy already
    processed is settled without running it again; each message runs in a database
    transaction of its own, or each batch with `max_messages_per_transaction`
    (docs/exactly-once.md)"""
    paused: bool = False
    """start paused: the listener subscribes to nothing and takes no message until it is
    resumed (`mdb resume`, `Container.resume`); a restarted container starts with this value,
    whatever it was paused or resumed to while it ran (docs/health.md#pause-and-resume)"""

    @field_validator("error_destination")
    @classmethod
    def _destination(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Destination.parse(value)
            except ConfigurationError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("subscription")
    @classmethod
    def _subscription_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            name = value.format(app="a", server="s", listener="l")
        except (KeyError, IndexError, ValueError):
            raise ValueError("the only placeholders are {app}, {server} and {listener}") from None
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError("may contain only letters, digits, '_', '-' and the placeholders "
                             "{app}, {server} and {listener}")
        return value


class Overrides(BaseModel):
    """Options that settings set, each optional: only those set apply (read them with
    ``model_dump(exclude_unset=True)``). Built by ``overrides_of``."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def overrides_of(options: type[BaseModel], name: str, doc: str) -> type[Overrides]:
    """A model with the fields of ``options``, each optional with the same type and description.
    Types are checked when settings are read; bounds and validators are not, because an
    override is one layer of several: they apply once the layers are merged into ``options``
    (``ListenerSpec.with_settings``, whose errors name ``listeners.<name>.<option>``)."""
    fields: dict[str, Any] = {}
    for field, info in options.model_fields.items():
        annotation: Any = info.annotation  # a type: ``| None`` makes it optional
        fields[field] = (annotation | None, Field(None, description=info.description))
    return create_model(name, __base__=Overrides, __module__=__name__, __doc__=doc, **fields)


if TYPE_CHECKING:  # the fields are made at run time; to a type checker it is an Overrides
    ListenerOverrides = Overrides
else:
    ListenerOverrides = overrides_of(
        ListenerOptions, "ListenerOverrides",
        "The options of ``ListenerOptions``, all optional: what settings may change for a "
        "listener.")
