"""Everything read from the inputs of one migration: the message-driven beans, what names
their destinations, the JMS modules and the domain, and the report of it all."""

from __future__ import annotations

from dataclasses import dataclass, field

from mdb.commands.migrate.bean import Bean
from mdb.commands.migrate.descriptors.domain import Domain
from mdb.commands.migrate.descriptors.jms_module import JmsModule
from mdb.commands.migrate.model import Found, Report


@dataclass
class Application:
    report: Report = field(default_factory=Report)
    beans: dict[str, Bean] = field(default_factory=dict)
    defined: dict[str, Found] = field(default_factory=dict)
    """The element (or annotation) that defines each bean, by ``ejb-name``."""
    described: dict[str, Found] = field(default_factory=dict)
    """The ``weblogic-ejb-jar.xml`` element of each bean it describes, by ``ejb-name``."""
    links: Bean = field(default_factory=lambda: Bean("", what="message destination"))
    """What names each message destination's destination, by its name (a setting of its
    own): its mapped or lookup name, WebLogic's destination-jndi-name or
    destination-resource-link. WebLogic's descriptor beats ejb-jar.xml, as for a bean."""
    not_listeners: set[str] = field(default_factory=set)
    """The ``ejb-name`` of each session or entity bean of ``ejb-jar.xml``."""
    transactions: list[tuple[str, str, Found]] = field(default_factory=list)
    """(ejb-name, method name, trans-attribute) of each method of ``container-transaction``."""
    modules: list[JmsModule] = field(default_factory=list)
    domain: Domain | None = None
    metadata_complete: bool = False
    """An ``ejb-jar.xml`` says its annotations are not to be read (``metadata-complete``)."""
    read: list[tuple[str, str]] = field(default_factory=list)
    """Each file read and what it is (``ejb-jar.xml 3.2``)."""

    def bean(self, name: str) -> Bean:
        return self.beans.setdefault(name, Bean(name))
