"""``ejb-jar.xml``, the standard deployment descriptor (EJB 2.1, 3.x and Jakarta EE's 4.0):
its message-driven beans with their activation properties, and the assembly descriptor's
transaction attributes and message destinations. Session and entity beans are not
listeners: each is reported as not migrated."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from mdb.commands.migrate.application import Application
from mdb.commands.migrate.bean import Source
from mdb.commands.migrate.descriptors.activation import give_property
from mdb.commands.migrate.descriptors.xml_reading import Read, Table, Walk, local, text, version
from mdb.commands.migrate.model import (
    DOCUMENTATION,
    NOT_AN_MDB_SETTING,
    RESOURCE,
    SECURITY,
    TIMER,
    Rule,
)

NAMESPACES = {
    "http://java.sun.com/xml/ns/j2ee": "EJB 2.1",
    "http://java.sun.com/xml/ns/javaee": "EJB 3.0 and 3.1",
    "http://xmlns.jcp.org/xml/ns/javaee": "EJB 3.2",
    "https://jakarta.ee/xml/ns/jakartaee": "Jakarta EE (EJB 4.0)",
}
SCHEMA = "the ejb-jar schema of its namespace (ejb-jar_3_2.xsd, ejb-jar_4_0.xsd, ...)"

_NOT_A_LISTENER = Rule(instead="a session or entity bean, not a message listener: not "
                               "migrated")
_INTERCEPTOR = Rule(instead="code run around onMessage: call it from the handler")
_LIFECYCLE = Rule(instead="a lifecycle callback: a dependency-injector Resource starts before "
                          "the first message and stops after the last handler "
                          "(docs/concepts.md)")

_ROOT: Table = {
    **{name: DOCUMENTATION for name in ("description", "display-name", "icon",
                                         "module-name")},
    "enterprise-beans": Read(),
    "assembly-descriptor": Read(),
    "interceptors": _INTERCEPTOR,
    "relationships": NOT_AN_MDB_SETTING,
    "ejb-client-jar": NOT_AN_MDB_SETTING,
}
_BEANS: Table = {"message-driven": Read(), "session": Read(_NOT_A_LISTENER),
                 "entity": Read(_NOT_A_LISTENER)}
_MESSAGE_DRIVEN: Table = {
    **{name: DOCUMENTATION for name in ("description", "display-name", "icon")},
    "ejb-name": Read(Rule("the listener's name, `listeners.NAME`: the ejb-name in snake case")),
    "mapped-name": "destination",
    "ejb-class": "ejbClass",
    "messaging-type": "messagingType",
    "transaction-type": "transactionType",
    "message-destination-type": "destinationType",
    "message-destination-link": "destination",
    "activation-config": Read(),
    "timeout-method": TIMER,
    "timer": TIMER,
    "around-invoke": _INTERCEPTOR,
    "around-timeout": _INTERCEPTOR,
    "env-entry": Rule(instead="an environment entry: a setting of your own "
                              "(pydantic-settings) or a dependency (dependency-injector)"),
    **{name: RESOURCE for name in (
        "ejb-ref", "ejb-local-ref", "service-ref", "resource-ref", "resource-env-ref",
        "message-destination-ref", "persistence-context-ref", "persistence-unit-ref",
        "data-source", "jms-connection-factory", "jms-destination", "mail-session",
        "connection-factory", "administered-object", "context-service", "managed-executor",
        "managed-scheduled-executor", "managed-thread-factory")},
    "post-construct": _LIFECYCLE,
    "pre-destroy": _LIFECYCLE,
    "security-role-ref": SECURITY,
    "security-identity": SECURITY,
}
_ACTIVATION: Table = {
    "description": DOCUMENTATION,
    "activation-config-property": Read(Rule(
        "the setting its name says (the activation properties' table)")),
}
_ASSEMBLY: Table = {
    "security-role": SECURITY,
    "method-permission": SECURITY,
    "exclude-list": SECURITY,
    "container-transaction": Read(Rule(
        "the transaction attribute of each bean's onMessage (trans-attribute)")),
    "interceptor-binding": _INTERCEPTOR,
    "message-destination": Read(Rule(
        "what a bean's message-destination-link names: its mapped-name or lookup-name")),
    "application-exception": Rule(
        instead="an exception that does not roll back: in mdb every exception a handler "
                "raises fails the delivery; catch what should not"),
}
_DESTINATION: Table = {
    **{name: DOCUMENTATION for name in ("description", "display-name", "icon")},
    "message-destination-name": Read(),
    "mapped-name": Read(),
    "lookup-name": Read(),
}
TABLES: list[tuple[str, Table]] = [
    ("ejb-jar", _ROOT), ("enterprise-beans", _BEANS), ("message-driven", _MESSAGE_DRIVEN),
    ("activation-config", _ACTIVATION), ("assembly-descriptor", _ASSEMBLY),
    ("message-destination", _DESTINATION)]
"""Every element of ejb-jar.xml mdb migrate knows, by its parent (the mapping table of the
docs)."""


def read(root: ET.Element, file: str, app: Application) -> str:
    """Read the beans of ``root`` (the file ``file``) into ``app``; its version."""
    found_version = version(root, file, NAMESPACES)
    walk = Walk(file, app.report, SCHEMA)
    if root.get("metadata-complete", "").strip().lower() == "true":
        app.metadata_complete = True
    for _, element, where in walk.children(root, "", _ROOT):
        if local(element) == "enterprise-beans":
            for _, bean, at in walk.children(element, where, _BEANS):
                if local(bean) == "message-driven":
                    _read_bean(walk, bean, at, app)
                    continue
                name = next((text(c) for c in bean if local(c) == "ejb-name"), "")
                app.not_listeners.add(name)
                walk.report.none(walk.found(bean, f"{at}[{name}]", name), _NOT_A_LISTENER)
        else:
            _read_assembly(walk, element, where, app)
    return found_version


def _read_bean(walk: Walk, element: ET.Element, path: str, app: Application) -> None:
    name = text(walk.first(element, "ejb-name", path))
    path = f"message-driven[{name}]"
    bean = app.bean(name)
    for entry, child, where in walk.children(element, path, _MESSAGE_DRIVEN):
        if isinstance(entry, str):
            bean.give(entry, Source.EJB_JAR, walk.found(child, where), walk.report)
        elif local(child) == "ejb-name":
            app.defined.setdefault(name, walk.found(child, where))
        else:
            for _, prop, at in walk.children(child, where, _ACTIVATION):
                prop_name = text(walk.first(prop, "activation-config-property-name", at))
                value = next((text(c) for c in prop
                              if local(c) == "activation-config-property-value"), "")
                give_property(bean, prop_name, walk.found(
                    prop, f"{path}/activation-config-property[{prop_name}]", value),
                    Source.EJB_JAR, walk.report)


def _read_assembly(walk: Walk, element: ET.Element, path: str, app: Application) -> None:
    for _, child, where in walk.children(element, path, _ASSEMBLY):
        if local(child) == "message-destination":
            name = text(walk.first(child, "message-destination-name", where))
            at = f"{where}[{name}]"
            for _, part, part_at in walk.children(child, at, _DESTINATION):
                if local(part) != "message-destination-name":
                    app.links.give(name, Source.EJB_JAR, walk.found(part, part_at), walk.report)
            continue
        attribute = walk.found(walk.first(child, "trans-attribute", where),
                               f"{where}/trans-attribute")
        walk.report.none(attribute, Rule(instead="the attribute of each method below"))
        for method in child:
            if local(method) == "method":
                ejb_name = text(walk.first(method, "ejb-name", where))
                method_name = next((text(c) for c in method if local(c) == "method-name"), "*")
                app.transactions.append((ejb_name, method_name, walk.found(
                    method, f"{where}/method[{ejb_name}.{method_name}]", attribute.value)))
            elif local(method) not in ("trans-attribute", "description"):
                raise walk.found(method, f"{where}/{local(method)}").refuse(
                    "not an element of <container-transaction>",
                    f"check its spelling against {SCHEMA}")
