"""Deleting a durable subscription no listener uses any more, with the messages it holds
(docs/distribution.md, "Operations: the plan, abandoned subscriptions, undeploy"): the one
implementation behind ``mdb subscriptions --delete`` and the console's cleanup of an abandoned
subscription (docs/console.md)."""

from __future__ import annotations

from mdb.messages.topology import Member
from mdb.routing.brokers import Brokers


async def delete_subscription(brokers: Brokers, client_id: str, member: Member,
                              name: str) -> None:
    """Delete subscription ``name`` of the topic ``member`` on its broker, on a connection of
    its own. ``BrokerError`` where the broker refuses: ActiveMQ cannot over STOMP
    (docs/activemq.md, "Deleting subscriptions")."""
    link = brokers.link(member.broker, client_id)
    try:
        connection = await link.connect()
        await connection.delete_subscription(member.destination, name)
    finally:
        await link.close()
