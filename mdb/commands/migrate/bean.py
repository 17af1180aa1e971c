"""A message-driven bean as its inputs describe it: its settings by name, each the ``Found``
of the input that won.

Every input says something of a bean under one of the names of ``SETTINGS``: an element of
``ejb-jar.xml`` or ``weblogic-ejb-jar.xml``, an activation property, an annotation's
attribute. Where several say the same thing, the deployment descriptor beats the annotation
(as the EJB specification has it) and WebLogic's own descriptor beats ``ejb-jar.xml`` (as
WebLogic has it); the loser is reported as superseded. Two values from one source are a
contradiction, and stop the migration.

``SETTINGS`` declares what each setting becomes in mdb (``mdb.commands.migrate.mapping.listeners``
does it), once for the mapping, the report and the mapping table of the docs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mdb.commands.migrate.model import XA, Found, Report, Rule

SETTINGS: dict[str, Rule] = {
    "messagingType": Rule(
        "a listener, when it is the JMS `MessageListener`",
        "a bean of another listener interface (a connector's) is not migrated: mdb listens to "
        "JMS destinations"),
    "ejbClass": Rule("the comment above the listener's stub: the class whose `onMessage` to "
                     "port"),
    "destinationType": Rule("the kind of the listener's destination: `@listener(\"queue:...\")` "
                            "or `@listener(\"topic:...\")`"),
    "destination": Rule(
        "the listener's destination, `@listener(\"topic:NAME\")`",
        "NAME is the JMS module's name of the destination; without a module, the JNDI (or "
        "broker's) name with `/` made `.`"),
    "connectionFactory": Rule(
        "the settings of that connection factory of the JMS module",
        "a factory the module does not define (WebLogic's default MDB factory, a foreign "
        "one) brings WebLogic's defaults: nothing to set"),
    "resourceAdapter": Rule(
        instead="the bean consumed through a resource adapter (ActiveMQ's, Artemis'): mdb "
                "connects to the broker itself, and the destination is the broker's name for "
                "it; the adapter's activation properties were read"),
    "messageSelector": Rule(
        "`listeners.NAME.selector`",
        "on a topic mdb evaluates it itself, a subset of JMS's (no LIKE, IN, BETWEEN): `mdb "
        "subscriptions` checks it"),
    "acknowledgeMode": Rule(
        "with `listeners.NAME.transacted = false`, an acknowledgement after the handler "
        "returned: Auto-acknowledge",
        "Dups-ok-acknowledge's lazy acknowledgements have none: mdb acknowledges each message; "
        "for a transacted bean it is ignored, as the container ignores it"),
    "subscriptionDurability": Rule(
        "a durable subscription (`listeners.NAME.durable`, true)",
        "mdb's topic subscriptions on ActiveMQ and RabbitMQ are durable: a NonDurable bean's "
        "subscription keeps messages while no server is attached (delete one no server uses "
        "any more with `mdb subscriptions --delete`)"),
    "subscriptionName": Rule(
        "`listeners.NAME.subscription`",
        "letters, digits, `_` and `-` (others made `_`); one-copy-per-server adds "
        "`-{server}`: each server's subscription is its own"),
    "clientId": Rule("the first part of `listeners.NAME.subscription`, `CLIENTID_NAME`, as "
                     "WebLogic names a durable subscriber"),
    "topicMessagesDistributionMode": Rule(
        "`listeners.NAME.distribution`",
        "Compatibility becomes one-copy-per-server for a non-durable bean or one with "
        "generate-unique-jms-client-id (each server had its own subscription), else "
        "one-copy-per-app (one subscription for the cluster); on a partitioned distributed "
        "topic it is refused, as WebLogic refuses it"),
    "generateUniqueJmsClientId": Rule(
        "`listeners.NAME.distribution = \"one-copy-per-server\"`, in Compatibility mode",
        "ignored with One-Copy-Per-Server or One-Copy-Per-Application, which name the "
        "subscriptions themselves"),
    "shareSubscriptions": Rule(
        "`listeners.NAME.distribution = \"one-copy-per-app\"` when true",
        "false leaves the distribution to the other settings"),
    "distributedDestinationConnection": Rule(
        instead="mdb always consumes every member (EveryMember); LocalOnly consumed the "
                "members on the bean's own server, which with the bean on every server "
                "covered them all the same: nothing to set"),
    "transactionType": Rule(
        "with the transaction attribute, `listeners.NAME.transacted`: Bean (bean-managed) is "
        "false",
        "a UserTransaction the handler began has none: for database writes that commit with "
        "the message use `exactly_once` (docs/exactly-once.md)"),
    "transAttribute": Rule(
        "`listeners.NAME.transacted`: Required is true (mdb's default: the acknowledgement "
        "and the handler's sends commit together), NotSupported is false",
        XA),
    "pool": Rule("`listeners.NAME.pool`",
                 "per member of the destination and per process, as WebLogic's pool per "
                 "member"),
    "prefetch": Rule("`listeners.NAME.prefetch`"),
    "maxMessagesInTransaction": Rule(
        "`listeners.NAME.max_messages_per_transaction`",
        "transacted listeners only, as WebLogic batches transactional beans only"),
    "enableBatch": Rule(
        "with maxMessagesPerBatch, `listeners.NAME.max_messages_per_transaction`",
        "false (the default): no batches"),
    "durableSubscriptionDeletion": Rule(
        "`listeners.NAME.durable_subscription_deletion`",
        "one-copy-per-server only: mdb refuses to delete a subscription the app's servers "
        "share (delete it with `mdb subscriptions --delete`); ActiveMQ cannot delete one "
        "over STOMP (docs/distribution.md)"),
    "initSuspendSeconds": Rule(
        "`brokers.B.reconnect_delay` of the brokers of the bean's destination",
        "the smallest of the beans on one broker wins"),
    "maxSuspendSeconds": Rule(
        "`brokers.B.reconnect_max_delay` of the brokers of the bean's destination",
        "the smallest of the beans on one broker wins"),
    "jmsPollingIntervalSeconds": Rule(
        "`brokers.B.reconnect_max_delay`, when max-suspend-seconds is not given",
        "mdb's reconnect waits double from reconnect_delay up to it"),
    "transTimeoutSeconds": Rule(
        "`listeners.NAME.handler_timeout`",
        "past it an async handler is cancelled and its delivery fails, as WebLogic rolls back "
        "a timed-out transaction"),
    "redeliveryLimit": Rule("`listeners.NAME.redelivery.limit`"),
    "redeliveryDelay": Rule("`listeners.NAME.redelivery.delay` (seconds)"),
    "redeliveryBackOffMultiplier": Rule(
        "`listeners.NAME.redelivery.backoff`",
        "only with redeliveryUseExponentialBackOff true"),
    "redeliveryUseExponentialBackOff": Rule(
        "with redeliveryBackOffMultiplier, `listeners.NAME.redelivery.backoff`",
        "false (the default): backoff 1, the same delay each time"),
    "userName": Rule("`brokers.B.username` of the brokers of the bean's destination"),
}


class Source(enum.IntEnum):
    """Where a setting was read, weakest first."""

    ANNOTATION = 0
    EJB_JAR = 1
    WEBLOGIC_EJB_JAR = 2


@dataclass
class Bean:
    """One message-driven bean: its ``ejb-name`` and its settings (names of ``SETTINGS``)."""

    name: str
    settings: dict[str, tuple[Source, Found]] = field(default_factory=dict)
    what: str = ""
    """What it is, for a message (default: ``bean NAME``)."""

    def value(self, setting: str) -> Found | None:
        held = self.settings.get(setting)
        return None if held is None else held[1]

    def give(self, setting: str, source: Source, found: Found, report: Report) -> None:
        """``found`` says ``setting``: kept if it beats what was there, reported as superseded
        if not; ConfigurationError for two different values from one source."""
        held = self.settings.get(setting)
        if held is None or held[0] < source:
            if held is not None:
                _superseded(held[1], found, report)
            self.settings[setting] = (source, found)
        elif held[0] > source:
            _superseded(found, held[1], report)
        elif held[1].value == found.value:
            report.none(found, Rule(instead=f"the same as <{held[1].element}>"))
        else:
            raise found.refuse(
                f"{self.what or 'bean ' + self.name} already has {held[1].value!r} for this, "
                f"from <{held[1].element}>", "keep one of the two")


def _superseded(loser: Found, winner: Found, report: Report) -> None:
    report.none(loser, Rule(instead=f"superseded by <{winner.element}> of {winner.file}, "
                                    f"{winner.value!r}"))
