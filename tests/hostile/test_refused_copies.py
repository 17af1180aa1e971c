"""A copy the broker refuses never loops (docs/concepts.md, "How redelivery works, and why").

The listener's broker user may not write its error destination (ActiveMQ authorization, a
RabbitMQ permission, the memory broker's ``refuse_sends_to``): the copy that would move a
poison message there is refused, the delivery cannot be settled and the message comes back,
flagged redelivered. Left alone it would go round for ever (measured without the strikes:
4,344 refused commits in 20 s on ActiveMQ; on RabbitMQ 4,510 connection losses in 20 s, and the
message behind it never processed). So each listener counts the comebacks in the process
(``mdb.delivery.strikes``): after ``MAX_STRIKES`` the message goes to the broker's own
dead-letter queue (ActiveMQ, memory), or, where a NACK could drop it (RabbitMQ), stays on its
queue behind growing pauses without being handled again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest

from mdb import Container, Redelivery, listener
from mdb.delivery.decision import MAX_STRIKES
from mdb.listeners.events import EventKind
from mdb.messages.headers import ID
from mdb_memory import DEAD_LETTER_QUEUE, broker_state
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.servers.activemq import ActiveMQ, activemq_available
from tests.harness.servers.brokers import missing
from tests.harness.servers.rabbitmq import RabbitMQ
from tests.harness.traffic.messages import read, send_all

pytestmark = pytest.mark.anyio

WAIT = 30.0  # a hang guard, not a timing assertion
GOOD = 30


@dataclass(frozen=True)
class Refusing:
    """A broker where ``listener_url``'s user may not write ``queue``'s error destination;
    ``admin_url`` may do anything; the broker's dead-letter queue is ``dead_letters``."""

    listener_url: str
    admin_url: str
    queue: str
    dead_letters: str


@pytest.fixture(scope="module")
def activemq_confined() -> Iterator[ActiveMQ]:
    """An ActiveMQ whose user ``app`` may use the queues ``confined.*`` only (not
    ``confined.x.DLQ``)."""
    if not activemq_available():
        missing("ActiveMQ Classic")
    with ActiveMQ(confined={"app": ("app-pw", "confined.*")}) as broker:
        yield broker


@pytest.fixture(params=["memory", pytest.param("activemq", marks=pytest.mark.activemq)])
def refusing(request: pytest.FixtureRequest) -> Refusing:
    name = unique("refused")
    if request.param == "memory":
        url = f"memory://{name}"
        broker_state(name).refuse_sends_to(f"queue:{name}.DLQ")
        return Refusing(url, url, f"queue:{name}", f"queue:{DEAD_LETTER_QUEUE}")
    broker: ActiveMQ = request.getfixturevalue("activemq_confined")
    return Refusing(f"stomp+activemq://app:app-pw@{broker.host}:{broker.port}", broker.url,
                    f"queue:confined.{name}", "queue:ActiveMQ.DLQ")


def poison_listener(queue: str, calls: Calls,
                    pool: int = 1) -> Callable[[str], Awaitable[None]]:
    @listener(queue, pool=pool, redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str) -> None:
        calls.add("body", body)
        if body == "poison":
            raise ValueError("poison")

    return handler


def stats_of(container: Container) -> tuple[int, int, int]:
    """(rolled back, dead-lettered, kept) of the container's only listener."""
    [deployed] = container.deployed
    stats = deployed.stats
    return stats.rolled_back, stats.dead_lettered, stats.kept


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records
               if r.levelno == logging.WARNING and text in r.getMessage())


class Seen(logging.Handler):
    """Adds each ``mdb.delivery`` record holding ``text`` to ``calls`` (as ``"log"``), so that
    a test can wait for log lines as it waits for handler calls."""

    def __init__(self, calls: Calls, text: str) -> None:
        super().__init__(logging.DEBUG)
        self._calls, self._text = calls, text

    def emit(self, record: logging.LogRecord) -> None:
        if self._text in record.getMessage():
            self._calls.add("log", record.levelno)


async def test_a_message_whose_error_copy_is_refused_ends_on_the_brokers_dead_letter_queue(
    refusing: Refusing, caplog: pytest.LogCaptureFixture,
) -> None:
    calls = Calls()
    handler = poison_listener(refusing.queue, calls)
    [poison] = await send_all(refusing.admin_url, refusing.queue, ["poison"])
    async with running(settings_for(refusing.listener_url), handler) as container:
        await send_all(refusing.admin_url, refusing.queue, [f"good {n}" for n in range(GOOD)])
        await calls.wait(lambda c: len(c.of("body")) >= 2 + GOOD, timeout=WAIT)
        [dead] = await read(refusing.admin_url, refusing.dead_letters, 1, timeout=WAIT)
        await send_all(refusing.admin_url, refusing.queue, ["after"])
        await calls.wait(lambda c: "after" in c.of("body"), timeout=WAIT)
        assert container.health().ready
        rolled_back, dead_lettered, kept = stats_of(container)
        assert container.events.counts[EventKind.CONNECTION_LOST] == 0
    assert dead.body == b"poison" and dead.headers[ID] == poison
    # The refused copy was tried a bounded number of times: once as the handler's last
    # failure, then once per comeback up to MAX_STRIKES.
    assert (rolled_back, dead_lettered, kept) == (1 + MAX_STRIKES, 1, 0)
    assert calls.of("body").count("poison") == 2  # the handler never saw it come back
    assert sorted(str(b) for b in calls.of("body") if b != "poison") == sorted(
        [*(f"good {n}" for n in range(GOOD)), "after"])
    assert warnings_about(caplog, "handed to the broker's dead-letter queue") == 1


@pytest.mark.rabbitmq
@pytest.mark.parametrize("pool", [1, 4])
async def test_a_message_whose_error_copy_is_refused_on_rabbitmq_stays_intact_without_looping(
    rabbitmq: RabbitMQ, caplog: pytest.LogCaptureFixture, pool: int,
) -> None:
    """RabbitMQ drops a NACKed message unless its queue has a dead-letter exchange, which mdb
    cannot see: the message is kept on its own queue instead. Each refused copy costs a
    connection (RabbitMQ closes it after refusing the SEND): there are at most ``MAX_STRIKES + 1``.
    With several slots, the messages in flight on the connection each loss closes come back in
    doubt too: they are not struck, and all are processed."""
    user = unique("app")
    rabbitmq.ctl("add_user", user, "app-pw")
    # A SEND to /queue/X declares X: no configure right on *.DLQ refuses the error copy.
    rabbitmq.ctl("set_permissions", "-p", "/", user, r"^(?!.*\.DLQ$).*", ".*", ".*")
    queue = f"queue:{unique('refused')}"
    calls = Calls()
    handler = poison_listener(queue, calls, pool)
    [poison] = await send_all(rabbitmq.url, queue, ["poison"])
    app_url = f"stomp+rabbitmq://{user}:app-pw@{rabbitmq.host}:{rabbitmq.port}"
    caplog.set_level(logging.DEBUG, logger="mdb.delivery")
    seen = Seen(calls, f"message {poison} kept on")
    logging.getLogger("mdb.delivery").addHandler(seen)
    try:
        async with running(settings_for(app_url), handler) as container:
            await send_all(rabbitmq.url, queue, [f"good {n}" for n in range(GOOD)])
            await calls.wait(lambda c: len(c.of("body")) >= 2 + GOOD, timeout=WAIT)
            # Kept twice: the second round shows that it no longer goes round through refusals.
            await calls.wait(lambda c: len(c.of("log")) >= 2, timeout=WAIT)
            await send_all(rabbitmq.url, queue, ["after"])
            await calls.wait(lambda c: "after" in c.of("body"), timeout=WAIT)
            assert container.health().ready
            losses = container.events.counts[EventKind.CONNECTION_LOST]
            _, dead_lettered, kept_rounds = stats_of(container)
    finally:
        logging.getLogger("mdb.delivery").removeHandler(seen)
    assert losses <= MAX_STRIKES + 1
    assert (dead_lettered, kept_rounds >= 2) == (0, True)
    # The handler never saw it come back, nor a second copy of its retry (below).
    assert calls.of("body").count("poison") == 2
    assert {*(f"good {n}" for n in range(GOOD)), "after"} <= set(calls.of("body"))
    # The first keep is logged at WARNING, the later ones at DEBUG. With several slots on one
    # connection, a retry copy is stored and delivered to another slot before its original's
    # ack is taken (RabbitMQ settles with confirmed sends, then the acks: docs/rabbitmq.md);
    # when that slot's refused copy closes the connection, the ack is lost; that original
    # comes back and is acked unseen (docs/security.md, "Limits"). But the close may also cut
    # off the receipt of a retry copy's SEND, which RabbitMQ may have stored all the same: then
    # two copies of that round are stored (one id, one count), and the later is told from the
    # first: in doubt while the first is with the handler, so it is not handled again. Each
    # keep is struck as it is decided, so two copies kept are two rounds and only the first is
    # a WARNING.
    levels = calls.of("log")
    assert levels[0] == logging.WARNING
    assert set(levels[1:]) == {logging.DEBUG}
    [kept] = await read(rabbitmq.url, queue, 1, timeout=WAIT)
    assert kept.body == b"poison" and kept.headers[ID] == poison
