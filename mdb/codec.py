"""Bodies: decoded from the handler's annotation, encoded from what a handler sends."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from mdb.errors import DecodeError, EncodeError
from mdb.message import CONTENT_TYPE, ID, OutgoingMessage, new_id, refuse_nul

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
BYTES = "application/octet-stream"


def decoder_for(annotation: Any) -> Callable[[bytes], Any]:
    """A function turning a body into ``annotation``; it raises DecodeError on a bad body."""
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
    """``parse`` raising ``DecodeError("<what>: <why>")`` instead of ``errors``."""

    def decode(body: bytes) -> Any:
        try:
            return parse(body)
        except errors as exc:
            raise DecodeError(f"{what}: {exc}") from None

    return decode


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


def outgoing(body: object, headers: Mapping[str, str] | None = None) -> OutgoingMessage:
    """A new message: the encoded body, its content type, and a fresh ``mdb_id``. Raises
    ``EncodeError`` for a body ``encode`` refuses or a header holding a NUL byte."""
    if headers:
        refuse_nul(headers)
    data, content_type = encode(body)
    merged = {CONTENT_TYPE: content_type, **(headers or {}), ID: new_id()}
    return OutgoingMessage(data, merged)

