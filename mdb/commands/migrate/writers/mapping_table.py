"""The mapping table of docs/migrating-from-weblogic.md, made from what the readers declare
(their tables, the activation properties, the annotations, the bean settings): every element
and property mdb migrate knows, with the mdb setting it becomes or why it has none.
``python -m mdb.commands.migrate.writers.mapping_table`` prints it; a unit test fails while the page
does not hold it as printed."""

from __future__ import annotations

from collections.abc import Iterator

from mdb.commands.migrate.bean import SETTINGS
from mdb.commands.migrate.descriptors import (
    domain,
    ejb_jar,
    java_sources,
    jms_module,
    weblogic_ejb_jar,
)
from mdb.commands.migrate.descriptors.activation import PROPERTIES
from mdb.commands.migrate.descriptors.xml_reading import Entry, Read
from mdb.commands.migrate.model import Rule


def markdown() -> str:
    parts: list[str] = []
    for title, tables in (("`ejb-jar.xml`", ejb_jar.TABLES),
                          ("`weblogic-ejb-jar.xml`", weblogic_ejb_jar.TABLES),
                          ("The JMS module, `*-jms.xml`", jms_module.TABLES),
                          ("The domain, `config.xml`", domain.TABLES)):
        parts.append(_section(title, "element", (
            (parent, name, entry) for parent, table in tables for name, entry in table.items())))
    for who, group in PROPERTIES.items():
        parts.append(_section(f"Activation properties of {who}", "property", (
            ("", name, entry) for name, entry in group.items())))
    parts.append(_section("Annotations of a Java source", "annotation", (
        ("", name, entry) for name, entry in java_sources.ANNOTATIONS.items())))
    return "\n\n".join(parts)


def _section(title: str, kind: str, rows: Iterator[tuple[str, str, Entry]]) -> str:
    """A table of ``rows`` (parent, name, entry); the names of one parent that say the same
    share a row."""
    grouped: dict[tuple[str, Rule], list[str]] = {}
    for parent, name, entry in rows:
        rule = _rule(entry)
        if rule is not None:
            grouped.setdefault((parent, rule), []).append(name)
    lines = [f"### {title}", "", f"| {kind} | becomes | no equivalent, or how mdb differs |",
             "|---|---|---|"]
    for (parent, rule), names in grouped.items():
        where = f"in <{parent}>: " if parent else ""
        shown = ", ".join(n if " " in n else f"`{n}`" for n in names)
        lines.append(f"| {where}{shown} | {rule.becomes or '—'} | {rule.instead} |")
    return "\n".join(lines)


def _rule(entry: Entry) -> Rule | None:
    """What ``entry`` says; None for a container, whose children are rows of their own."""
    if isinstance(entry, str):
        return SETTINGS[entry]
    if isinstance(entry, Read):
        return entry.rule
    return entry


if __name__ == "__main__":
    print(markdown())
