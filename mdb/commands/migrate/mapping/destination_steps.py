"""Where a bean's listener listens: its destination (a module's, or named by the bean), and a
topic listener's distribution, durability and subscription's name.
"""

from __future__ import annotations

from mdb import Distribution
from mdb.commands.migrate.bean import SETTINGS
from mdb.commands.migrate.mapping.bean_mapping import BeanMapping
from mdb.commands.migrate.mapping.found_values import boolean, choice, is_resource_link
from mdb.commands.migrate.mapping.weblogic_names import destination_name, subscription_part
from mdb.commands.migrate.model import Found, Rule

PER_APP, PER_SERVER = Distribution.ONE_COPY_PER_APP.value, Distribution.ONE_COPY_PER_SERVER.value


class DestinationSteps(BeanMapping):
    """The steps of a bean's mapping that decide where its listener listens."""

    def destination(self) -> tuple[str, str]:
        """The kind and key (``topic:NAME``) of the bean's destination."""
        bean = self.bean
        defined = self.app.defined[bean.name]
        found = self.take("destination")
        adapter = self.bean.value("resourceAdapter")
        if found is None:
            raise defined.refuse(
                f"bean {bean.name} names no destination",
                "give it one: destination-jndi-name in weblogic-ejb-jar.xml, mapped-name, or "
                "a destinationLookup (or destination) activation property")
        named, resource_link = found, is_resource_link(found)
        if "message-destination-link" in found.element:
            linked = self.app.links.value(found.value)
            if linked is None:
                raise found.refuse("no message-destination of this name is defined",
                                   "define it in the assembly-descriptor of ejb-jar.xml, or "
                                   "in a message-destination-descriptor of "
                                   "weblogic-ejb-jar.xml")
            self.report.became(found, f"the destination of listener {self.name}")
            self.used.add(id(linked))
            named, resource_link = linked, is_resource_link(linked)
        module_destination = self.topology.destination(named.value, resource_link)
        if module_destination is None and self.topology.modules and adapter is None:
            raise named.refuse(
                "the JMS modules given define no destination of this "
                + ("name" if resource_link else "JNDI name"),
                "give the module that defines it, or correct the name")
        declared = self.take("destinationType")
        kind = None if declared is None else choice(
            declared, {"javaxjmsqueue": "queue", "javaxjmstopic": "topic",
                       "jakartajmsqueue": "queue", "jakartajmstopic": "topic"})
        if module_destination is not None:
            if declared is not None and kind != module_destination.kind:
                raise declared.refuse(
                    f"the module's {module_destination.name} is a {module_destination.kind}",
                    "correct the destinationType, or name the right destination")
            kind = module_destination.kind
            key = self.topology.place(module_destination).key
            self.module_destination = module_destination
            self.used.add(id(module_destination))
            template = self.template()
            if template is not None:
                self.used.add(id(template))
                self.report.became(template.element, f"the settings of listener {self.name} "
                                                     f"its destination sets none of")
        elif kind is None:
            raise named.refuse(f"bean {bean.name} does not say whether this is a queue or a "
                               "topic", "add the activation property destinationType "
                                        "(javax.jms.Queue or javax.jms.Topic)")
        else:
            key = f"{kind}:{destination_name(named.value)}"
        self.report.became(named, f'@listener("{key}")')
        if declared is not None:
            self.report.became(declared, f'the kind of @listener("{key}")')
        return kind, key

    def topic(self) -> None:
        """Distribution, durability and the subscription's name of a topic listener."""
        assert self.listener is not None
        durability = self.take("subscriptionDurability")
        # The EJB specification's default is NonDurable.
        durable = durability is not None and choice(
            durability, {"durable": "Durable", "nondurable": "NonDurable"}) == "Durable"
        if durability is None:
            self.listener.defaults.append(
                "subscriptionDurability is not given: WebLogic's default is NonDurable, and "
                "mdb's subscription is durable (it keeps messages while no server is "
                "attached)")
        mode = self.take("topicMessagesDistributionMode")
        unique = self.take("generateUniqueJmsClientId")
        shared = self.take("shareSubscriptions")
        chosen = "compatibility" if mode is None else choice(mode, {
            "onecopyperserver": PER_SERVER, "onecopyperapplication": PER_APP,
            "compatibility": "compatibility"})
        if mode is not None and chosen == "compatibility" and self.partitioned():
            raise mode.refuse(
                "Compatibility on a partitioned distributed topic: WebLogic refuses it too",
                "set One-Copy-Per-Server or One-Copy-Per-Application")
        decided: Found | None
        if chosen != "compatibility":
            distribution, decided = chosen, mode
        elif shared is not None and boolean(shared):
            distribution, decided = PER_APP, shared
        elif unique is not None and boolean(unique):
            distribution, decided = PER_SERVER, unique
        else:
            distribution = PER_APP if durable else PER_SERVER
            decided = durability
        for found in (mode, unique, shared):
            if found is not None and found is not decided:
                self.report.none(found, Rule(instead=f"the distribution is {distribution}, "
                                                     "decided by the setting that says it"))
        note = SETTINGS["topicMessagesDistributionMode"].instead
        if decided is None:
            self.listener.values["distribution"] = distribution
            self.listener.origins["distribution"] = (
                "Compatibility (WebLogic's default) with a non-durable bean: each server had "
                "its own subscription")
        else:
            if decided is durability:
                note = f"Compatibility (WebLogic's default mode): {note}"
            self.set("distribution", distribution, decided, note=note)
        if durability is not None and durability is not decided:
            self.report.none(durability, SETTINGS["subscriptionDurability"])
        elif durability is not None:
            self.listener.defaults.append(SETTINGS["subscriptionDurability"].instead)
        self.subscription(distribution)
        deletion = self.take("durableSubscriptionDeletion")
        if deletion is not None:
            if not boolean(deletion):
                self.report.none(deletion, Rule(instead="false: mdb's default"))
            elif distribution == PER_SERVER:
                self.set("durable_subscription_deletion", True, deletion,
                         note=SETTINGS["durableSubscriptionDeletion"].instead)
            else:
                self.report.none(deletion, SETTINGS["durableSubscriptionDeletion"])

    def partitioned(self) -> bool:
        """Whether the listener's destination is a topic with members on several brokers."""
        return self.module_destination is not None and len(
            self.topology.place(self.module_destination).members) > 1

    def subscription(self, distribution: str) -> None:
        client = self.take("clientId")
        factory_client = self.factory_setting("client-id")
        name = self.take("subscriptionName")
        if client is None and factory_client is not None:
            client = factory_client
        elif factory_client is not None:
            self.report.none(factory_client, Rule(instead="the bean's own client id is used"))
        if client is None and name is None:
            return
        parts = [subscription_part(client.value)] if client else []
        # WebLogic names a durable subscription after the bean unless told otherwise.
        parts.append(subscription_part(name.value if name else self.bean.name))
        subscription = "_".join(parts) + ("-{server}" if distribution == PER_SERVER else "")
        first = client or name
        assert first is not None
        self.set("subscription", subscription, first, note=SETTINGS["subscriptionName"].instead)
        if client is not None and name is not None:
            self.report.became(name, f"listeners.{self.name}.subscription, after the client id")
