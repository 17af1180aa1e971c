"""A bean mapped: ``MigratedListener``, what the mapping makes of it, and ``BeanMapping``, what
every step of the mapping uses: a setting of the bean taken (whoever takes it settles it), an
option or a broker's setting written where mdb's declaration takes it, what the bean's module,
its template and its connection factory say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from mdb.commands.migrate.application import Application
from mdb.commands.migrate.bean import SETTINGS, Bean
from mdb.commands.migrate.descriptors.jms_module import (
    ConnectionFactory,
    JmsDestination,
    Template,
)
from mdb.commands.migrate.mapping.found_values import is_resource_link, origin_of, why_refused
from mdb.commands.migrate.mapping.migrated_topology import MigratedTopology
from mdb.commands.migrate.mapping.weblogic_names import snake
from mdb.commands.migrate.model import Found, Report, Rule
from mdb.commands.migrate.writers.toml_values import value
from mdb.config.broker_settings import BrokerSettings
from mdb.listeners.options import ListenerOptions


@dataclass
class MigratedListener:
    """A bean as an mdb listener: what the writers make its stub, settings and report line of."""

    name: str
    bean: str
    destination: str
    """``queue:NAME`` or ``topic:NAME``."""
    ejb_class: str
    about: str
    transacted: bool
    values: dict[str, Any] = field(default_factory=dict)
    """The options of ``[listeners.NAME]`` (``redelivery`` a table of its own)."""
    origins: dict[str, str] = field(default_factory=dict)
    """Option (``redelivery.limit``) → what it came from."""
    defaults: list[str] = field(default_factory=list)
    """WebLogic's defaults that mdb's differ from, where the inputs set nothing."""


class BeanMapping:
    """The mapping of one bean: what every step uses (its settings, taken; options and brokers'
    settings, written) and what its module says. The steps are ``DestinationSteps`` and
    ``OptionSteps``; ``mdb.commands.migrate.mapping.listeners`` runs them."""

    def __init__(self, app: Application, topology: MigratedTopology, bean: Bean, taken: set[str],
                 used: set[int]) -> None:
        self.app, self.topology, self.bean, self.used = app, topology, bean, used
        self.report: Report = app.report
        self.name = snake(bean.name, "bean")
        suffix = 2
        while self.name in taken:
            self.name, suffix = f"{snake(bean.name, 'bean')}_{suffix}", suffix + 1
        self.listener: MigratedListener | None = None
        self.module_destination: JmsDestination | None = None
        self.factory: ConnectionFactory | None = None

    # -- what every step uses -------------------------------------------------------------

    def take(self, setting: str) -> Found | None:
        """The bean's ``setting``, taken: whoever takes it settles it."""
        held = self.bean.settings.pop(setting, None)
        return None if held is None else held[1]

    def set(self, key: str, item: object, found: Found, model: type[BaseModel] = ListenerOptions,
            note: str = "") -> bool:
        """Write option ``key`` (``redelivery.delay``) = ``item`` from ``found``, if mdb's
        declaration takes it; else report why not."""
        assert self.listener is not None
        field_name = key.rpartition(".")[2]
        refused = why_refused(model, field_name, item)
        if refused:
            self.report.none(found, Rule(instead=f"mdb refuses {item!r} for {key} ({refused}): "
                                                 "mdb's default applies"))
            return False
        values = self.listener.values
        if "." in key:
            values = values.setdefault(key.partition(".")[0], {})
        values[field_name] = item
        self.listener.origins[key] = origin_of(found)
        self.report.became(found, f"listeners.{self.name}.{key} = {value(item)}", note)
        return True

    def broker(self, key: str, item: float | str, found: Found) -> None:
        """Set ``brokers.B.key`` on every broker of the listener's destination: a number
        where none is set or a larger one is (the smallest of the beans wins), a name where
        none is."""
        assert self.listener is not None
        refused = why_refused(BrokerSettings, key, item)
        if refused:
            self.report.none(found, Rule(instead=f"mdb refuses {item!r} for brokers.B.{key} "
                                                 f"({refused}): mdb's default applies"))
            return
        written = []
        for name in self.topology.brokers_of(self.listener.destination):
            broker = self.topology.brokers[name]
            held = broker.values.get(key)
            if held == item:
                written.append(f"brokers.{name}.{key} = {value(item)} (as for another bean)")
                continue
            if held is not None and not (isinstance(held, float) and isinstance(item, float)
                                         and item < held):
                continue
            broker.values[key] = item
            broker.origins[key] = origin_of(found)
            written.append(f"brokers.{name}.{key} = {value(item)}")
        if written:
            self.report.became(found, "; ".join(written))
        else:
            self.report.none(found, Rule(instead=f"the brokers of {self.listener.destination} "
                                                 f"have {key} from another bean already "
                                                 "(the smallest number wins)"))

    # -- what the module says -------------------------------------------------------------

    def delivery(self, name: str) -> Found | None:
        """The destination's delivery setting ``name``, else its template's."""
        destination = self.module_destination
        if destination is None:
            return None
        template = self.template()
        return self.first(destination.delivery.get(name),
                          None if template is None else template.delivery.get(name))

    def template(self) -> Template | None:
        destination = self.module_destination
        if destination is None or destination.template is None:
            return None
        module = next(m for m in self.topology.modules if m.file == destination.module)
        return module.templates[destination.template.value]

    def first(self, *candidates: Found | None) -> Found | None:
        """The first of ``candidates`` given; the others are reported overridden by it."""
        given = [c for c in candidates if c is not None]
        for other in given[1:]:
            self.report.none(other, Rule(instead=f"overridden by <{given[0].element}>"))
        return given[0] if given else None

    def factory_setting(self, name: str) -> Found | None:
        """The bean's connection factory's setting ``name``."""
        if self.factory is None:
            found = self.bean.value("connectionFactory")
            if found is None:
                return None
            self.take("connectionFactory")
            self.factory = self.topology.factory(found.value, is_resource_link(found))
            if self.factory is None:
                self.report.none(found, SETTINGS["connectionFactory"])
                self.factory = ConnectionFactory("", found)
                return None
            self.used.add(id(self.factory))
            self.report.became(found, f"the settings of connection factory {self.factory.name} "
                                      f"for listener {self.name}")
            self.report.became(self.factory.element, f"settings of listener {self.name}")
            for jndi in self.factory.jndi:
                self.report.became(jndi, f"how bean {self.bean.name} names it")
        return self.factory.settings.get(name)
