"""A small subset of JMS message selectors, evaluated against a message's headers by mdb.

Who evaluates a listener's selector (docs/distribution.md): on a topic, the container, on every
broker (``mdb.routing.planning`` compiles it with this module at startup; the delivery code settles
a message it does not select without running the handler); on a queue, the broker: the embedded
memory broker with this module, ActiveMQ with its own full syntax, while RabbitMQ's STOMP plugin
ignores selectors, so the STOMP adapter refuses a queue subscription that has one.

Supported::

    selector   := or
    or         := and ("OR" and)*
    and        := not ("AND" not)*
    not        := "NOT" not | comparison
    comparison := operand [ ("=" | "<>" | "<" | ">" | "<=" | ">=") operand
                          | "IS" ["NOT"] "NULL" ]
    operand    := "(" or ")" | identifier | 'string' | number | TRUE | FALSE

Keywords are case-insensitive; a string literal doubles a quote to contain one (``'it''s'``).
``LIKE``, ``IN``, ``BETWEEN`` and arithmetic are not supported and are refused when parsing.

Evaluation follows SQL's three-valued logic, as JMS does: a header that is absent is NULL, any
comparison with NULL is unknown, and a message matches only when the selector is TRUE.
Headers are strings (as they are over STOMP), so a header compared with a number is read as a
number (``'7' > 5`` is true; ``'abc' > 5`` is unknown); ``<``, ``>``, ``<=``, ``>=`` between two
strings compare them as numbers when both are numeric and are unknown otherwise. A header used
as a condition on its own (``urgent AND ...``) is true when its value is ``true``
(case-insensitive).

Numbers are compared exactly, as decimal numbers of any length (``Decimal``): JMS compares a
number with a decimal point or an exponent as a double, which gives the same answer up to a
double's 15 to 17 significant digits and a wrong one beyond (two long numbers that differ
only past them, or beyond a double's range, would be equal). A header that is not written as a
number (``inf``, ``nan``, ``1_000``) or whose exponent is beyond ``Decimal``'s range is not one.

Parentheses nest at most ``MAX_DEPTH`` deep (a deeper selector is refused with
``SelectorError``): parsing and evaluating follow the nesting, and a selector must never run
out of Python's stack. ``NOT`` may be repeated any number of times.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation

from mdb.errors import SelectorError

__all__ = ["Headers", "Matcher", "SelectorError", "compile_selector"]

Headers = Mapping[str, str]
Value = str | Decimal | bool | None
Matcher = Callable[[Headers], bool]

_TOKEN = re.compile(
    r"""
    \s*(?:
        (?P<string>'(?:[^']|'')*')
      | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
      | (?P<op><>|<=|>=|=|<|>|\(|\)|[+-])
      | (?P<word>[A-Za-z_$][A-Za-z0-9_$]*)
      | (?P<bad>\S)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"AND", "OR", "NOT", "IS", "NULL", "TRUE", "FALSE"}
_UNSUPPORTED = {"LIKE", "IN", "BETWEEN", "ESCAPE"}
_COMPARISONS = {"=", "<>", "<", ">", "<=", ">="}
_NUMBER = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?", re.ASCII)
MAX_DEPTH = 50  # parentheses inside parentheses


def compile_selector(text: str) -> Matcher:
    """Parse ``text`` into a function telling whether a message's headers match it."""
    condition = _condition(_SelectorParser(text).parse())
    return lambda headers: condition(headers) is True


# --- parsing -------------------------------------------------------------------------------

# A compiled node is (kind, evaluate): kind "condition" (comparisons and logic), "header"
# (an identifier: a value that may also serve as a condition), "boolean" (TRUE/FALSE) or
# "literal" (a string or number, never a condition on its own).
Node = tuple[str, Callable[[Headers], Value]]


class _SelectorParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        for match in _TOKEN.finditer(text):
            kind = match.lastgroup
            if kind is None:  # only trailing whitespace left
                continue
            value = match.group(kind)
            position = match.start(kind)
            if kind == "bad":
                raise SelectorError(f"unexpected character {value!r} at position {position}")
            if kind == "word":
                upper = value.upper()
                if upper in _UNSUPPORTED:
                    raise SelectorError(f"{upper} is not in the supported subset")
                if upper in _KEYWORDS:
                    kind, value = "keyword", upper
            self.tokens.append((kind, value, position))
        self.pos = 0
        self.depth = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise SelectorError("the selector is empty")
        node = self._or()
        if self.pos < len(self.tokens):
            _, value, position = self.tokens[self.pos]
            raise SelectorError(f"unexpected {value!r} at position {position}")
        return node

    # helpers
    def _peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _accept(self, kind: str, value: str | None = None) -> bool:
        token = self._peek()
        if token is not None and token[0] == kind and (value is None or token[1] == value):
            self.pos += 1
            return True
        return False

    def _fail(self, expected: str) -> SelectorError:
        token = self._peek()
        if token is None:
            return SelectorError(f"expected {expected} at the end of the selector")
        return SelectorError(f"expected {expected} at position {token[2]}, found {token[1]!r}")

    # grammar
    def _or(self) -> Node:
        return self._junction("OR", self._and, decisive=True)

    def _and(self) -> Node:
        return self._junction("AND", self._not, decisive=False)

    def _junction(self, keyword: str, operand: Callable[[], Node], decisive: bool) -> Node:
        """``operand (keyword operand)*``. In three-valued logic the result is ``decisive``
        (TRUE for OR, FALSE for AND) as soon as one operand is; else unknown if one is
        unknown; else the other truth value."""
        first = operand()
        parts = [first]
        while self._accept("keyword", keyword):
            parts.append(operand())
        if len(parts) == 1:
            return first
        fns = [_condition(p) for p in parts]

        def evaluate(h: Headers) -> Value:
            result: Value = not decisive
            for fn in fns:
                v = fn(h)
                if v is decisive:
                    return decisive
                if v is None:
                    result = None
            return result

        return "condition", evaluate

    def _not(self) -> Node:
        # A loop, not a recursion: only the parity of a run of NOTs matters.
        negations = 0
        while self._accept("keyword", "NOT"):
            negations += 1
        node = self._comparison()
        if not negations:
            return node
        fn = _condition(node)
        if negations % 2 == 0:
            return "condition", fn

        def evaluate(h: Headers) -> Value:
            v = fn(h)
            return None if v is None else not v

        return "condition", evaluate

    def _comparison(self) -> Node:
        left = self._operand()
        token = self._peek()
        if token is not None and token[0] == "op" and token[1] in _COMPARISONS:
            self.pos += 1
            right = self._operand()
            return "condition", _comparison(token[1], left[1], right[1])
        if self._accept("keyword", "IS"):
            negate = self._accept("keyword", "NOT")
            if not self._accept("keyword", "NULL"):
                raise self._fail("NULL")
            value = left[1]
            if negate:
                return "condition", lambda h: value(h) is not None
            return "condition", lambda h: value(h) is None
        return left

    def _operand(self) -> Node:
        token = self._peek()
        if token is None:
            raise self._fail("a header name, a literal or '('")
        kind, value, _ = token
        self.pos += 1
        if kind == "op" and value == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise SelectorError(f"parentheses nested more than {MAX_DEPTH} deep at position "
                                    f"{token[2]}")
            node = self._or()
            if not self._accept("op", ")"):
                raise self._fail("')'")
            self.depth -= 1
            return node
        if kind == "op" and value in "+-":
            number = self._peek()
            if number is None or number[0] != "number":
                raise self._fail("a number after the sign")
            self.pos += 1
            literal = _literal(number[1], number[2])
            signed = -literal if value == "-" else literal
            return "literal", lambda h: signed
        if kind == "word":
            name = value
            return "header", lambda h: h.get(name)
        if kind == "string":
            text = value[1:-1].replace("''", "'")
            return "literal", lambda h: text
        if kind == "number":
            literal = _literal(value, token[2])
            return "literal", lambda h: literal
        if kind == "keyword" and value in ("TRUE", "FALSE"):
            flag = value == "TRUE"
            return "boolean", lambda h: flag
        self.pos -= 1
        raise self._fail("a header name, a literal or '('")


def _number(text: str) -> Decimal | None:
    """The number ``text`` is written as, exactly; None when it is not one."""
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:  # an exponent beyond Decimal's range
        return None


def _literal(text: str, position: int) -> Decimal:
    number = _number(text)
    if number is None:
        raise SelectorError(f"the number at position {position} is out of range")
    return number


def _condition(node: Node) -> Callable[[Headers], Value]:
    """The node as a three-valued condition; literals cannot be one."""
    kind, fn = node
    if kind in ("condition", "boolean"):
        return fn
    if kind == "header":
        return lambda h: _truth(fn(h))
    raise SelectorError("a string or number literal cannot be used as a condition")


# --- evaluation ----------------------------------------------------------------------------


def _truth(value: Value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
    return None


def _to_number(value: Value) -> Decimal | None:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, str):
        return _number(value.strip())
    return None


_ORDER: dict[str, Callable[[object, object], bool]] = {
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,  # type: ignore[operator]
    ">": lambda a, b: a > b,  # type: ignore[operator]
    "<=": lambda a, b: a <= b,  # type: ignore[operator]
    ">=": lambda a, b: a >= b,  # type: ignore[operator]
}


def _compare(op: str, a: Value, b: Value) -> bool | None:
    if a is None or b is None:
        return None
    test = _ORDER[op]
    if isinstance(a, bool) or isinstance(b, bool):
        if op not in ("=", "<>"):
            return None
        ta, tb = _truth(a), _truth(b)
        if ta is None or tb is None:
            return None
        return test(ta, tb)
    if isinstance(a, str) and isinstance(b, str) and op in ("=", "<>"):
        return test(a, b)
    na, nb = _to_number(a), _to_number(b)
    if na is None or nb is None:
        return None
    return test(na, nb)


def _comparison(op: str, left: Callable[[Headers], Value],
                right: Callable[[Headers], Value]) -> Callable[[Headers], Value]:
    return lambda h: _compare(op, left(h), right(h))
