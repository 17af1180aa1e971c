"""Activation-config properties: the name-value pairs of ``<activation-config>`` and of
``@ActivationConfigProperty``, as WebLogic, the Jakarta standard, ActiveMQ's resource adapter
and Artemis' resource adapter name them.

Each property is the bean setting it says (a name of ``mdb.commands.migrate.bean.SETTINGS``)
or a ``Rule`` saying why mdb has none. Names are matched ignoring case (ActiveMQ's
``clientId`` is Artemis' ``clientID``). A property none of these defines stops the migration:
it belongs to a resource adapter mdb migrate does not know, and its meaning cannot be
guessed.
"""

from __future__ import annotations

from mdb.commands.migrate.bean import Bean, Source
from mdb.commands.migrate.model import JNDI, Found, Report, Rule

PROPERTIES: dict[str, dict[str, str | Rule]] = {
    "the Jakarta standard (and JCA 1.5's generic destination)": {
        "destinationType": "destinationType",
        "destination": "destination",
        "destinationLookup": "destination",
        "connectionFactoryLookup": "connectionFactory",
        "messageSelector": "messageSelector",
        "acknowledgeMode": "acknowledgeMode",
        "subscriptionDurability": "subscriptionDurability",
        "subscriptionName": "subscriptionName",
        "clientId": "clientId",
    },
    "WebLogic (each the property of a weblogic-ejb-jar.xml element)": {
        "destinationJndiName": "destination",
        "destinationResourceLink": "destination",
        "connectionFactoryJndiName": "connectionFactory",
        "connectionFactoryResourceLink": "connectionFactory",
        "resourceAdapterJndiName": "resourceAdapter",
        "topicMessagesDistributionMode": "topicMessagesDistributionMode",
        "distributedDestinationConnection": "distributedDestinationConnection",
        "jmsClientId": "clientId",
        "generateUniqueJmsClientId": "generateUniqueJmsClientId",
        "durableSubscriptionDeletion": "durableSubscriptionDeletion",
        "maxMessagesInTransaction": "maxMessagesInTransaction",
        "initSuspendSeconds": "initSuspendSeconds",
        "maxSuspendSeconds": "maxSuspendSeconds",
        "jmsPollingIntervalSeconds": "jmsPollingIntervalSeconds",
        "providerURL": JNDI,
        "initialContextFactory": JNDI,
    },
    "ActiveMQ's resource adapter (ActiveMQActivationSpec), where it differs": {
        "maxSessions": "pool",
        "maxMessagesPerSessions": "prefetch",
        "enableBatch": "enableBatch",
        "maxMessagesPerBatch": "maxMessagesInTransaction",
        "maximumRedeliveries": "redeliveryLimit",
        "initialRedeliveryDelay": "redeliveryDelay",
        "redeliveryBackOffMultiplier": "redeliveryBackOffMultiplier",
        "redeliveryUseExponentialBackOff": "redeliveryUseExponentialBackOff",
        "useRAManagedTransaction": Rule(
            instead="the adapter's own local transaction instead of the container's: mdb's "
                    "transacted listener is the broker's transaction either way"),
        "noLocal": Rule(instead="mdb has no noLocal: a listener also receives what its own "
                                "process publishes; let the handler recognise its own "
                                "messages by a header"),
        "userName": "userName",
        "password": Rule(instead="a secret in a descriptor is not copied: give it in "
                                 "`brokers.B.password_file` or MDB_BROKERS__B__PASSWORD "
                                 "(docs/security.md)"),
        "useJndi": Rule(instead="whether `destination` is a JNDI name or the broker's: mdb "
                                "names destinations in settings, and takes the name either "
                                "way"),
    },
    "Artemis' resource adapter, where it differs (clientID and useJNDI are the names above)": {
        "maxSession": "pool",
        "user": "userName",
        "shareSubscriptions": "shareSubscriptions",
        "setupAttempts": Rule(instead="mdb never stops trying to connect; "
                                      "`brokers.B.reconnect_give_up_after` reports a broker "
                                      "failed, and the attempts go on"),
        "setupInterval": Rule(instead="the wait between connection attempts: "
                                      "`brokers.B.reconnect_delay` and `reconnect_max_delay`, "
                                      "in seconds"),
        "rebalanceConnections": Rule(instead="mdb consumes every member of a destination from "
                                             "every process: nothing to rebalance"),
        "connectorClassName": Rule(instead="where the broker is: `brokers.B.url`"),
        "connectionParameters": Rule(instead="where the broker is: `brokers.B.url`"),
    },
}
"""Each property by who defines it: the setting it gives, or why it has none (the mapping
table of the docs)."""

_BY_NAME = {name.lower(): known for group in PROPERTIES.values()
            for name, known in group.items()}


def give_property(bean: Bean, name: str, found: Found, source: Source,
                  report: Report) -> None:
    """Give ``bean`` the activation property ``name``, whose value is ``found`` (its element
    names the property)."""
    known = _BY_NAME.get(name.lower())
    if known is None:
        raise found.refuse(
            f"{name!r} is not an activation property of WebLogic, the Jakarta standard, "
            "ActiveMQ's or Artemis' resource adapter",
            "check its spelling; if it belongs to another resource adapter, set what it "
            "does in mdb.toml by hand (docs/migrating-from-weblogic.md) and remove it from a "
            "copy of the descriptor")
    if isinstance(known, Rule):
        report.none(found, known)
    else:
        bean.give(known, source, found, report)
