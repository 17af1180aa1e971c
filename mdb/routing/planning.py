"""Subscription planning: listener + topology → the subscriptions to create. Pure.

A listener consumes every member of its destination (a partitioned distributed topic stores
each message on one member), so it has one planned subscription per member, on the member's
broker. Every pool slot attaches to each of them, like the sessions of a JMS MDB pool.

Topic subscription names (documented in docs/distribution.md; changing them abandons durable
subscriptions, so they never change silently) are the same on every member:

* ``one-copy-per-app``:    ``<app>-<listener>``           shared by every process of the app
* ``one-copy-per-server``: ``<app>-<server>-<listener>``  one per process, stable across restarts
* the listener's ``subscription`` option replaces either; it may use the placeholders
  ``{app}``, ``{server}`` and ``{listener}``, and must use ``{server}`` with
  ``one-copy-per-server`` (else every server would share it: one copy per app).

App, server and listener names contain only letters, digits and ``_``, so the dashes keep the
parts apart and a per-app name can never equal a per-server one. Names contain no ``.``: brokers
use it as a path separator. A queue needs no name: its consumers compete for its messages.

Selectors: a queue listener's selector is the broker's to evaluate (its consumers compete, and
a message one of them does not select stays for the others). A topic listener's selector is
evaluated by the container (``PlannedSubscription.selector``), which settles a message that
does not match without running the handler: the subscription is the listener's own, so that
is the JMS outcome. Left to the broker, ActiveMQ would keep every message that does not match
in the subscription's queue for ever (measured on 5.17: a virtual topic copies every message
to every consumer queue), and RabbitMQ ignores selectors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mdb.config.settings import Settings
from mdb.errors import ConfigurationError
from mdb.listeners.listener import ListenerSpec
from mdb.listeners.options import Distribution
from mdb.messages.destinations import Destination, Kind
from mdb.messages.selector import Matcher, SelectorError, compile_selector
from mdb.messages.selector_check import check_broker_selector
from mdb.messages.topology import Member, Topology
from mdb.seam.broker import SubscriptionRequest


@dataclass(frozen=True, slots=True)
class PlannedSubscription:
    listener: str
    destination: Destination
    """The listener's logical destination, of which ``member`` is one."""
    member: Member
    request: SubscriptionRequest
    shared: bool
    selector: Matcher | None = field(default=None, compare=False)
    """Evaluated by the container on each delivery (topic listeners only, see above)."""

    @property
    def broker(self) -> str:
        return self.member.broker

    @property
    def name(self) -> str:
        """This member's subscription: its name, or the member queue."""
        return self.request.name or str(self.request.destination)

    @property
    def logical_name(self) -> str:
        """The listener's subscription over every member: the topic subscription's name (the
        same on each member), or the logical queue. A message is processed once per logical
        subscription, whichever member a copy of it comes through (the inbox, the ids of a
        handler's sends: docs/architecture.md, "Identity")."""
        return self.request.name or str(self.destination)


def subscription_name(spec: ListenerSpec, app: str, server: str) -> str | None:
    """The name of ``spec``'s subscription on each member; None for a queue. Raises
    ConfigurationError for a name that would not give the listener's distribution."""
    if spec.destination.kind is Kind.QUEUE:
        return None
    per_server = spec.options.distribution is Distribution.ONE_COPY_PER_SERVER
    template = spec.options.subscription
    if template is None:
        return f"{app}-{server}-{spec.name}" if per_server else f"{app}-{spec.name}"
    if per_server and "{server}" not in template:
        raise ConfigurationError(
            f"listener {spec.name!r}: subscription {template!r} has no '{{server}}' but the "
            f"distribution is one-copy-per-server: every server would share it (one copy per "
            f"app); add '{{server}}' to the name or use one-copy-per-app"
        )
    return template.format(app=app, server=server, listener=spec.name)


def plan(spec: ListenerSpec, topology: Topology, *, app: str,
         server: str) -> tuple[PlannedSubscription, ...]:
    """One subscription per member of ``spec``'s destination, with the listener's
    ``prefetch``, raised to ``max_messages_per_transaction`` when that is larger (a batch is
    what a slot already holds: a smaller prefetch would cap it silently)."""
    name = subscription_name(spec, app, server)
    topic = spec.destination.kind is Kind.TOPIC
    selector = spec.options.selector if spec.options.selector and spec.options.selector.strip() \
        else None
    matcher = _compiled(spec, selector) if topic and selector else None
    if selector and not topic:
        _checked(spec, selector)
    return tuple(
        PlannedSubscription(
            listener=spec.name,
            destination=spec.destination,
            member=member,
            request=SubscriptionRequest(
                destination=member.destination,
                name=name,
                durable=spec.options.durable,
                selector=None if topic else selector,
                prefetch=max(spec.options.prefetch,
                             spec.options.max_messages_per_transaction),
            ),
            shared=not topic or spec.options.distribution is Distribution.ONE_COPY_PER_APP,
            selector=matcher,
        )
        for member in topology.members(spec.destination)
    )


def _compiled(spec: ListenerSpec, selector: str) -> Matcher:
    try:
        return compile_selector(selector)
    except SelectorError as exc:
        raise ConfigurationError(
            f"listener {spec.name!r}: selector {selector!r} is not valid: {exc} (topic "
            "listeners' selectors are evaluated by mdb; see mdb.messages.selector for what"
            " it supports)"
        ) from None


def _checked(spec: ListenerSpec, selector: str) -> None:
    try:
        check_broker_selector(selector)
    except SelectorError as exc:
        raise ConfigurationError(
            f"listener {spec.name!r}: selector {selector!r} is not valid: {exc} (queue "
            "listeners' selectors are evaluated by the broker; mdb checks what it can first, "
            "see mdb.messages.selector_check)"
        ) from None


Planned = tuple[ListenerSpec, tuple[PlannedSubscription, ...]]
"""A listener with its settings applied, and its subscriptions: one per member."""


def plan_listeners(settings: Settings, listeners: Iterable[ListenerSpec]) -> list[Planned]:
    """Every listener with the settings' overrides applied, planned on the settings' topology.
    Raises ConfigurationError for two listeners of one name, an override naming no listener,
    or a listener that cannot be planned."""
    seen: dict[str, ListenerSpec] = {}
    for spec in listeners:
        if spec.name in seen and seen[spec.name].handler is not spec.handler:
            raise ConfigurationError(
                f"two listeners are named {spec.name!r} ({_where(seen[spec.name])} and "
                f"{_where(spec)}): give one of them @listener(..., name='...')"
            )
        seen[spec.name] = spec
    unknown = set(settings.listeners) - set(seen)
    if unknown:
        raise ConfigurationError(
            f"setting listeners.{sorted(unknown)[0]}: no such listener; "
            f"listeners are: {', '.join(sorted(seen)) or 'none'}"
        )
    topology = settings.topology()
    planned = []
    for spec in seen.values():
        configured = spec.with_settings(settings.defaults, settings.listeners.get(spec.name))
        planned.append((configured, plan(configured, topology, app=settings.app,
                                         server=settings.server)))
    return planned


def slots_per_broker(where: Iterable[tuple[ListenerSpec, PlannedSubscription]],
                     ) -> dict[str, int]:
    """Pool slots per broker: each listener's pool on each of its members."""
    counts: dict[str, int] = {}
    for spec, planned in where:
        counts[planned.broker] = counts.get(planned.broker, 0) + spec.options.pool
    return counts


def _where(spec: ListenerSpec) -> str:
    return f"{spec.handler.__module__}.{spec.handler.__qualname__}"
