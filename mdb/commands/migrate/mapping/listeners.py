"""Each message-driven bean as an mdb listener: its destination, its listener options (the
``[listeners.NAME]`` table of the settings) and what it changes of its brokers' settings, by
the rules ``mdb.commands.migrate.bean.SETTINGS`` states.

A value is written only where an input gave it, with the input it came from, except a topic
listener's distribution, which is always decided and said. A value mdb's own declaration
refuses (``ListenerOptions``, ``Redelivery``, ``BrokerSettings``: their bounds) is not
written, and the report says why; a value the input's own schema refuses (a pool of
"lots", a transaction attribute a bean may not have) stops the migration.
"""

from __future__ import annotations

from collections.abc import Iterator

from mdb.commands.migrate.application import Application
from mdb.commands.migrate.bean import SETTINGS
from mdb.commands.migrate.descriptors.jms_module import JmsModule
from mdb.commands.migrate.mapping.bean_mapping import MigratedListener
from mdb.commands.migrate.mapping.destination_steps import DestinationSteps
from mdb.commands.migrate.mapping.found_values import choice, jms_listener
from mdb.commands.migrate.mapping.migrated_topology import MigratedTopology, unused
from mdb.commands.migrate.mapping.option_steps import OptionSteps
from mdb.commands.migrate.mapping.weblogic_names import snake
from mdb.commands.migrate.model import Found, Rule

_TOPIC_ONLY = ("subscriptionDurability", "subscriptionName", "clientId",
               "topicMessagesDistributionMode", "generateUniqueJmsClientId",
               "shareSubscriptions", "durableSubscriptionDeletion")
_ON_A_QUEUE = Rule(instead="applies to topics: ignored on a queue, as the container ignores it")


def map_beans(app: Application, topology: MigratedTopology) -> list[MigratedListener]:
    """The listener of each bean (in the order of their names), the brokers' settings they
    bring, and every setting of the modules settled; ConfigurationError for a value or a
    combination the inputs' own rules refuse."""
    made: list[MigratedListener] = []
    used: set[int] = set()
    for name in sorted(app.beans):
        listener = _Bean(app, topology, app.beans[name], {m.name for m in made}, used).run()
        if listener is not None:
            made.append(listener)
    for found in _unused(topology.modules, used):
        unused(found, app.report)
    for _, link in app.links.settings.values():
        if id(link) not in used:
            app.report.none(link, Rule(instead="no bean's message-destination-link names this "
                                                "message destination"))
    return made


def _unused(modules: list[JmsModule], used: set[int]) -> Iterator[Found]:
    """The settings of the destinations, templates and factories no bean used."""
    for module in modules:
        for destination in module.destinations.values():
            if id(destination) not in used:
                yield from destination.delivery.values()
        for template in module.templates.values():
            if id(template) not in used:
                yield template.element
                yield from template.delivery.values()
        for factory in module.factories.values():
            if id(factory) not in used:
                yield factory.element
                yield from factory.jndi
                yield from factory.settings.values()


class _Bean(DestinationSteps, OptionSteps):
    """The mapping of one bean: its steps, in order."""

    def run(self) -> MigratedListener | None:
        bean, report = self.bean, self.report
        defined = self.app.defined[bean.name]
        messaging = self.take("messagingType")
        if messaging is not None and not jms_listener(messaging.value):
            rule = Rule(instead=SETTINGS["messagingType"].instead)
            for found in [messaging, defined, *(f for _, f in bean.settings.values())]:
                report.none(found, rule)
            described = self.app.described.get(bean.name)
            if described is not None:
                report.none(described, rule)
            return None
        ejb_class = self.take("ejbClass")
        kind, key = self.destination()
        self.listener = MigratedListener(
            self.name, bean.name, key, ejb_class.value if ejb_class else "",
            f"message-driven bean {bean.name}"
            + (f" ({ejb_class.value})" if ejb_class else "") + f", on {key}",
            transacted=True)
        report.became(defined, f'@listener("{key}") def {self.name}',
                      "" if self.name == snake(bean.name, "bean") else
                      "another bean's name became the same: this one is numbered")
        if messaging is not None:
            report.became(messaging, f"listener {self.name}")
        if ejb_class is not None:
            report.became(ejb_class, f"the comment above the stub of {self.name}")
        described = self.app.described.get(bean.name)
        if described is not None:
            report.became(described, f"the settings of listener {self.name}")
        self.transaction()
        self.acknowledgement()
        if kind == "topic":
            self.topic()
        else:
            for setting in _TOPIC_ONLY:
                if topical := self.take(setting):
                    report.none(topical, _ON_A_QUEUE)
            if client := self.factory_setting("client-id"):
                report.none(client, _ON_A_QUEUE)
        self.options()
        self.redelivery()
        self.reconnect()
        for setting in ("distributedDestinationConnection", "resourceAdapter"):
            if noted := self.take(setting):
                if setting == "distributedDestinationConnection":
                    choice(noted, {"localonly": "LocalOnly", "everymember": "EveryMember"})
                report.none(noted, SETTINGS[setting])
        return self.listener
