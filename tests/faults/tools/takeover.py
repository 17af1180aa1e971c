"""A shared-store master killed under load, and the slave taking over, timed.

``take_over`` kills (SIGKILL) whichever broker of a ``SharedStorePair`` serves, while a fleet of
ledger processes consumes and a ``LoadProducer`` sends to a topic with a member on the pair,
and returns two times from the kill: until the slave answers STOMP (the broker's own takeover)
and until the fleet processes a message of the pair's member again (the container's). The
fault tests, the random fault run and ``python -m tests.faults.tools.takeover`` (the measurement of
docs/failover.md) share it.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tests.faults.tools.command_line import not_installed, parser_for
from tests.harness.apps.in_process import unique
from tests.harness.processes.fleet import Fleet, fault_settings, fleet
from tests.harness.servers.activemq import ActiveMQ, activemq_available
from tests.harness.servers.activemq_pair import SharedStoreBroker, SharedStorePair
from tests.harness.traffic.ledger import PER_APP
from tests.harness.traffic.load_producer import LoadProducer


@dataclass(frozen=True)
class Takeover:
    killed: SharedStoreBroker  # the master that was killed
    master: SharedStoreBroker  # the slave that took over
    serving_after: float  # seconds from the kill until the new master answered STOMP
    consumed_after: float  # ... until the fleet processed a message of the pair's member again

    def __str__(self) -> str:
        return (f"port {self.killed.port} -> {self.master.port}: broker serving after "
                f"{self.serving_after:.2f} s, a message processed after "
                f"{self.consumed_after:.2f} s (+{self.consumed_after - self.serving_after:.2f} s)")


def take_over(pair: SharedStorePair, processes: Fleet, producer: LoadProducer, app: str,
              broker: str) -> Takeover:
    """Kill the pair's master (logical broker ``broker`` of the producer's settings) and wait
    until the slave serves and ``app`` has processed, after that, a message of ``broker``'s
    member: one already stored (redelivered by the new master) or one sent to it afterwards.
    """
    killed_at = time.monotonic()
    killed = pair.kill_master()
    master = pair.wait_master()
    serving_after = time.monotonic() - killed_at
    # What the processes wrote until now happened on the dead master (a handler running there
    # at the kill returned within microseconds, its commit failed): a message of the member
    # processed from here on came from the new master.
    processes.catch_up()
    already = len(processes.done(app))

    def consumed_there(f: Fleet) -> bool:
        told = producer.told
        return any(told.get(e["id"]) == broker for e in f.done(app)[already:])

    processes.wait(consumed_there, f"{app} processing {broker}'s member on port {master.port}")
    return Takeover(killed, master, serving_after, time.monotonic() - killed_at)


def measure(rounds: int, reconnect_delay: float, reconnect_max_delay: float) -> list[Takeover]:
    """``rounds`` takeovers (each time the killed broker comes back as the slave) with one
    container process of a ``one-copy-per-app`` app on a topic partitioned over the pair
    (broker ``a``) and one plain broker (``b``), both with these reconnect delays."""
    topic, app = unique("takeover"), unique("shop")
    times = []
    with SharedStorePair() as pair, ActiveMQ() as other:
        settings = fault_settings([pair.urls, other.url], topic)
        settings.brokers = {name: broker.model_copy(update={
            "reconnect_delay": reconnect_delay, "reconnect_max_delay": reconnect_max_delay})
            for name, broker in settings.brokers.items()}
        with fleet(settings, topic) as processes:
            processes.start(app, ["s1"], PER_APP)
            with LoadProducer(settings, topic, pace=0.01) as producer:
                producer.wait_told(50)
                for _ in range(rounds):
                    taken = take_over(pair, processes, producer, app, "a")
                    print(taken, flush=True)
                    times.append(taken)
                    pair.start_as_slave(taken.killed)
            processes.stop()
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("takeover", __doc__)
    parser.add_argument("--rounds", type=int, default=10, help="takeovers to time")
    parser.add_argument("--reconnect-delay", type=float, default=0.2,
                        help="brokers.X.reconnect_delay (mdb's default: 0.5)")
    parser.add_argument("--reconnect-max-delay", type=float, default=1.0,
                        help="brokers.X.reconnect_max_delay (mdb's default: 30)")
    args = parser.parse_args(argv)
    if not activemq_available():
        return not_installed("ActiveMQ Classic")
    times = measure(args.rounds, args.reconnect_delay, args.reconnect_max_delay)
    for what, values in (("broker serving", [t.serving_after for t in times]),
                         ("message processed", [t.consumed_after for t in times]),
                         ("difference", [t.consumed_after - t.serving_after for t in times])):
        print(f"{what:>18}: median {statistics.median(values):.2f} s, "
              f"min {min(values):.2f} s, max {max(values):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
