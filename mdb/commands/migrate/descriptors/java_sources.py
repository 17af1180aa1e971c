"""``@MessageDriven`` beans in Java sources: the annotation's name, mappedName, listener
interface and ``@ActivationConfigProperty`` list, and the class's (or its onMessage's)
``@TransactionManagement``, ``@TransactionAttribute`` and WebLogic's
``@TransactionTimeoutSeconds``.

The sources are read, not compiled: comments are skipped, and a value must be a literal (a
string, or strings joined with ``+``; an enum constant where the annotation takes one). A
constant defined elsewhere cannot be known without compiling, so it stops the migration,
naming the line; a descriptor's value beats an annotation's, so an ``ejb-jar.xml`` entry
mends it too. Whatever ``ejb-jar.xml`` says, an annotation of an application whose
``ejb-jar.xml`` is ``metadata-complete`` is reported as ignored, as the container ignores it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mdb.commands.migrate.application import Application
from mdb.commands.migrate.bean import Source
from mdb.commands.migrate.descriptors.activation import give_property
from mdb.commands.migrate.model import DOCUMENTATION, Found, Rule

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<char>'(?:[^'\\\n]|\\.)*')
  | (?P<name>[A-Za-z_$][\w$]*(?:\s*\.\s*[A-Za-z_$][\w$]*)*)
  | (?P<number>[0-9][\w.]*)
  | (?P<punct>[@(){}=,+;<>\[\]\-*/!?:&|^%~.])
""", re.VERBOSE)
_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", '"': '"', "'": "'",
            "\\": "\\", "s": " "}
_IGNORED = Rule(instead="ignored: ejb-jar.xml is metadata-complete, so the container does not "
                        "read annotations")

ANNOTATIONS: dict[str, str | Rule] = {
    "@MessageDriven(name)": Rule("the listener's name (as ejb-name)"),
    "@MessageDriven(mappedName)": "destination",
    "@MessageDriven(messageListenerInterface)": "messagingType",
    "@MessageDriven(description)": DOCUMENTATION,
    "@MessageDriven(activationConfig)": Rule("each @ActivationConfigProperty: the setting its "
                                             "propertyName says (the activation properties' "
                                             "table)"),
    "the class": "ejbClass",
    "@TransactionManagement": "transactionType",
    "@TransactionAttribute": "transAttribute",
    "@TransactionTimeoutSeconds": "transTimeoutSeconds",
}
"""What each annotation gives (the mapping table of the docs)."""


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    at: int


@dataclass(frozen=True)
class _Name:
    """A name where a value was expected: an enum constant, a class (``X.class``), or a
    constant defined elsewhere."""

    text: str


@dataclass(frozen=True)
class _Annotation:
    name: str
    arguments: dict[str, object]
    at: int


def read(source: str, file: str, app: Application) -> int:
    """Read the ``@MessageDriven`` beans of ``source`` (the file ``file``) into ``app``; how
    many there were."""
    code = _without_comments(source)
    tokens = [_Token(m.lastgroup or "", m.group(), m.start())
              for m in _TOKEN.finditer(code) if m.lastgroup != "space"]
    package = next((tokens[i + 1].text.replace(" ", "") for i, t in enumerate(tokens[:-1])
                    if t.text == "package"), "")
    beans = 0
    for index, token in enumerate(tokens):
        if token.text == "@" and index + 1 < len(tokens) and _is(tokens[index + 1].text,
                                                                "MessageDriven"):
            parser = _JavaParser(tokens, index, code, file)
            driven = parser.annotation()
            cls = parser.class_after(parser.position)
            _give(app, driven, cls, package, parser, code, file)
            beans += 1
    return beans


def _give(app: Application, driven: _Annotation, cls: tuple[str, int, int], package: str,
          parser: _JavaParser, code: str, file: str) -> None:
    class_name, class_at, body_at = cls
    name = _literal(driven.arguments.get("name", class_name), file, code, driven.at,
                    "@MessageDriven(name)")
    report = app.report
    bean = None if app.metadata_complete else app.bean(name)

    def give(setting: str | Rule, found: Found) -> None:
        """``found`` says ``setting`` (or has no equivalent, for the reason a Rule gives)."""
        report.read(found)
        if bean is None:
            report.none(found, _IGNORED)
        elif isinstance(setting, Rule):
            report.none(found, setting)
        else:
            bean.give(setting, Source.ANNOTATION, found, report)

    defining = report.read(_found(file, code, driven.at,
                                  f"@MessageDriven(name) of {class_name}", name))
    held = app.defined.get(name)
    if app.metadata_complete:
        report.none(defining, _IGNORED)
    elif held is not None:
        report.none(defining, Rule(instead=f"the bean of <{held.element}> of {held.file}"))
    else:
        app.defined[name] = defining
    give("ejbClass", _found(file, code, class_at, f"the class {class_name}",
                            f"{package}.{class_name}" if package else class_name))
    for key, value in driven.arguments.items():
        element = f"@MessageDriven({key})"
        if element not in ANNOTATIONS:
            raise _found(file, code, driven.at, element, "").refuse(
                "not an attribute of @MessageDriven",
                "check its spelling (name, mappedName, messageListenerInterface, "
                "activationConfig, description)")
        if key == "name":
            continue
        if key == "messageListenerInterface" and isinstance(value, _Name):
            value = value.text.removesuffix(".class")
        if key != "activationConfig":
            give(ANNOTATIONS[element], _found(file, code, driven.at, f"{element} of {class_name}",
                                              _literal(value, file, code, driven.at, element)))
            continue
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, _Annotation) or not _is(item.name,
                                                            "ActivationConfigProperty"):
                raise _found(file, code, driven.at, element, "").refuse(
                    "not a list of @ActivationConfigProperty", "write one per property")
            prop = _literal(item.arguments.get("propertyName"), file, code, item.at,
                            "@ActivationConfigProperty(propertyName)")
            prop_value = _literal(item.arguments.get("propertyValue"), file, code, item.at,
                                  "@ActivationConfigProperty(propertyValue)")
            found = report.read(_found(file, code, item.at, f"@MessageDriven(activationConfig)/"
                                       f"@ActivationConfigProperty[{prop}] of {class_name}",
                                       prop_value))
            if bean is None:
                report.none(found, _IGNORED)
            else:
                give_property(bean, prop, found, Source.ANNOTATION, report)
    for annotation in [*parser.annotations_before(class_at),
                       *parser.annotations_before(parser.on_message(body_at))]:
        for short, setting in (("TransactionManagement", "transactionType"),
                               ("TransactionAttribute", "transAttribute"),
                               ("TransactionTimeoutSeconds", "transTimeoutSeconds")):
            if _is(annotation.name, short):
                value = annotation.arguments.get("value")
                if isinstance(value, _Name):
                    value = _constant(value.text.rpartition(".")[2])
                give(setting, _found(file, code, annotation.at, f"@{short} of {class_name}",
                                     _literal(value, file, code, annotation.at, f"@{short}")))


def _is(name: str, short: str) -> bool:
    """Whether ``name`` is the EJB annotation ``short``, plain or qualified."""
    return name.replace(" ", "").rpartition(".")[2] == short


def _constant(text: str) -> str:
    """An enum constant (or a number) as the descriptors write it: ``NOT_SUPPORTED`` is
    NotSupported, ``BEAN`` is Bean, 60 is 60."""
    if not text.replace("_", "").isalpha() or not text.isupper():
        return text
    return "".join(part.capitalize() for part in text.split("_"))


def _literal(value: object, file: str, code: str, at: int, element: str) -> str:
    if isinstance(value, str):
        return value
    shown = value.text if isinstance(value, _Name) else str(value)
    raise _found(file, code, at, element, shown).refuse(
        "not a literal: mdb migrate reads the sources without compiling them",
        "write the value as a literal, or give the setting in ejb-jar.xml, whose value "
        "beats the annotation's")


def _found(file: str, code: str, at: int, element: str, value: str) -> Found:
    return Found(file, f"line {code.count(chr(10), 0, at) + 1}: {element}", value)


def _without_comments(source: str) -> str:
    """``source`` with its comments blanked (line breaks kept, so positions and line numbers
    hold), its string literals untouched."""
    def blank(match: re.Match[str]) -> str:
        text = match.group()
        if text[0] in "\"'":
            return text
        return "".join(c if c == "\n" else " " for c in text)

    return _COMMENT.sub(blank, source)


class _JavaParser:
    """Annotations from ``tokens``, from ``position`` on."""

    def __init__(self, tokens: list[_Token], position: int, code: str, file: str) -> None:
        self.tokens = tokens
        self.position = position
        self.code = code
        self.file = file

    def _refuse(self, problem: str) -> Exception:
        at = self.tokens[min(self.position, len(self.tokens) - 1)].at if self.tokens else 0
        return _found(self.file, self.code, at, "an annotation", "").refuse(
            problem, "mend the source (does it compile?)")

    def _next(self) -> _Token:
        if self.position >= len(self.tokens):
            raise self._refuse("the file ends inside it")
        token = self.tokens[self.position]
        self.position += 1
        return token

    def _peek(self) -> str:
        return self.tokens[self.position].text if self.position < len(self.tokens) else ""

    def _expect(self, text: str) -> None:
        if self._next().text != text:
            raise self._refuse(f"expected {text!r}")

    def annotation(self) -> _Annotation:
        start = self._next()  # the @
        name = self._next()
        if name.kind != "name":
            raise self._refuse("an @ without a name")
        arguments: dict[str, object] = {}
        if self._peek() == "(":
            self._next()
            if self._peek() != ")":
                if self.position + 1 < len(self.tokens) and \
                        self.tokens[self.position + 1].text == "=":
                    while True:
                        key = self._next().text
                        self._expect("=")
                        arguments[key] = self._value()
                        if self._peek() != ",":
                            break
                        self._next()
                else:
                    arguments["value"] = self._value()
            self._expect(")")
        return _Annotation(name.text.replace(" ", ""), arguments, start.at)

    def _value(self) -> object:
        token = self.tokens[self.position] if self.position < len(self.tokens) else None
        if token is None:
            raise self._refuse("the file ends inside it")
        if token.text == "@":
            return self.annotation()
        if token.text == "{":
            self._next()
            items: list[object] = []
            while self._peek() != "}":
                items.append(self._value())
                if self._peek() == ",":
                    self._next()
            self._next()
            return items
        if token.kind == "string":
            text = self._string(self._next())
            while self._peek() == "+":
                self._next()
                part = self._next()
                if part.kind != "string":
                    return _Name(f"{text!r} + {part.text}")
                text += self._string(part)
            return text
        if token.kind in ("name", "number", "char") or token.text == "-":
            parts = [self._next().text]
            while self._peek() not in (",", ")", "}", ""):
                parts.append(self._next().text)
            return _Name(" ".join(parts).replace(" ", ""))
        raise self._refuse(f"unexpected {token.text!r}")

    def _string(self, token: _Token) -> str:
        out, text, index = [], token.text[1:-1], 0
        while index < len(text):
            char = text[index]
            if char != "\\":
                out.append(char)
                index += 1
                continue
            escaped = text[index + 1]
            if escaped == "u":
                out.append(chr(int(text[index + 2:index + 6], 16)))
                index += 6
            elif escaped in _ESCAPES:
                out.append(_ESCAPES[escaped])
                index += 2
            else:
                raise self._refuse(f"an escape mdb migrate does not read: \\{escaped}")
        return "".join(out)

    def class_after(self, position: int) -> tuple[str, int, int]:
        """The class declared after ``position``: its name, the position of its name's token
        and of its body's ``{`` (token indexes)."""
        for index in range(position, len(self.tokens) - 1):
            if self.tokens[index].text == "class" and self.tokens[index + 1].kind == "name":
                body = next((i for i in range(index, len(self.tokens))
                             if self.tokens[i].text == "{"), len(self.tokens))
                return self.tokens[index + 1].text, index, body
        raise self._refuse("@MessageDriven on no class")

    def annotations_before(self, position: int | None) -> list[_Annotation]:
        """The annotations of the declaration whose name's token is at ``position``: those
        since the end of the statement or block before it (the braces of an annotation's
        arguments, inside its parentheses, do not end it)."""
        if position is None:
            return []
        start, depth = position, 0
        while start > 0:
            text = self.tokens[start - 1].text
            depth += (text == ")") - (text == "(")
            if depth == 0 and text in (";", "{", "}"):
                break
            start -= 1
        found = []
        index = start
        while index < position:
            if self.tokens[index].text == "@" and self.tokens[index + 1].text != "interface":
                parser = _JavaParser(self.tokens, index, self.code, self.file)
                found.append(parser.annotation())
                index = parser.position
            else:
                index += 1
        return found

    def on_message(self, body: int) -> int | None:
        """The position of the class's ``onMessage`` method, if it declares one."""
        depth = 0
        for index in range(body, len(self.tokens) - 1):
            text = self.tokens[index].text
            depth += text == "{"
            depth -= text == "}"
            if depth == 1 and text == "onMessage" and self.tokens[index + 1].text == "(":
                return index
            if depth == 0 and index > body:
                return None
        return None
