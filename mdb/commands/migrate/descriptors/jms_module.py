"""A WebLogic JMS module (``*-jms.xml``, root ``<weblogic-jms>``): its destinations (queues,
topics, uniform and weighted distributed ones), templates and connection factories, with the
settings of each that matter to a message-driven bean.

What a setting becomes is settled where a bean uses it (``mdb.commands.migrate.mapping.listeners``);
the rest of the module is settled here, each element with why it has no listener equivalent
(most are the broker's own settings: ActiveMQ has its own in ``activemq.xml``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from mdb.commands.migrate.descriptors.xml_reading import Read, Table, Walk, local, version
from mdb.commands.migrate.model import NOT_AN_MDB_SETTING, XA, Found, Report, Rule

NAMESPACES = {
    "http://www.bea.com/ns/weblogic/90": "WebLogic 9",
    "http://www.bea.com/ns/weblogic/weblogic-jms": "WebLogic 10.0",
    "http://xmlns.oracle.com/weblogic/weblogic-jms": "WebLogic 10.3 to 14.1",
}
SCHEMA = "WebLogic's weblogic-jms schema (weblogic-jms.xsd)"

_BROKER = Rule(instead="a setting of the broker's destination with no listener equivalent: "
                       "ActiveMQ has its own in activemq.xml (destination policies, "
                       "systemUsage)")
_PRODUCERS = Rule(instead="what producers send (or a default of it): mdb's sends are "
                          "persistent and carry what the handler gives `ctx.send`; an "
                          "override on the broker is ActiveMQ's, in activemq.xml")
_UNIT_OF_ORDER = Rule(instead="unit of order: mdb keeps per-key order with a `key` on the send "
                              "and `pool = 1` (docs/distribution.md)")
_FORWARDING = Rule(instead="WebLogic forwarded the messages of a member that had no consumers: "
                           "mdb consumes every member, so none waits for want of one")
_SAF = Rule(instead="WebLogic's store-and-forward: mdb's outbox keeps messages while every "
                    "member is down and forwards them "
                    "(docs/exactly-once.md#producers-the-outbox-and-store-and-forward)")

_FAILURE: Table = {
    "redelivery-limit": Read(Rule(
        "`listeners.NAME.redelivery.limit` of the beans on the destination",
        "-1 (no limit) has none: mdb bounds every limit, and its default, 5, applies")),
    "error-destination": Read(Rule(
        "`listeners.NAME.error_destination` of the beans on the destination",
        "without one WebLogic deleted a message past its limit; mdb moves it to "
        "`queue:NAME.DLQ`")),
    "expiration-policy": Read(Rule(
        instead="what the broker does with an expired message: ActiveMQ moves it to "
                "ActiveMQ.DLQ (as Redirect, to its own dead-letter queue), or drops it with "
                "`processExpired=\"false\"` on its dead-letter strategy (Discard); Log has no "
                "equivalent")),
    "expiration-logging-policy": Rule(instead="logging expired messages: the broker's"),
}
_OVERRIDES: Table = {
    "redelivery-delay": Read(Rule(
        "`listeners.NAME.redelivery.delay` of the beans on the destination, with "
        "`backoff = 1` (WebLogic waits the same delay each time)",
        "-1 (no override): the connection factory's default-redelivery-delay")),
    "delivery-mode": _PRODUCERS,
    "time-to-live": _PRODUCERS,
    "time-to-deliver": _PRODUCERS,
    "priority": _PRODUCERS,
}
_SHARED: Table = {
    "notes": NOT_AN_MDB_SETTING,
    "template": Read(Rule("the template whose settings the destination takes where it sets "
                          "none")),
    "delivery-failure-params": Read(),
    "delivery-params-overrides": Read(),
    **{name: _BROKER for name in (
        "thresholds", "quota", "message-logging-params", "attach-sender",
        "production-paused-at-startup", "insertion-paused-at-startup",
        "consumption-paused-at-startup", "maximum-message-size", "destination-key",
        "saf-export-policy", "messaging-performance-preference",
        "unit-of-work-handling-policy", "incomplete-work-expiration-time", "multicast",
        "group-params")},
    "default-unit-of-order": _UNIT_OF_ORDER,
}
_TEMPLATE: Table = {name: entry for name, entry in _SHARED.items() if name != "template"}
_DESTINATION: Table = {
    **_SHARED,
    "sub-deployment-name": Read(Rule(
        "the brokers of the destination: one per JMS server its sub-deployment targets "
        "(config.xml), `brokers.B`")),
    "default-targeting-enabled": Rule(
        instead="without a sub-deployment the members are the JMS servers of the module's "
                "targets (config.xml)"),
    "jndi-name": Read(Rule("how beans name the destination; mdb names it by the module's "
                           "name of it")),
    "local-jndi-name": Read(Rule("as jndi-name")),
    "jms-create-destination-identifier": Rule(
        instead="the name for `Session.createQueue`: mdb names the destination by its "
                "module name"),
    "unit-of-order-routing": _UNIT_OF_ORDER,
    "load-balancing-policy": Rule(
        instead="how producers pick a member: mdb's round robin, or by `key` "
                "(docs/distribution.md)"),
    "forward-delay": _FORWARDING,
    "reset-delivery-count-on-forward": _FORWARDING,
    "forwarding-policy": Read(Rule(
        "Partitioned: `destinations.\"topic:NAME\".members`, one per JMS server",
        "Replicated (the default): every member held every message, so mdb needs one: the "
        "topic on the first JMS server's broker; to spread the load, make it Partitioned")),
    "distributed-queue-member": Read(),
    "distributed-topic-member": Read(),
}
_MEMBER: Table = {
    "notes": NOT_AN_MDB_SETTING,
    "weight": Rule(instead="how producers weigh the members: mdb's round robin, or by `key`"),
    "physical-destination-name": Read(Rule(
        "a member, `destinations.\"KIND:NAME\".members`: the module's queue or topic of that "
        "name, on its JMS server's broker")),
}
_CLIENT: Table = {
    "client-id": Read(Rule(
        "the first part of `listeners.NAME.subscription` of the beans using the factory that "
        "give no client id of their own")),
    "client-id-policy": Rule(
        instead="Unrestricted is how mdb's subscriptions behave (one name on every member, "
                "shared as the distribution says); Restricted allowed one connection per "
                "client id, which mdb does not need"),
    "subscription-sharing-policy": Rule(
        instead="Sharable is one-copy-per-app's shared subscription, Exclusive a "
                "subscription of each server's own: `listeners.NAME.distribution` says it "
                "per listener"),
    "acknowledge-policy": Rule(instead="mdb acknowledges each message itself, All and "
                                       "Previous alike"),
    "allow-close-in-onMessage": Rule(instead="a handler never closes mdb's connection"),
    "messages-maximum": Read(Rule(
        "`listeners.NAME.prefetch` of the beans using the factory",
        "-1 (no limit) has none: mdb's prefetch is bounded")),
    "multicast-overrun-policy": Rule(instead="mdb has no multicast"),
    "synchronous-prefetch-mode": Rule(instead="for synchronous consumers; a listener's "
                                              "prefetch is `prefetch`"),
    "reconnect-policy": Read(Rule(
        instead="mdb reconnects consumers and producers alike (all): none and producer have "
                "no equivalent")),
    "reconnect-blocking-millis": Read(Rule(
        "`brokers.B.send_wait_for_reconnect` (seconds) of the brokers of the beans using the "
        "factory")),
    "total-reconnect-period-millis": Read(Rule(
        "`brokers.B.reconnect_give_up_after` (seconds)",
        "past it mdb reports the broker failed and keeps trying; -1 (for ever): none")),
}
_DELIVERY_DEFAULTS: Table = {
    "default-redelivery-delay": Read(Rule(
        "`listeners.NAME.redelivery.delay` of the beans using the factory whose destination "
        "sets no redelivery-delay")),
    "send-timeout": Rule(instead="how long a send blocks on a full destination: mdb's send "
                                 "waits `receipt_timeout` for the broker's receipt"),
    **{name: _PRODUCERS for name in (
        "default-delivery-mode", "default-time-to-deliver", "default-time-to-live",
        "default-priority", "default-compression-threshold")},
    "default-unit-of-order": _UNIT_OF_ORDER,
}
_TRANSACTION: Table = {
    "transaction-timeout": Rule(instead="the timeout of a client's transacted session; a "
                                        "bean's is its trans-timeout-seconds "
                                        "(`handler_timeout`)"),
    "xa-connection-factory-enabled": Rule(instead=XA),
}
_FACTORY: Table = {
    "notes": NOT_AN_MDB_SETTING,
    "sub-deployment-name": Rule(instead="where WebLogic deployed the factory: mdb connects to "
                                        "`brokers`"),
    "default-targeting-enabled": Rule(instead="where WebLogic deployed the factory: mdb "
                                              "connects to `brokers`"),
    "jndi-name": Read(Rule("how beans name the factory (connection-factory-jndi-name)")),
    "local-jndi-name": Read(Rule("as jndi-name")),
    "client-params": Read(),
    "default-delivery-params": Read(),
    "transaction-params": Read(),
    "load-balancing-params": Rule(
        instead="how a producer picks a member: mdb's round robin, or by `key`; a handler's "
                "send prefers the members on the broker of its message (docs/distribution.md)"),
    "security-params": Rule(instead="JMSXUserID and the like: the broker's"),
    "flow-control-params": Rule(instead="producer flow control: the broker's (ActiveMQ's "
                                        "producerFlowControl)"),
}
_ROOT: Table = {
    "notes": NOT_AN_MDB_SETTING,
    "version": NOT_AN_MDB_SETTING,
    **{kind: Read() for kind in (
        "connection-factory", "template", "queue", "topic", "uniform-distributed-queue",
        "uniform-distributed-topic", "distributed-queue", "distributed-topic")},
    "foreign-server": Rule(
        instead="destinations of another JMS provider bound into WebLogic's JNDI: point "
                "`brokers.B.url` at that broker and name its destinations in `destinations`"),
    "saf-imported-destinations": _SAF,
    "saf-remote-context": _SAF,
    "saf-error-handling": _SAF,
    "quota": _BROKER,
    "destination-key": _BROKER,
}

TABLES: list[tuple[str, Table]] = [
    ("weblogic-jms", _ROOT), ("queue, topic and their distributed kinds", _DESTINATION),
    ("template", _TEMPLATE),
    ("delivery-failure-params", _FAILURE), ("delivery-params-overrides", _OVERRIDES),
    ("distributed-queue-member, distributed-topic-member", _MEMBER),
    ("connection-factory", _FACTORY), ("client-params", _CLIENT),
    ("default-delivery-params", _DELIVERY_DEFAULTS), ("transaction-params", _TRANSACTION),
]
"""Every element of a JMS module, by its parent (the mapping table of the docs)."""

_KINDS = {"queue": ("queue", ""), "topic": ("topic", ""),
          "uniform-distributed-queue": ("queue", "uniform"),
          "uniform-distributed-topic": ("topic", "uniform"),
          "distributed-queue": ("queue", "weighted"), "distributed-topic": ("topic", "weighted")}
_ENUMERATIONS = {
    "expiration-policy": ("Discard", "Log", "Redirect", "None"),
    "forwarding-policy": ("Partitioned", "Replicated"),
    "reconnect-policy": ("none", "producer", "all"),
}


@dataclass
class Template:
    name: str
    element: Found
    delivery: dict[str, Found] = field(default_factory=dict)
    """redelivery-limit, redelivery-delay, error-destination: as found."""


@dataclass
class JmsDestination:
    name: str
    kind: str
    """``queue`` or ``topic``."""
    shape: str
    """``""`` (standalone), ``uniform`` or ``weighted`` (distributed)."""
    element: Found
    module: str
    """The module's file."""
    jndi: list[Found] = field(default_factory=list)
    sub_deployment: Found | None = None
    template: Found | None = None
    delivery: dict[str, Found] = field(default_factory=dict)
    forwarding: Found | None = None
    members: list[Found] = field(default_factory=list)
    """A weighted distributed destination's: the physical destination of each."""


@dataclass
class ConnectionFactory:
    name: str
    element: Found
    jndi: list[Found] = field(default_factory=list)
    settings: dict[str, Found] = field(default_factory=dict)
    """client-id, messages-maximum, reconnect-blocking-millis,
    total-reconnect-period-millis, default-redelivery-delay: as found."""


@dataclass
class JmsModule:
    file: str
    version: str
    destinations: dict[str, JmsDestination] = field(default_factory=dict)
    templates: dict[str, Template] = field(default_factory=dict)
    factories: dict[str, ConnectionFactory] = field(default_factory=dict)


def read(root: ET.Element, file: str, report: Report) -> JmsModule:
    """The module of ``root`` (the file ``file``); ConfigurationError for an element or a
    value its schema does not allow, and for a template, member or error destination the
    module does not define."""
    module = JmsModule(file, version(root, file, NAMESPACES))
    walk = Walk(file, report, SCHEMA)
    for _, element, where in walk.children(root, "", _ROOT):
        kind = local(element)
        name = element.get("name", "")
        path = f"{kind}[{name}]"
        if not name:
            raise walk.found(element, where).refuse("has no name attribute",
                                                    "give it the name WebLogic knows it by")
        found = walk.found(element, path, name)
        if kind == "connection-factory":
            factory = ConnectionFactory(name, found)
            _read_factory(walk, element, path, factory)
            module.factories[name] = factory
        elif kind == "template":
            template = Template(name, found)
            _read_shared(walk, element, path, template.delivery, _TEMPLATE)
            module.templates[name] = template
        else:
            destination = JmsDestination(name, *_KINDS[kind], found, file)
            _read_destination(walk, element, path, destination)
            module.destinations[name] = destination
    _check_references(module)
    return module


def _read_shared(walk: Walk, element: ET.Element, path: str, delivery: dict[str, Found],
                 table: Table) -> list[tuple[str, ET.Element, str]]:
    """Read the delivery settings of a destination or template into ``delivery``; the other
    children its reader handles: (name, element, path)."""
    rest = []
    for _, child, where in walk.children(element, path, table):
        name = local(child)
        if name in ("delivery-failure-params", "delivery-params-overrides"):
            inner = _FAILURE if name == "delivery-failure-params" else _OVERRIDES
            for entry, setting, at in walk.children(child, where, inner):
                _keep(walk, entry, _checked(walk.found(setting, at)), delivery)
        else:
            rest.append((name, child, where))
    return rest


def _read_destination(walk: Walk, element: ET.Element, path: str,
                      destination: JmsDestination) -> None:
    for name, child, where in _read_shared(walk, element, path, destination.delivery,
                                           _DESTINATION):
        if name.endswith("-member"):
            where = f"{where}[{child.get('name', '')}]"
        found = walk.found(child, where)
        if name in ("jndi-name", "local-jndi-name"):
            destination.jndi.append(found)
        elif name == "sub-deployment-name":
            destination.sub_deployment = found
        elif name == "template":
            destination.template = found
        elif name == "forwarding-policy":
            destination.forwarding = _checked(found)
        else:  # a weighted distributed destination's member
            walk.report.none(found, Rule(instead="a member: below"))
            for _, setting, at in walk.children(child, where, _MEMBER):
                destination.members.append(walk.found(setting, at))
    if destination.members and destination.shape != "weighted":
        raise destination.element.refuse("has members", "only a distributed-queue or "
                                                        "distributed-topic lists its members")


def _read_factory(walk: Walk, element: ET.Element, path: str,
                  factory: ConnectionFactory) -> None:
    tables = {"client-params": _CLIENT, "default-delivery-params": _DELIVERY_DEFAULTS,
              "transaction-params": _TRANSACTION}
    for _, child, where in walk.children(element, path, _FACTORY):
        name = local(child)
        if name in tables:
            for entry, setting, at in walk.children(child, where, tables[name]):
                _keep(walk, entry, _checked(walk.found(setting, at)), factory.settings)
        else:
            factory.jndi.append(walk.found(child, where))


def _keep(walk: Walk, entry: str | Read, found: Found, into: dict[str, Found]) -> None:
    """Keep ``found`` for the beans that use its destination or factory; one whose value
    only needed checking (its ``Read`` has a rule with nothing it becomes) is settled now."""
    name = found.element.rpartition("/")[2]
    if isinstance(entry, Read) and entry.rule is not None and not entry.rule.becomes:
        walk.report.none(found, entry.rule)
    else:
        into[name] = found


def _checked(found: Found) -> Found:
    """``found``, whose value its schema allows; ConfigurationError if not. A whole number
    of milliseconds or a limit may be -1 (WebLogic's "none" or "for ever")."""
    name = found.element.rpartition("/")[2]
    allowed = _ENUMERATIONS.get(name)
    if allowed is not None:
        if found.value.lower() not in {a.lower() for a in allowed}:
            raise found.refuse("not a value WebLogic allows here",
                               f"write one of {', '.join(allowed)}")
    elif name.endswith(("-millis", "-delay", "-limit", "-maximum")) and not _whole(found.value):
        raise found.refuse("not a whole number", "write a number (-1 for none)")
    return found


def _whole(text: str) -> bool:
    return text.lstrip("-").isdigit() and int(text) >= -1


def _check_references(module: JmsModule) -> None:
    """Every template, member and error destination a module names is one of its own."""
    for destination in module.destinations.values():
        if destination.template and destination.template.value not in module.templates:
            raise destination.template.refuse(
                "the module defines no template of this name",
                f"add <template name={destination.template.value!r}> or correct the name")
        for member in destination.members:
            if member.value not in module.destinations:
                raise member.refuse("the module defines no queue or topic of this name",
                                    "add it, or correct the name")
    deliveries = [d.delivery for d in module.destinations.values()]
    for delivery in [*deliveries, *(t.delivery for t in module.templates.values())]:
        error = delivery.get("error-destination")
        if error is not None and error.value not in module.destinations:
            raise error.refuse("the module defines no destination of this name",
                               "name one of its queues or topics")
