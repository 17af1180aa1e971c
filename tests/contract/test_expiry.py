"""A message's expiry on the copies mdb makes of it, on the brokers that expire messages
(docs/failed-messages.md, "Expiry"): an error copy outlives its original's expiry, which it
keeps as information only (``mdb_original_expiry``), and so does its replay; a retry copy
keeps the expiry itself.

No test sleeps out a time to live: a *witness* sent just after the original is handed back
by the broker itself once the original's time to live has passed (``Witness``), and a marker
sent to the error destination after that is read behind the error copy, or first where the
copy expired."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from mdb import Redelivery, listener
from mdb.commands.dlq.failed import ErrorDestination
from mdb.messages.headers import ERROR_TYPE, ID, ORIGINAL_EXPIRY, REPLAYS
from mdb.routing.brokers import Brokers
from tests.harness.apps.in_process import running, settings_for, unique, until
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.messages import read, send, send_all

pytestmark = pytest.mark.anyio

TTL_MS = 3000  # a time to live the first delivery surely beats


@pytest.fixture(params=[pytest.param("activemq", marks=pytest.mark.activemq),
                        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def expiring(request: pytest.FixtureRequest) -> BrokerProcess:
    """A broker that expires messages: ActiveMQ (``expires``, an absolute time in ms) and
    RabbitMQ (``expiration``, a time to live in ms)."""
    broker: BrokerProcess = request.getfixturevalue(request.param)
    return broker


def expiry_headers(broker: BrokerProcess, ttl_ms: int) -> dict[str, str]:
    """The headers a producer on ``broker`` gives a message that expires ``ttl_ms`` from now."""
    if broker.scheme == "stomp+activemq":
        return {"expires": str(round(time.time() * 1000) + ttl_ms)}
    return {"expiration": str(ttl_ms)}


class Witness:
    """A message the broker hands back only once ``ttl_ms`` have passed since it was sent:
    on ActiveMQ held back that long by its scheduler (on in the reference config), on
    RabbitMQ dead-lettered by its own time to live from a queue no one reads."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker, self.queue = broker, f"queue:{unique('witness')}"

    async def send(self, ttl_ms: int) -> None:
        if self.broker.scheme == "stomp+activemq":
            await send(self.broker.url, self.queue, "witness", AMQ_SCHEDULED_DELAY=str(ttl_ms))
            return
        dead = Witness(self.broker)  # expires there, is dead-lettered here
        await send(self.broker.url, dead.queue, "witness", expiration=str(ttl_ms),
                   **{"x-dead-letter-exchange": "",
                      "x-dead-letter-routing-key": self.queue.removeprefix("queue:")})

    async def returned(self) -> None:
        [witness] = await read(self.broker.url, self.queue, 1)
        assert witness.body == b"witness"


async def test_an_error_copy_outlives_its_originals_expiry(expiring: BrokerProcess) -> None:
    url = expiring.url
    queue, errors = f"queue:{unique('expiring')}", f"queue:{unique('expiring_errors')}"

    @listener(queue, redelivery=Redelivery(limit=0), error_destination=errors)
    async def handler(body: str) -> None:
        raise RuntimeError("fails at once")

    witness = Witness(expiring)
    before = datetime.now(UTC)
    async with running(settings_for(url), handler) as container:
        sent = await send(url, queue, "evidence", **expiry_headers(expiring, TTL_MS))
        await witness.send(TTL_MS)  # sent after the original: back after its expiry
        await until(lambda: container.deployed[0].stats.to_error_destination == 1)
    await witness.returned()
    after = datetime.now(UTC)
    await send_all(url, errors, ["marker"])
    [moved] = await read(url, errors, 1)
    assert moved.body == b"evidence", "the error copy expired with its original"
    h = moved.headers
    assert (h[ID], h[ERROR_TYPE]) == (sent, "RuntimeError")
    assert not {"expires", "expiration", "mdb_expires"} & {k for k, v in h.items() if v != "0"}
    expiry = datetime.fromisoformat(h[ORIGINAL_EXPIRY])
    assert before.timestamp() + TTL_MS / 1000 - 1 <= expiry.timestamp() <= after.timestamp()


async def test_a_replay_is_sent_without_the_expiry_an_older_error_copy_kept(
        expiring: BrokerProcess) -> None:
    """An error copy made before error copies outlived their originals (or by another
    producer) may hold an expiry: on RabbitMQ ``mdb_expires``, passed, which a copy out of a
    delay queue keeps without ``expiration``. Its replay was not sent, its removal from the
    error destination committed all the same: the message was lost. A replay has no expiry."""
    url = expiring.url
    queue = f"queue:{unique('replayed')}"
    errors = f"{queue}.DLQ"
    now = round(time.time() * 1000)
    # ActiveMQ expired a copy whose expiry passed already: one that passes during the replay.
    older = ({"expires": str(now + TTL_MS)} if expiring.scheme == "stomp+activemq"
             else {"mdb_expires": str(now - 60_000)})
    await send(url, errors, "evidence", **older, mdb_error_type="RuntimeError",
               mdb_original_destination=queue)
    witness = Witness(expiring)
    await witness.send(TTL_MS)
    done = await ErrorDestination(Brokers(settings_for(url)), errors).replay()
    assert done.taken == 1
    await witness.returned()  # its expiry, if it kept one, has passed
    await send_all(url, queue, ["marker"])
    [replayed] = await read(url, queue, 1)
    assert replayed.body == b"evidence", "the replay was lost, or expired"
    assert replayed.headers[REPLAYS] == "1"
