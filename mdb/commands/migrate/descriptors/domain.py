"""A WebLogic domain's ``config.xml`` (root ``<domain>``), for what a JMS module cannot say:
which JMS servers host its destinations. A sub-deployment targets JMS servers; each JMS
server becomes one mdb broker, and a uniform distributed destination one member on each.

Only the JMS servers, the servers (their listen addresses), the clusters they form and the
JMS system resources (their sub-deployments and targets) are read; the rest is the domain's
own configuration, not the application's, and is reported as one line.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from mdb.commands.migrate.descriptors.xml_reading import Read, Table, local, text, version
from mdb.commands.migrate.model import Found, Report, Rule

NAMESPACES = {
    "http://www.bea.com/ns/weblogic/90/domain": "WebLogic 9.0",
    "http://www.bea.com/ns/weblogic/920/domain": "WebLogic 9.2 and 10.0",
    "http://xmlns.oracle.com/weblogic/domain": "WebLogic 10.3 to 14.1",
}

_OTHERS = Rule(instead="the domain's own configuration, not the application's: not read")
TABLES: list[tuple[str, Table]] = [("domain", {
    "jms-server": Read(Rule("a broker, `brokers.B` (B: its name in lower case, `_` for "
                            "other characters), its `url` a guess to set")),
    "server": Read(Rule(instead="its listen-address is the guessed host of the brokers of its "
                                "JMS servers")),
    "jms-system-resource": Read(Rule(
        "with its sub-deployments, the members of the module's distributed destinations and "
        "the broker of each other destination")),
    "(any other element)": _OTHERS,
})]
"""What config.xml gives (the mapping table of the docs)."""


@dataclass(frozen=True)
class JmsServer:
    name: str
    element: Found
    host: str
    """The listen address of the server it is targeted to (``localhost`` when none is
    known)."""
    targets: frozenset[str]
    """The server it is targeted to and that server's cluster: a module targeted to either
    has a member of each of its default-targeted distributed destinations here."""


@dataclass
class Resource:
    """A JMS system resource: where its module is, its targets and sub-deployments."""

    element: Found
    module: str
    """The module's file name (``orders-jms.xml``), without its folder."""
    targets: list[str]
    sub_deployments: dict[str, tuple[Found, list[str]]] = field(default_factory=dict)
    """Name → (its element, the JMS servers or other targets it names)."""


@dataclass
class Domain:
    file: str
    version: str
    jms_servers: dict[str, JmsServer] = field(default_factory=dict)
    resources: dict[str, Resource] = field(default_factory=dict)
    """By module file name."""


def read(root: ET.Element, file: str, report: Report) -> Domain:
    domain = Domain(file, version(root, file, NAMESPACES))
    hosts: dict[str, str] = {}
    clusters: dict[str, str] = {}
    servers: list[tuple[ET.Element, Found]] = []
    others: list[str] = []
    for element in root:
        kind = local(element)
        name = _child(element, "name")
        if kind == "server":
            hosts[name] = _child(element, "listen-address") or "localhost"
            if cluster := _child(element, "cluster"):
                clusters[name] = cluster
        elif kind == "jms-server":
            servers.append((element, report.read(Found(file, f"jms-server[{name}]", name))))
        elif kind == "jms-system-resource":
            found = report.read(Found(file, f"jms-system-resource[{name}]", name))
            resource = Resource(found, PurePosixPath(_child(element, "descriptor-file-name"))
                                .name, _targets(_child(element, "target")))
            for sub in element:
                if local(sub) == "sub-deployment":
                    sub_name = _child(sub, "name")
                    resource.sub_deployments[sub_name] = (
                        report.read(Found(file, f"{found.element}/sub-deployment[{sub_name}]",
                                          _child(sub, "target"))),
                        _targets(_child(sub, "target")))
            domain.resources[resource.module] = resource
        else:
            others.append(kind)
    for element, found in servers:
        target = _child(element, "target").removesuffix(" (migratable)")
        domain.jms_servers[found.value] = JmsServer(
            found.value, found, hosts.get(target, "localhost"),
            frozenset(filter(None, (target, clusters.get(target)))))
    if others:
        report.none(report.read(Found(file, "domain/(other elements)",
                                      ", ".join(dict.fromkeys(others)))), _OTHERS)
    return domain


def _child(element: ET.Element, name: str) -> str:
    return next((text(c) for c in element if local(c) == name), "")


def _targets(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]
