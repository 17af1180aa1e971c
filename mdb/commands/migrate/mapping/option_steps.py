"""How a bean's listener runs: its transaction and acknowledgement, its options (selector,
pool, prefetch, batches, handler timeout), its redelivery and error destination, and what it
says of reconnecting (its brokers' settings).
"""

from __future__ import annotations

from mdb import Redelivery
from mdb.commands.migrate.bean import SETTINGS
from mdb.commands.migrate.mapping.bean_mapping import BeanMapping
from mdb.commands.migrate.mapping.found_values import boolean, choice, number, whole
from mdb.commands.migrate.model import Rule


class OptionSteps(BeanMapping):
    """The steps of a bean's mapping that decide how its listener runs."""

    def transaction(self) -> None:
        assert self.listener is not None
        kind, attribute = self.take("transactionType"), self.take("transAttribute")
        bean_managed = kind is not None and choice(
            kind, {"container": "Container", "bean": "Bean"}) == "Bean"
        chosen = None if attribute is None else choice(attribute, {
            "required": "Required", "notsupported": "NotSupported"}, refused=(
                "not allowed on a message-driven bean's onMessage",
                "the EJB specification allows Required and NotSupported there"))
        self.listener.transacted = not bean_managed and chosen != "NotSupported"
        if kind is not None:
            if bean_managed:
                self.set("transacted", False, kind, note=SETTINGS["transactionType"].instead)
            else:
                self.report.none(kind, Rule(instead="container-managed: the transaction "
                                                    "attribute decides (Required without one)"))
        if attribute is not None:
            if bean_managed:
                self.report.none(attribute, Rule(instead="ignored: the bean manages its "
                                                         "transactions"))
            else:
                self.set("transacted", chosen == "Required", attribute,
                         note=SETTINGS["transAttribute"].instead if chosen == "Required" else "")

    def acknowledgement(self) -> None:
        assert self.listener is not None
        found = self.take("acknowledgeMode")
        if found is None:
            return
        mode = choice(found, {"autoacknowledge": "Auto-acknowledge",
                               "dupsokacknowledge": "Dups-ok-acknowledge"})
        if self.listener.transacted:
            self.report.none(found, Rule(instead="ignored for a transacted bean, as the "
                                                 "container ignores it"))
        elif mode == "Auto-acknowledge":
            self.report.none(found, Rule(instead="what `transacted = false` does: mdb "
                                                 "acknowledges after the handler returned"))
        else:
            self.report.none(found, Rule(instead="lazy acknowledgements have no equivalent: "
                                                 "mdb acknowledges each message after the "
                                                 "handler returned"))

    def options(self) -> None:
        """Selector, pool, prefetch, batches and the handler timeout."""
        assert self.listener is not None
        if found := self.take("messageSelector"):
            if found.value:
                self.set("selector", found.value, found,
                         note=SETTINGS["messageSelector"].instead)
            else:
                self.report.none(found, Rule(instead="empty: selects everything"))
        if found := self.take("pool"):
            self.set("pool", whole(found, 0), found, note=SETTINGS["pool"].instead)
        prefetch = self.take("prefetch")
        factory_prefetch = self.factory_setting("messages-maximum")
        if prefetch is None:
            prefetch = factory_prefetch
        elif factory_prefetch is not None:
            self.report.none(factory_prefetch, Rule(instead="the bean's own prefetch is used"))
        if prefetch is not None:
            count = whole(prefetch, -1)
            if count == -1:
                self.report.none(prefetch, Rule(instead="no limit has no equivalent: mdb's "
                                                        "prefetch is bounded"))
            else:
                self.set("prefetch", count, prefetch)
        batch, enabled = self.take("maxMessagesInTransaction"), self.take("enableBatch")
        if enabled is not None:
            self.report.none(enabled, SETTINGS["enableBatch"])
        if batch is not None:
            size = whole(batch, 0)
            adapter_off = "perbatch" in batch.element.lower() and not (
                enabled is not None and boolean(enabled))
            if adapter_off:
                self.report.none(batch, Rule(instead="ignored: enableBatch is not true"))
            elif not self.listener.transacted:
                self.report.none(batch, Rule(instead="applies to transacted beans: ignored, as "
                                                     "WebLogic ignores it"))
            else:
                self.set("max_messages_per_transaction", size, batch,
                         note=SETTINGS["maxMessagesInTransaction"].instead)
        timeout = self.take("transTimeoutSeconds")
        if timeout is not None:
            seconds = whole(timeout, 0)
            if seconds == 0:
                self.report.none(timeout, Rule(instead="0: the domain's default transaction "
                                                       "timeout; set handler_timeout yourself"))
            else:
                self.set("handler_timeout", float(seconds), timeout,
                         note=SETTINGS["transTimeoutSeconds"].instead)
        elif self.listener.transacted:
            self.listener.defaults.append(
                "no trans-timeout-seconds: WebLogic's transaction timeout (30 s unless the "
                "domain says otherwise) bounded onMessage; mdb sets no handler_timeout unless "
                "told (docs/concepts.md#handler-timeouts)")

    def redelivery(self) -> None:
        """Limit, delay, backoff and the error destination: the bean's resource adapter's,
        else its destination's (or its template's), else its connection factory's delay."""
        assert self.listener is not None
        limit = self.first(self.take("redeliveryLimit"), self.delivery("redelivery-limit"))
        if limit is not None:
            count = whole(limit, -1)
            if count == -1:
                self.report.none(limit, Rule(instead="no limit has no equivalent: mdb bounds "
                                                     "every limit, and its default, 5, applies"))
                limit = None
            else:
                self.set("redelivery.limit", count, limit, Redelivery)
        if limit is None:
            self.listener.defaults.append(
                "no redelivery limit: WebLogic redelivered without end; mdb moves a message to "
                "the error destination after 5 redeliveries (redelivery.limit)")
        delay = None
        for candidate in (self.take("redeliveryDelay"), self.delivery("redelivery-delay"),
                          self.factory_setting("default-redelivery-delay")):
            if candidate is None:
                continue
            if delay is not None:
                self.report.none(candidate, Rule(instead=f"overridden by <{delay.element}>"))
            elif whole(candidate, -1) == -1:
                self.report.none(candidate, Rule(instead="-1: not set here"))
            else:
                delay = candidate
        exponential = self.take("redeliveryUseExponentialBackOff")
        multiplier = self.take("redeliveryBackOffMultiplier")
        backoff = 1.0
        if exponential is not None and boolean(exponential):
            backoff = number(multiplier) if multiplier is not None else 5.0
        for found in (exponential, multiplier):
            if found is not None:
                self.report.none(found, Rule(instead=f"redelivery.backoff = {backoff!r}, with "
                                                     "the delay"))
        if delay is not None:
            seconds = whole(delay, 0) / 1000
            if self.set("redelivery.delay", seconds, delay, Redelivery,
                        note="in seconds" + (", the same each time: WebLogic has no backoff"
                                             if backoff == 1 else "")):
                self.listener.values["redelivery"]["backoff"] = backoff
                self.listener.origins["redelivery.backoff"] = (
                    "WebLogic waits the same delay each time" if backoff == 1
                    else "redeliveryBackOffMultiplier")
                if backoff == 1 or seconds > Redelivery().max_delay:
                    self.listener.values["redelivery"]["max_delay"] = max(seconds, 0.0)
                    self.listener.origins["redelivery.max_delay"] = "as the delay"
        else:
            self.listener.defaults.append(
                "no redelivery delay: WebLogic redelivered at once; mdb waits 1 s, doubling up "
                "to 60 s (redelivery.delay, backoff, max_delay)")
        error = self.delivery("error-destination")
        if error is not None and self.module_destination is not None:
            module = next(m for m in self.topology.modules
                          if m.file == self.module_destination.module)
            target = self.topology.place(module.destinations[error.value]).key
            self.set("error_destination", target, error)
        else:
            self.listener.defaults.append(
                "no error destination: WebLogic deleted a message past its redelivery limit; "
                "mdb moves it to queue:NAME.DLQ (error_destination)")

    def reconnect(self) -> None:
        """What the bean and its connection factory say of reconnecting, as its brokers'."""
        initial = self.take("initSuspendSeconds")
        if initial is not None:
            self.broker("reconnect_delay", float(whole(initial, 0)), initial)
        longest = self.take("maxSuspendSeconds")
        polling = self.take("jmsPollingIntervalSeconds")
        if longest is not None:
            self.broker("reconnect_max_delay", float(whole(longest, 0)), longest)
            if polling is not None:
                self.report.none(polling, Rule(instead="max-suspend-seconds is "
                                                       "reconnect_max_delay"))
        elif polling is not None:
            self.broker("reconnect_max_delay", float(whole(polling, 0)), polling)
        if found := self.factory_setting("reconnect-blocking-millis"):
            self.broker("send_wait_for_reconnect", whole(found, 0) / 1000, found)
        if found := self.factory_setting("total-reconnect-period-millis"):
            if whole(found, -1) == -1:
                self.report.none(found, Rule(instead="-1, for ever: mdb never gives up"))
            else:
                self.broker("reconnect_give_up_after", whole(found, 0) / 1000, found)
        if found := self.take("userName"):
            self.broker("username", found.value, found)
