"""Subscription planning: listener + settings → the subscriptions to create. Pure.

Topic subscription names (documented in docs/concepts.md; changing them abandons durable
subscriptions, so they never change silently):

* ``one-copy-per-app``:    ``<app>-<listener>``           shared by every process of the app
* ``one-copy-per-server``: ``<app>-<server>-<listener>``  one per process, stable across restarts
* the listener's ``subscription`` option replaces either.

App, server and listener names contain only letters, digits and ``_``, so the dashes keep the
parts apart and a per-app name can never equal a per-server one. Names contain no ``.``: brokers
use it as a path separator. A queue needs no name: its consumers compete for its messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from mdb.broker import SubscriptionRequest
from mdb.destinations import Kind
from mdb.listener import ListenerSpec
from mdb.options import Distribution


@dataclass(frozen=True, slots=True)
class PlannedSubscription:
    listener: str
    broker: str
    request: SubscriptionRequest
    shared: bool

    @property
    def name(self) -> str:
        return self.request.name or str(self.request.destination)


def subscription_name(spec: ListenerSpec, app: str, server: str) -> str | None:
    if spec.destination.kind is Kind.QUEUE:
        return None
    if spec.options.subscription:
        return spec.options.subscription
    if spec.options.distribution is Distribution.ONE_COPY_PER_SERVER:
        return f"{app}-{server}-{spec.name}"
    return f"{app}-{spec.name}"


def plan(spec: ListenerSpec, *, app: str, server: str, broker: str) -> PlannedSubscription:
    """The subscription every pool slot of ``spec`` attaches to (one per slot, like the
    sessions of a JMS MDB pool), with a prefetch of ``max_messages_per_transaction``: a slot
    holds at most one batch."""
    return PlannedSubscription(
        listener=spec.name,
        broker=broker,
        request=SubscriptionRequest(
            destination=spec.destination,
            name=subscription_name(spec, app, server),
            durable=spec.options.durable,
            selector=spec.options.selector,
            prefetch=spec.options.max_messages_per_transaction,
        ),
        shared=spec.destination.kind is Kind.QUEUE
        or spec.options.distribution is Distribution.ONE_COPY_PER_APP,
    )
