"""Bodies: decoded from the handler's annotation, encoded from what a handler sends.

A body is never part of an error's text: the text of a ``DecodeError`` (and of any pydantic
``ValidationError``, through ``describe``) goes to logs, span status and the error
destination's headers, so it says where and why a body is invalid, never what it holds."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from mdb.errors import DecodeError, EncodeError, error_type
from mdb.messages.headers import ID
from mdb.messages.jms_names import warn_unselectable
from mdb.messages.message import OutgoingMessage, labelled, new_id, refuse_nul
from mdb.seam.broker import HeaderLimits

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
BYTES = "application/octet-stream"


def decoder_for(annotation: Any) -> Callable[[bytes], Any]:
    """A function turning a body into ``annotation``; it raises DecodeError on a bad body,
    whatever decoding it raised (a body nested too deep for the parser, a validator's own
    error), MemoryError aside."""
    if annotation is bytes or annotation is Any:
        return lambda body: body
    if annotation is str:
        return _decoding(bytes.decode, UnicodeDecodeError, "body is not UTF-8 text")
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _decoding(annotation.model_validate_json, ValidationError,
                         f"body is not a valid {annotation.__name__}")
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    if annotation in (dict, list) or get_origin(annotation) in (dict, list):
        return _decoding(lambda body: adapter.validate_python(json.loads(body)), ValueError,
                         f"body is not JSON of type {annotation}")
    return _decoding(adapter.validate_json, ValidationError,
                     f"body does not decode as {annotation}")


def _decoding(parse: Callable[[bytes], Any], errors: type[Exception],
              what: str) -> Callable[[bytes], Any]:
    """``parse`` raising ``DecodeError("<what>: <why>")`` instead of ``errors``, and
    ``DecodeError("<what>: <type>: <why>")`` instead of any other exception but MemoryError."""

    def decode(body: bytes) -> Any:
        try:
            return parse(body)
        except errors as exc:
            raise DecodeError(f"{what}: {describe(exc)}") from None
        except MemoryError:
            raise  # the process is out of memory, which says nothing of this body
        except Exception as exc:  # RecursionError from deep nesting, a validator's own error
            raise DecodeError(f"{what}: {error_type(exc)}: {describe(exc)}") from None

    return decode


MAX_ERRORS_SHOWN = 10
MAX_TEXT = 4000
"""Characters of an exception's text that ``describe`` keeps: what logs, span status and error
headers show of a failure (the headers cut it again, to ``ERROR_TEXT_LIMIT`` bytes)."""


def describe(exc: BaseException) -> str:
    """``str(exc)``, except for a pydantic ``ValidationError``: its errors' locations and
    messages without the input values, their types or pydantic's URLs. A location's part that
    is not an identifier (a dictionary key taken from the input) shows as ``<key>``. Never
    raises: an exception whose text cannot be had (its ``__str__`` raised) is
    ``<unprintable TYPE>``; a text longer than ``MAX_TEXT`` is cut, saying so."""
    try:
        # An exact str: the methods of a str subclass that __str__ may return could raise too.
        text = str.__str__(_validation_text(exc) if isinstance(exc, ValidationError)
                           else str(exc))
    except BaseException:  # no await in here: not a cancellation, the exception's own doing
        return f"<unprintable {error_type(exc)}>"
    if len(text) <= MAX_TEXT:
        return text
    return f"{text[:MAX_TEXT]}... (cut: {len(text)} characters)"


def _validation_text(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    shown = "; ".join(f"{_location(e['loc'])}: {e['msg']}" if e["loc"] else e["msg"]
                      for e in errors[:MAX_ERRORS_SHOWN])
    more = len(errors) - MAX_ERRORS_SHOWN
    return (f"{len(errors)} validation error{'s' if len(errors) > 1 else ''} for {exc.title}: "
            f"{shown}{f'; and {more} more' if more > 0 else ''}")


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) if isinstance(part, int) or (part.isidentifier() and len(part) < 64)
                    else "<key>" for part in loc)


def encode(body: object) -> tuple[bytes, str]:
    """The bytes and content type of a body to send; raises ``EncodeError`` (a ``TypeError``)
    for a body that is none of bytes, str, a pydantic model or JSON-serialisable data."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), BYTES
    if isinstance(body, str):
        return body.encode(), TEXT
    if isinstance(body, BaseModel):
        return body.model_dump_json().encode(), JSON
    try:
        return json.dumps(body, separators=(",", ":")).encode(), JSON
    except TypeError as exc:
        raise EncodeError(
            f"cannot send a {type(body).__name__}: send bytes, str, a pydantic model, "
            "or JSON-serialisable data"
        ) from exc


def outgoing(body: object, headers: Mapping[str, str] | None = None,
             own: Mapping[str, str] | None = None, *,
             limits: HeaderLimits | None = None) -> OutgoingMessage:
    """A new message: the encoded body, its content type (``content-type`` and
    ``mdb_content_type``: the one ``headers`` declare, else the body's), and mdb's ``own``
    headers over ``headers`` (a handler's: its derived ``mdb_id``). Without ``own``, the
    ``mdb_id`` is the one ``headers`` give (a producer sending a message again under its id),
    else a fresh one.
    Raises ``EncodeError`` for a body ``encode`` refuses, an empty ``mdb_id``, a header holding
    a NUL byte, or
    ``headers`` that take the message beyond ``limits`` (``refuse_oversized``; those of the
    brokers it may go to, ``Brokers.header_limits``); warns (once per name) about a header
    name a JMS selector cannot name (``mdb.messages.jms_names``)."""
    if headers:
        refuse_nul(headers)
    if own is None:
        given = (headers or {}).get(ID)
        if given == "":
            raise EncodeError("header mdb_id is empty: give the message's id, or leave the "
                              "header out for a new one")
        own = {ID: given or new_id()}
    data, content_type = encode(body)
    merged = {**labelled(headers or {}, content_type), **own}
    if headers:
        if limits is not None:
            refuse_oversized(merged, limits)
        warn_unselectable(headers)
    return OutgoingMessage(data, merged)


def refuse_oversized(headers: Mapping[str, str], limits: HeaderLimits) -> None:
    """Raise ``EncodeError`` for headers beyond ``limits``, before anything is sent: a broker
    that refuses a message for its headers may say so only by dropping the connection, which
    would leave the send's outcome unknown (``SendOutcomeUnknown``) when it surely failed."""
    total = 0
    for name, value in headers.items():
        size = limits.size(name, value)
        if size > limits.line:
            raise EncodeError(f"header {name!r}: {size} bytes as a header line, more than the "
                              f"{limits.line} mdb sends")
        total += size
    if len(headers) > limits.count:
        raise EncodeError(f"{len(headers)} headers, more than the {limits.count} mdb sends")
    if total > limits.total:
        raise EncodeError(f"{total} bytes of headers, more than the {limits.total} mdb sends")
