"""What ``mdb migrate`` reads and what it says of it.

``Found`` is one element or property of an input file, as found; ``Rule`` is what an element
becomes in mdb, declared once beside the reader that knows the element, for the mapping, the
report and the table of docs/migrating-from-weblogic.md alike; ``Report`` holds the outcome
of every ``Found``: the mdb setting it became, or why it has none and what to do instead.
Nothing read leaves the report without an outcome (``Report.unsettled`` is empty at the end).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mdb import ConfigurationError
from mdb.observability.redaction import printable


@dataclass(frozen=True)
class Found:
    """One element (or activation property, or annotation attribute) of an input file: the
    file as the user can find it (``orders.ear!orders-ejb.jar!META-INF/ejb-jar.xml``), the
    element's path in it and its text."""

    file: str
    element: str
    value: str = ""

    def refuse(self, problem: str, fix: str) -> ConfigurationError:
        """The one line that stops the migration at this element: where, what is wrong, the
        fix. Every piece of the input in it is made printable (it may hold anything)."""
        value = f" {self.value!r}" if self.value else ""
        return ConfigurationError(printable(
            f"{self.file}: <{self.element}>{value}: {problem}; {fix}"))


@dataclass(frozen=True)
class Rule:
    """What an element becomes: ``becomes`` names the mdb setting (empty when there is
    none), ``instead`` says why there is none and what to do instead, or how mdb's setting
    differs. The table of docs/migrating-from-weblogic.md is made of these."""

    becomes: str = ""
    instead: str = ""


NOT_AN_MDB_SETTING = Rule(instead="not a setting of a message listener; nothing to migrate")
DOCUMENTATION = Rule(instead="documentation: nothing to migrate")
JNDI = Rule(instead="mdb looks nothing up in JNDI: a broker's address is `brokers.B.url`, a "
                    "destination is named in `destinations`")
SECURITY = Rule(instead="the bean's security identity: mdb runs with the broker login of "
                        "`brokers.B.username`; who may do what is the broker's authorization")
RESOURCE = Rule(instead="a resource the bean is given: a dependency of the handler, "
                        "`Provide[...]` of your dependency-injector container "
                        "(docs/concepts.md); a send to a destination is `ctx.send`")
TIMER = Rule(instead="an EJB timer: mdb has none; let a scheduler (cron, APScheduler) send a "
                     "message")
XA = ("WebLogic's Required is an XA transaction: mdb's is the broker's, which the handler's "
      "sends join and a database does not; for database writes that commit with the message "
      "use `exactly_once` (docs/exactly-once.md)")
"""What mdb says of XA, wherever a descriptor asks for it."""


@dataclass(frozen=True)
class Outcome:
    found: Found
    became: str
    """The setting written, ``listeners.order_bean.pool = 16``; empty when none."""
    note: str
    """Why there is none and what to do instead, or how mdb differs."""


@dataclass
class Report:
    """The outcome of everything read, in the order it was settled."""

    outcomes: list[Outcome] = field(default_factory=list)
    _open: dict[Found, None] = field(default_factory=dict)

    def read(self, found: Found) -> Found:
        """Note ``found`` as read: it must get an outcome before the report is written."""
        self._open[found] = None
        return found

    def became(self, found: Found, setting: str, note: str = "") -> None:
        self._settle(Outcome(found, setting, note))

    def none(self, found: Found, rule: Rule) -> None:
        """``found`` becomes nothing, for the reason ``rule`` gives."""
        self._settle(Outcome(found, rule.becomes, rule.instead))

    def _settle(self, outcome: Outcome) -> None:
        self._open.pop(outcome.found, None)
        self.outcomes.append(outcome)

    def counts(self) -> tuple[int, int]:
        """How many elements read became an mdb setting (for one listener at least), and how
        many became none."""
        became = {o.found for o in self.outcomes if o.became}
        return len(became), len({o.found for o in self.outcomes} - became)

    @property
    def unsettled(self) -> list[Found]:
        """What was read and has no outcome yet (empty once the migration is complete)."""
        return list(self._open)
