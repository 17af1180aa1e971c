"""The migration report (Markdown): what was read, the listeners made, what is left to do,
and, file by file, every element and property read with the mdb setting it became or why it
has none and what to do instead. Every piece of input in it is made printable and kept out
of the table's syntax."""

from __future__ import annotations

import re
from collections.abc import Sequence

from mdb.commands.migrate.mapping.bean_mapping import MigratedListener
from mdb.commands.migrate.mapping.migrated_topology import MigratedTopology
from mdb.commands.migrate.model import Outcome, Report
from mdb.commands.migrate.writers.toml_values import value
from mdb.observability.redaction import printable


def render(read: Sequence[tuple[str, str]], report: Report, listeners: Sequence[MigratedListener],
           topology: MigratedTopology, written: Sequence[str], module: str, config: str) -> str:
    lines = ["# Migration report", "",
             "`mdb migrate weblogic` read:", ""]
    lines += [f"* {printable(file)} ({what})" for file, what in read]
    lines += ["", f"and wrote {', '.join(written)}.", "", "## Listeners", "",
              "| listener | WebLogic bean | destination | options |", "|---|---|---|---|"]
    for item in listeners:
        options = ", ".join(_options(item.values)) or "mdb's defaults"
        lines.append(f"| {item.name} | {_cell(item.bean)} | {item.destination} | "
                     f"{_cell(options)} |")
    differences = [(item.name, note) for item in listeners for note in item.defaults]
    if differences:
        lines += ["", "What WebLogic did where nothing was set, and mdb does otherwise:", ""]
        lines += [f"* {name}: {printable(note)}" for name, note in differences]
    lines += ["", "## To do", "",
              "1. Set each broker's `url` (and its login, `username` and `password_file`) in "
              f"{config}: " + "; ".join(f"`brokers.{b.name}`, {printable(b.about)}"
                                        for b in topology.brokers.values()) + ".",
              f"2. Port each handler of {module}: the `onMessage` named above it.",
              f"3. Check the plan, connecting to nothing: `mdb subscriptions "
              f"{module.removesuffix('.py')} --config {config} --server NAME`.",
              "4. Read each note below of a setting that has no equivalent: what to do "
              "instead, if anything.", ""]
    became, none = report.counts()
    lines += ["## Every element and property read", "",
              f"{became} became mdb settings; {none} have none, each with why (an element "
              "several listeners use has a row for each).", ""]
    by_file: dict[str, list[Outcome]] = {}
    for outcome in report.outcomes:
        by_file.setdefault(outcome.found.file, []).append(outcome)
    for file in sorted(by_file):
        lines += [f"### {printable(file)}", "", "| element | value | became | note |",
                  "|---|---|---|---|"]
        for outcome in sorted(by_file[file], key=lambda o: _natural(o.found.element)):
            found = outcome.found
            lines.append(f"| {_cell(found.element)} | {_cell(found.value)} | "
                         f"{_cell(outcome.became) or '—'} | {_cell(outcome.note)} |")
        lines.append("")
    return "\n".join(lines)



def _options(values: dict[str, object], prefix: str = "") -> list[str]:
    shown = []
    for key, item in values.items():
        if isinstance(item, dict):
            shown += _options(item, f"{prefix}{key}.")
        else:
            shown.append(f"{prefix}{key} = {value(item)}")
    return shown


def _natural(text: str) -> list[tuple[int, str]]:
    """``text`` as a key that puts line 3 before line 11."""
    return [(int(part), "") if part.isdigit() else (0, part)
            for part in re.split(r"(\d+)", text)]


def _cell(text: str) -> str:
    return printable(text).replace("|", "\\|")
