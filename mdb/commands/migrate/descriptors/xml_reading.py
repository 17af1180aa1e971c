"""Descriptors read safely, and walked element by element against what a reader knows.

A descriptor is input from a user: one with a DOCTYPE is refused before it is parsed, so no
entity is ever declared, expanded or fetched (the schema-based descriptors mdb migrate reads,
EJB 2.1 and later and WebLogic 9 and later, have none; only DTD-based ones, EJB 2.0 and
WebLogic 8.1, do). The standard library's expat parser does the rest: an entity it was not
told of is an error, and it fetches nothing.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
import xml.parsers.expat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from mdb import ConfigurationError
from mdb.commands.migrate.model import Found, Report, Rule
from mdb.observability.redaction import printable


class _Doctype(Exception):
    pass


def parse(data: bytes, file: str) -> ET.Element:
    """The root element of ``data`` (the file ``file``); ConfigurationError, one line naming
    the file, for XML that is not well-formed or declares a DOCTYPE."""
    scout = xml.parsers.expat.ParserCreate()

    def doctype(*_: object) -> None:
        raise _Doctype

    scout.StartDoctypeDeclHandler = doctype
    try:
        scout.Parse(data, True)
    except _Doctype:
        raise ConfigurationError(printable(
            f"{file}: has a DOCTYPE (a DTD-based descriptor, EJB 2.0 or WebLogic 8.1, or "
            "entity declarations): mdb migrate reads the schema-based descriptors of EJB 2.1 "
            "and later and WebLogic 9 and later, and never expands entities; convert it with "
            "WebLogic's weblogic.DDConverter, or remove the DOCTYPE")) from None
    except xml.parsers.expat.ExpatError:
        pass  # not well-formed: said by the parse below, with the same position
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise ConfigurationError(printable(
            f"{file}: not well-formed XML ({exc}); mend the file (an XML editor or "
            "`xmllint --noout` shows where)")) from None


def local(element: ET.Element) -> str:
    """The element's name without its namespace."""
    return element.tag.rpartition("}")[2]


def namespace(element: ET.Element) -> str:
    return element.tag[1:].partition("}")[0] if element.tag.startswith("{") else ""


def text(element: ET.Element) -> str:
    return (element.text or "").strip()


def version(root: ET.Element, file: str, namespaces: Mapping[str, str]) -> str:
    """The version ``root``'s namespace says (a value of ``namespaces``); ConfigurationError
    for a namespace the reader does not know."""
    found = namespace(root)
    if found not in namespaces:
        known = ", ".join(sorted(namespaces))
        raise Found(file, local(root), found).refuse(
            "an unknown namespace for this descriptor",
            f"mdb migrate reads {known}; check the xmlns of the root element")
    return namespaces[found]


@dataclass(frozen=True)
class Read:
    """An element its reader reads itself. ``rule`` says what it becomes, for the mapping
    table of the docs; a container whose children have a table of their own has none."""

    rule: Rule | None = None


Entry = str | Rule | Read
"""What a table says of an element: the bean setting it gives (a name of
``mdb.commands.migrate.bean.SETTINGS``), a ``Rule`` (no equivalent: settled as read), or
``Read``."""

Table = Mapping[str, Entry]


class Walk:
    """One file's elements, each checked against what its parent may hold (a ``Table``): one
    that has no mdb equivalent (a ``Rule``) goes to the report with its reason; the others
    are given back to the reader; an element the table does not know stops the migration,
    naming the file and the element."""

    def __init__(self, file: str, report: Report, schema: str) -> None:
        self.file = file
        self.report = report
        self.schema = schema

    def found(self, element: ET.Element, path: str, value: str | None = None) -> Found:
        """The ``Found`` for ``element`` at ``path``, noted in the report as read."""
        return self.report.read(Found(self.file, path, text(element) if value is None
                                      else value))

    def children(self, parent: ET.Element, path: str,
                 table: Table) -> Iterator[tuple[str | Read, ET.Element, str]]:
        """``(entry, child, path)`` for each child of ``parent`` whose entry is a setting or
        ``Read``; the others are settled here."""
        for child in parent:
            name = local(child)
            where = f"{path}/{name}" if path else name
            if name not in table:
                raise Found(self.file, where).refuse(
                    f"not an element of <{local(parent)}> mdb migrate knows",
                    f"check its spelling against {self.schema}; if the schema has it, remove "
                    "it from a copy of the file and say so in mdb's issue tracker")
            entry = table[name]
            if isinstance(entry, Rule):
                self.report.none(self.found(child, where, _summary(child)), entry)
            else:
                yield entry, child, where

    def first(self, parent: ET.Element, name: str, path: str) -> ET.Element:
        """The child ``name`` of ``parent``, which the schema requires."""
        for child in parent:
            if local(child) == name:
                return child
        raise Found(self.file, path).refuse(f"has no <{name}>",
                                            f"give it one, as {self.schema} requires")


def _summary(element: ET.Element) -> str:
    """What the report shows of an element it does not map: its text, or its children's
    names."""
    inner = text(element)
    if inner or not len(element):
        return inner
    return "(" + ", ".join(dict.fromkeys(local(c) for c in element)) + ")"
