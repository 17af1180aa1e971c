"""The ledger of the fault tests: who processed what, checked against what the producer was told.

The contract after a fault (docs/architecture.md, "Delivery contract", rules 4 and 6):

* every message whose ``Producer.send`` returned (``told``) is processed — once per app in
  ``one-copy-per-app``, by every server in ``one-copy-per-server``;
* a message may be processed again by the same app (or server) only when it was in doubt, and
  then the repeat is flagged: only the first of its deliveries there may have ``redelivered``
  False (one processed unflagged after a flagged one is a stale delivery processed as fresh);
* nothing told-sent is left behind on a broker once the processes stopped.

An app may be a two-stage pipeline (``SEND_TO``, see ``tests.harness.apps.topic_ledger_app``): its
first stage sends each message it processes on to a queue, its second stage records what it
receives. Then, by rule 6 of the contract, every message the first stage processed reaches
the second stage, and every delivery there after the first of its message is flagged: a
delivery of a send made again (a repeat at the first stage) by ``mdb_maybe_repeat``, under the
same ``mdb_id``; a delivery the broker gave again, by ``redelivered`` (``check_sent_on``).

A message whose send raised is not told-sent: it may or may not arrive (``SendOutcomeUnknown``),
so it is neither required nor an error when it is processed (counted as ``unconfirmed``).

``check`` is the pure checker. ``tests.harness.processes.fleet.Fleet`` runs container processes of
``tests.harness.apps.topic_ledger_app`` and gathers their ledgers (and checks them with ``check``);
``tests.harness.traffic.load_producer.LoadProducer`` sends continuously from a thread and remembers
what it was told.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PER_APP, PER_SERVER = "one-copy-per-app", "one-copy-per-server"

Entry = Mapping[str, Any]


@dataclass
class Verdict:
    """One app's (``one-copy-per-app``) or one server's (``one-copy-per-server``) account."""

    told: int  # messages the producer was told were sent
    processed: int  # of those, how many were processed at least once
    deliveries: int  # ``done`` entries, repeats included
    lost: list[str] = field(default_factory=list)  # told-sent, never processed
    flagged: int = 0  # repeats flagged redelivered (or mdb_maybe_repeat)
    unflagged: list[str] = field(default_factory=list)  # ids with a repeat not flagged
    unconfirmed: int = 0  # processed ids the producer was not told were sent
    #: Second stage only: first-stage ids whose sends on arrived under more than one mdb_id.
    renamed: list[str] = field(default_factory=list)

    @property
    def repeats(self) -> int:
        return self.deliveries - self.processed - self.unconfirmed

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unflagged and not self.renamed

    def __str__(self) -> str:
        return (f"told {self.told}, processed {self.processed}, deliveries {self.deliveries}, "
                f"repeats flagged {self.flagged} / unflagged {len(self.unflagged)}, "
                f"lost {len(self.lost)}, unconfirmed processed {self.unconfirmed}"
                + (f"; lost {sorted(self.lost)[:5]}" if self.lost else "")
                + (f"; unflagged {sorted(self.unflagged)[:5]}" if self.unflagged else "")
                + (f"; renamed {sorted(self.renamed)[:5]}" if self.renamed else ""))


def check(told: Collection[str], entries: Iterable[Entry]) -> Verdict:
    """Check the ``done`` entries of one app or one server against the told-sent ids.

    Ledger lines of several processes reach the test through separate pipes, so their order is
    not trusted; the deliveries of one id are put in the order their handlers began
    (``started``, one clock for every process) and each after the first is a repeat, which
    must be flagged. Without ``started`` a repeat counts as flagged unless the id was
    delivered unflagged more than once.

    A delivery marked ``maybe_repeat`` (a second stage's: the send was made again) is a
    flagged repeat whenever it comes; the order applies to the others, the deliveries of the
    first send: only the first of those may be unflagged.
    """
    told_set = set(told)
    by_id: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        if entry.get("event", "done") == "done":
            by_id[entry["id"]].append(entry)
    verdict = Verdict(told=len(told_set), processed=len(told_set & by_id.keys()),
                      deliveries=sum(len(e) for e in by_id.values()))
    verdict.lost = sorted(told_set - by_id.keys())
    verdict.unconfirmed = len(by_id.keys() - told_set)
    for message_id, deliveries in by_id.items():
        first_send = [e for e in deliveries if not e.get("maybe_repeat")]
        if all("started" in e for e in first_send):
            repeats = sorted(first_send, key=lambda e: e["started"])[1:]
            unflagged = sum(1 for e in repeats if not e["redelivered"])
        else:
            unflagged = max(0, sum(1 for e in first_send if not e["redelivered"]) - 1)
        if unflagged:
            verdict.unflagged.append(message_id)
        verdict.flagged += len(deliveries) - 1 - unflagged
    return verdict


def check_sent_on(first: Iterable[Entry], second: Iterable[Entry]) -> Verdict:
    """Check a pipeline's second stage (the ``done`` entries of its queue listener, each with
    the ``source`` it received) against its first (the ``done`` entries of its topic
    listener): each message the first stage processed counts as told-sent to the second, and
    ``check`` judges the second stage's deliveries per ``source``; every delivery of one
    source must carry one ``mdb_id`` (``renamed`` lists the sources that came under more)."""
    processed = {e["id"] for e in first if e.get("event", "done") == "done"}
    received = [e for e in second if e.get("event", "done") == "done"]
    verdict = check(processed, [{**e, "id": e["source"]} for e in received])
    ids: dict[str, set[str]] = defaultdict(set)
    for entry in received:
        ids[entry["source"]].add(entry["id"])
    verdict.renamed = sorted(source for source, found in ids.items() if len(found) > 1)
    return verdict


def views(entries: Iterable[Entry], distribution: str) -> dict[str, list[Entry]]:
    """The entries per app (``one-copy-per-app``) or per app/server (``one-copy-per-server``)."""
    grouped: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        key = entry["app"] if distribution == PER_APP else f"{entry['app']}/{entry['server']}"
        grouped[key].append(entry)
    return grouped
