"""``weblogic-ejb-jar.xml``, WebLogic's own deployment descriptor (WebLogic 9 to 14): the
``<message-driven-descriptor>`` of each bean (its pool, destination, connection factory,
subscription and reconnect settings), its transaction timeout, and the message destination
descriptors that resolve ``ejb-jar.xml``'s message-destination-links."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from mdb.commands.migrate.application import Application
from mdb.commands.migrate.bean import Source
from mdb.commands.migrate.descriptors.xml_reading import Read, Table, Walk, local, text, version
from mdb.commands.migrate.model import (
    DOCUMENTATION,
    JNDI,
    NOT_AN_MDB_SETTING,
    RESOURCE,
    SECURITY,
    TIMER,
    Rule,
)

NAMESPACES = {
    "http://www.bea.com/ns/weblogic/90": "WebLogic 9",
    "http://www.bea.com/ns/weblogic/weblogic-ejb-jar": "WebLogic 10.0",
    "http://xmlns.oracle.com/weblogic/weblogic-ejb-jar": "WebLogic 10.3 to 14.1",
}
SCHEMA = "WebLogic's weblogic-ejb-jar schema of its namespace (weblogic-ejb-jar.xsd)"

_THREADS = Rule(instead="a work manager bounds WebLogic's threads: mdb's concurrency is `pool` "
                        "per member and `mdb run --workers N` processes")
_NOT_A_LISTENER = Rule(instead="the descriptor of a session or entity bean, not a message "
                               "listener: not migrated")

_OTHER_KINDS = ("entity-descriptor", "stateless-session-descriptor",
                "stateful-session-descriptor", "singleton-session-descriptor")

_ROOT: Table = {
    "description": DOCUMENTATION,
    "weblogic-enterprise-bean": Read(),
    "message-destination-descriptor": Read(Rule(
        "what a bean's message-destination-link names: its destination-jndi-name or "
        "destination-resource-link")),
    **{name: SECURITY for name in ("security-role-assignment", "run-as-role-assignment",
                                    "security-permission")},
    "transaction-isolation": Rule(instead="the isolation of the bean's database work: your "
                                          "database session's"),
    "idempotent-methods": NOT_AN_MDB_SETTING,
    "retry-methods-on-rollback": Rule(instead="retries of a rolled-back method: a failed "
                                              "delivery's are `listeners.NAME.redelivery`"),
    "enable-bean-class-redeploy": Rule(instead="redeploying classes while running: `mdb run "
                                               "--reload` in development"),
    "timer-implementation": TIMER,
    "disable-warning": Rule(instead="WebLogic's own log messages: nothing to migrate"),
    "work-manager": _THREADS,
    **{name: NOT_AN_MDB_SETTING for name in (
        "component-factory-class-name", "weblogic-compatibility", "coherence-cluster-ref",
        "managed-executor-service", "managed-scheduled-executor-service",
        "managed-thread-factory")},
}
_BEAN: Table = {
    "ejb-name": Read(Rule("the bean these settings are for")),
    "message-driven-descriptor": Read(),
    "transaction-descriptor": Read(),
    "dispatch-policy": _THREADS,
    **dict.fromkeys(_OTHER_KINDS, _NOT_A_LISTENER),
    "iiop-security-descriptor": SECURITY,
    **{name: SECURITY for name in ("run-as-principal-name", "create-as-principal-name",
                                    "remove-as-principal-name", "passivate-as-principal-name")},
    **{name: RESOURCE for name in ("resource-description", "resource-env-description",
                                    "ejb-reference-description",
                                    "service-reference-description")},
    **{name: NOT_AN_MDB_SETTING for name in (
        "enable-call-by-reference", "network-access-point", "clients-on-same-server",
        "jndi-name", "local-jndi-name", "remote-client-timeout", "stick-to-first-server")},
}
_MESSAGE_DRIVEN: Table = {
    "pool": Read(),
    "timer-descriptor": TIMER,
    "resource-adapter-jndi-name": "resourceAdapter",
    "destination-jndi-name": "destination",
    "destination-resource-link": "destination",
    "initial-context-factory": JNDI,
    "provider-url": JNDI,
    "connection-factory-jndi-name": "connectionFactory",
    "connection-factory-resource-link": "connectionFactory",
    "jms-polling-interval-seconds": "jmsPollingIntervalSeconds",
    "jms-client-id": "clientId",
    "generate-unique-jms-client-id": "generateUniqueJmsClientId",
    "durable-subscription-deletion": "durableSubscriptionDeletion",
    "max-messages-in-transaction": "maxMessagesInTransaction",
    "distributed-destination-connection": "distributedDestinationConnection",
    "topic-messages-distribution-mode": "topicMessagesDistributionMode",
    "use81-style-polling": Rule(instead="WebLogic 8.1's polling of a foreign provider's "
                                        "destination: mdb's subscriptions are pushed by the "
                                        "broker"),
    "init-suspend-seconds": "initSuspendSeconds",
    "max-suspend-seconds": "maxSuspendSeconds",
    "security-plugin": SECURITY,
}
_POOL: Table = {
    "max-beans-in-free-pool": "pool",
    "initial-beans-in-free-pool": Rule(instead="mdb starts the whole pool at once"),
    "idle-timeout-seconds": Rule(instead="mdb keeps its pool slots for the life of the "
                                         "process"),
}
_TRANSACTION: Table = {"trans-timeout-seconds": "transTimeoutSeconds"}
_DESTINATION: Table = {
    "message-destination-name": Read(),
    "destination-jndi-name": Read(),
    "destination-resource-link": Read(),
    "initial-context-factory": JNDI,
    "provider-url": JNDI,
}
TABLES: list[tuple[str, Table]] = [
    ("weblogic-ejb-jar", _ROOT), ("weblogic-enterprise-bean", _BEAN),
    ("message-driven-descriptor", _MESSAGE_DRIVEN), ("pool", _POOL),
    ("transaction-descriptor", _TRANSACTION), ("message-destination-descriptor", _DESTINATION)]
"""Every element of weblogic-ejb-jar.xml mdb migrate knows, by its parent (the mapping table
of the docs)."""


def read(root: ET.Element, file: str, app: Application) -> str:
    """Read what ``root`` (the file ``file``) says of each bean into ``app``; its version."""
    found_version = version(root, file, NAMESPACES)
    walk = Walk(file, app.report, SCHEMA)
    for _, element, where in walk.children(root, "", _ROOT):
        if local(element) == "weblogic-enterprise-bean":
            _read_bean(walk, element, where, app)
            continue
        name = text(walk.first(element, "message-destination-name", where))
        at = f"{where}[{name}]"
        for _, part, part_at in walk.children(element, at, _DESTINATION):
            if local(part) != "message-destination-name":
                app.links.give(name, Source.WEBLOGIC_EJB_JAR, walk.found(part, part_at),
                               walk.report)
    return found_version


def _read_bean(walk: Walk, element: ET.Element, path: str, app: Application) -> None:
    name = text(walk.first(element, "ejb-name", path))
    path = f"weblogic-enterprise-bean[{name}]"
    # Its kind is its descriptor's; one with none (a transaction-descriptor alone) is taken for
    # a message-driven bean's until ejb-jar.xml says otherwise (mdb.commands.migrate.reading).
    other = next((local(c) for c in element if local(c) in _OTHER_KINDS), None)
    if other is not None:
        walk.report.none(walk.found(element, f"{path}/{other}", name), _NOT_A_LISTENER)
        return
    bean = app.bean(name)
    for _, child, where in walk.children(element, path, _BEAN):
        kind = local(child)
        if kind == "ejb-name":
            app.described.setdefault(name, walk.found(child, where))
            continue
        table = _MESSAGE_DRIVEN if kind == "message-driven-descriptor" else _TRANSACTION
        for entry, setting, at in walk.children(child, where, table):
            if isinstance(entry, str):
                bean.give(entry, Source.WEBLOGIC_EJB_JAR, walk.found(setting, at), walk.report)
                continue
            for pool_entry, pool_setting, pool_at in walk.children(setting, at, _POOL):
                assert isinstance(pool_entry, str)  # the pool's children are settings
                bean.give(pool_entry, Source.WEBLOGIC_EJB_JAR,
                          walk.found(pool_setting, pool_at), walk.report)
