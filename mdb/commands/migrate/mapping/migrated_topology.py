"""The JMS modules and the domain as mdb's brokers and destinations.

Each JMS server of the domain that hosts a destination of the modules becomes a broker
(``brokers.<its name in snake case>``), whose URL is a guess to set: the JMS server's host,
port 61613. Each destination of the modules becomes an mdb destination named as in its
module: a standalone one on the broker of its JMS server; a uniform distributed queue, or a
partitioned uniform distributed topic, with one member on each JMS server its sub-deployment
targets; a replicated one (every member holding every message) on its first JMS server's
broker; a weighted distributed queue with its members' queues as members. Without a domain
there is one broker, ``default``, and every destination is on it; a uniform distributed
destination's members are then unknown, which stops the migration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TypeVar

from mdb.commands.migrate.application import Application
from mdb.commands.migrate.descriptors.domain import Domain
from mdb.commands.migrate.descriptors.jms_module import ConnectionFactory, JmsDestination, JmsModule
from mdb.commands.migrate.mapping.weblogic_names import destination_name, snake
from mdb.commands.migrate.model import Found, Report, Rule

PORT = 61613
"""The port of the guessed broker URLs: STOMP's, the reference activemq.xml's."""
DEFAULT = "default"


@dataclass
class MigratedBroker:
    name: str
    url: str
    about: str
    """What it replaces, for the TOML's comment."""
    values: dict[str, object] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)


@dataclass
class MigratedDestination:
    """One mdb destination: its members (broker, physical name or None for the logical
    one), and what it was in WebLogic."""

    key: str
    members: list[tuple[str, str | None]]
    about: str
    source: JmsDestination


@dataclass
class MigratedTopology:
    brokers: dict[str, MigratedBroker]
    places: dict[str, MigratedDestination]
    """By the destination of the module (its module file and name)."""
    modules: list[JmsModule]

    def place(self, destination: JmsDestination) -> MigratedDestination:
        return self.places[f"{destination.module}#{destination.name}"]

    def destination(self, value: str, resource_link: bool) -> JmsDestination | None:
        """The module destination a bean names: by a JNDI name, or (``resource_link``) by its
        name in its module (``module#name`` or ``name``)."""
        return _named([d for m in self.modules for d in m.destinations.values()], value,
                      resource_link)

    def factory(self, value: str, resource_link: bool) -> ConnectionFactory | None:
        """The module connection factory a bean names, as ``destination`` finds one."""
        return _named([f for m in self.modules for f in m.factories.values()], value,
                      resource_link)

    def brokers_of(self, key: str | None) -> list[str]:
        """The brokers of the mdb destination ``key``; the first broker for one no module
        defines (it lives there)."""
        for place in self.places.values():
            if place.key == key:
                return list(dict.fromkeys(broker for broker, _ in place.members))
        return [next(iter(self.brokers))]


_Named = TypeVar("_Named", JmsDestination, ConnectionFactory)


def _named(candidates: list[_Named], value: str, resource_link: bool) -> _Named | None:
    name = value.rpartition("#")[2]
    return next((c for c in candidates if (c.name == name if resource_link
                                           else value in (j.value for j in c.jndi))), None)


def build(app: Application) -> MigratedTopology:
    """The topology of ``app``'s modules (and domain); ConfigurationError for a destination
    whose JMS servers cannot be told."""
    report = app.report
    topology = MigratedTopology({}, {}, app.modules)
    if app.domain is None:
        topology.brokers[DEFAULT] = MigratedBroker(DEFAULT, f"stomp+activemq://localhost:{PORT}",
                                           "every destination (no config.xml was given)")
    for module in app.modules:
        for destination in module.destinations.values():
            if not destination.members:
                _place(topology, app.domain, module, destination, report)
        for destination in module.destinations.values():
            if destination.members:
                _place_weighted(topology, module, destination, report)
    if app.domain is not None:
        _settle_domain(app.domain, topology, report)
        if not topology.brokers:
            topology.brokers[DEFAULT] = MigratedBroker(DEFAULT, f"stomp+activemq://localhost:{PORT}",
                                               "every destination")
    return topology


def _place(topology: MigratedTopology, domain: Domain | None, module: JmsModule,
           destination: JmsDestination, report: Report) -> None:
    servers = _servers(domain, module, destination)
    # A distributed topic replicates unless it is partitioned (WebLogic's default).
    replicated = destination.kind == "topic" and destination.shape != "" and (
        destination.forwarding is None or destination.forwarding.value.lower() == "replicated")
    if destination.shape == "" and len(servers) != 1:
        where = destination.sub_deployment or destination.element
        raise where.refuse(f"a standalone {destination.kind} is on one JMS server; this names "
                           f"{len(servers)} ({', '.join(servers)})",
                           "target its sub-deployment to one JMS server")
    brokers = [_broker(topology, domain, server) for server in servers]
    if replicated:
        brokers = brokers[:1]
    key = f"{destination.kind}:{destination_name(destination.name)}"
    shape = {"": "", "uniform": "uniform distributed ", "weighted": "distributed "}
    about = f"{shape[destination.shape]}{destination.kind} {destination.name}" + (
        ", replicated: one member holds every message" if replicated else "")
    place = MigratedDestination(key, [(b, None) for b in brokers], about, destination)
    topology.places[f"{module.file}#{destination.name}"] = place
    at = ", ".join(brokers)
    report.became(destination.element, f'destinations."{key}"',
                  f"{'members on' if len(brokers) > 1 else 'on'} {at}")
    for jndi in destination.jndi:
        report.became(jndi, f"`{key}` where a bean names it")
    if destination.sub_deployment is not None:
        report.became(destination.sub_deployment, f"the brokers of `{key}`: {at}")
    if destination.template is not None:
        report.became(destination.template, f"the settings of `{key}` it sets none of")
    if destination.forwarding is None:
        return
    if replicated:
        report.none(destination.forwarding, Rule(instead=(
            "Replicated: every member held every message, so mdb needs one: the topic on the "
            f"first JMS server's broker, {brokers[0]}; to spread the load over the brokers, "
            "make it Partitioned")))
    else:
        report.became(destination.forwarding, f'destinations."{key}".members',
                      "partitioned: each message is on one member; listeners consume all")


def _place_weighted(topology: MigratedTopology, module: JmsModule, destination: JmsDestination,
                    report: Report) -> None:
    """A weighted distributed destination: its members are queues (or topics) of the
    module, each where it is."""
    members: list[tuple[str, str | None]] = []
    for member in destination.members:
        place = topology.places[f"{module.file}#{member.value}"]
        members.append((place.members[0][0], destination_name(member.value)))
    if destination.kind == "topic":
        members = members[:1]  # a weighted distributed topic replicates to every member
    key = f"{destination.kind}:{destination_name(destination.name)}"
    topology.places[f"{module.file}#{destination.name}"] = MigratedDestination(
        key, members, f"distributed {destination.kind} {destination.name}", destination)
    shown = ", ".join(f"{name} on {broker}" for broker, name in members)
    report.became(destination.element, f'destinations."{key}".members', shown)
    for jndi in destination.jndi:
        report.became(jndi, f"`{key}` where a bean names it")
    for member in destination.members:
        if destination.kind == "topic" and member is not destination.members[0]:
            report.none(member, Rule(instead="a weighted distributed topic copied every "
                                             "message to every member: mdb needs one, the "
                                             "first"))
        else:
            report.became(member, f'a member of destinations."{key}"')
    if destination.template is not None:
        report.became(destination.template, f"the settings of `{key}` it sets none of")


def _servers(domain: Domain | None, module: JmsModule,
             destination: JmsDestination) -> list[str]:
    """The JMS servers of a (not weighted) destination: those its sub-deployment targets, or,
    without one, those of the module's targets."""
    if domain is None:
        if destination.shape == "uniform":
            raise destination.element.refuse(
                "its members are the JMS servers its sub-deployment targets, which only the "
                "domain's config.xml says",
                "give the domain's config/config.xml too (or the folder holding it)")
        return [DEFAULT]
    resource = domain.resources.get(PurePosixPath(module.file.rpartition("!")[2]).name)
    if resource is None:
        raise destination.element.refuse(
            "the domain's config.xml has no jms-system-resource whose descriptor-file-name is "
            "this module's file, so its JMS servers are unknown",
            "give the config.xml of the domain this module is deployed in")
    if destination.sub_deployment is None:
        servers = [name for name, server in domain.jms_servers.items()
                   if server.targets & set(resource.targets)]
    else:
        sub = resource.sub_deployments.get(destination.sub_deployment.value)
        if sub is None:
            raise destination.sub_deployment.refuse(
                f"jms-system-resource {resource.element.value} of the domain has no "
                "sub-deployment of this name", "correct the name, or give the right config.xml")
        servers = sub[1]
    unknown = [name for name in servers if name not in domain.jms_servers]
    if unknown or not servers:
        raise (destination.sub_deployment or destination.element).refuse(
            f"targets {', '.join(unknown) or 'no JMS server'}, which the domain does not "
            "define as JMS servers", "target it to the domain's JMS servers")
    return servers


def _broker(topology: MigratedTopology, domain: Domain | None, server: str) -> str:
    if domain is None:
        return DEFAULT
    name = snake(server, "jms_server")
    if name not in topology.brokers:
        jms = domain.jms_servers[server]
        topology.brokers[name] = MigratedBroker(
            name, f"stomp+activemq://{jms.host}:{PORT}",
            f"JMS server {server} (on {jms.host}): set url to the ActiveMQ broker that "
            "replaces it")
    return name


def _settle_domain(domain: Domain, topology: MigratedTopology, report: Report) -> None:
    """Say what became of each JMS server and JMS system resource of the domain."""
    for server in domain.jms_servers.values():
        name = snake(server.name, "jms_server")
        if name in topology.brokers:
            report.became(server.element, f"brokers.{name}",
                          f"url {topology.brokers[name].url} is a guess: set it to the "
                          "ActiveMQ broker that replaces this JMS server")
        else:
            report.none(server.element, Rule(instead="hosts none of the modules' "
                                                     "destinations: not migrated"))
    given = {PurePosixPath(m.file.rpartition("!")[2]).name for m in topology.modules}
    used = {(p.source.module, p.source.sub_deployment.value) for p in topology.places.values()
            if p.source.sub_deployment is not None}
    for module_file, resource in domain.resources.items():
        if module_file not in given:
            report.none(resource.element, Rule(instead=f"its module, {module_file}, was not "
                                                       "given: not migrated"))
            for found, _ in resource.sub_deployments.values():
                report.none(found, Rule(instead="a sub-deployment of a module not given"))
            continue
        report.became(resource.element, "the brokers of its module's destinations")
        for sub_name, (found, _) in resource.sub_deployments.items():
            if any(name == sub_name and PurePosixPath(file.rpartition("!")[2]).name ==
                   module_file for file, name in used):
                report.became(found, "the brokers of the destinations it targets")
            else:
                report.none(found, Rule(instead="no destination of the module uses it"))


def unused(found: Found, report: Report) -> None:
    """Settle a setting of a destination no bean listens on, or of a factory or template no
    bean uses."""
    report.none(found, Rule(instead="of a destination, template or connection factory no "
                                    "bean uses: nothing to migrate (producers' settings are "
                                    "their own)"))
