"""Bodies: decoded from the handler's annotation, encoded from what a handler sends."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from mdb.errors import DecodeError
from mdb.message import CONTENT_TYPE, ID, OutgoingMessage, new_id

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
BYTES = "application/octet-stream"


def decoder_for(annotation: Any) -> Callable[[bytes], Any]:
    """A function turning a body into ``annotation``; it raises DecodeError on a bad body."""
    if annotation is bytes or annotation is Any:
        return lambda body: body
    if annotation is str:
        return _decode_text
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        model = annotation

        def decode_model(body: bytes) -> Any:
            try:
                return model.model_validate_json(body)
            except ValidationError as exc:
                raise DecodeError(f"body is not a valid {model.__name__}: {exc}") from None

        return decode_model
    if annotation in (dict, list) or get_origin(annotation) in (dict, list):
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)

        def decode_json(body: bytes) -> Any:
            try:
                return adapter.validate_python(json.loads(body))
            except (ValueError, ValidationError) as exc:
                raise DecodeError(f"body is not JSON of type {annotation}: {exc}") from None

        return decode_json
    adapter_any: TypeAdapter[Any] = TypeAdapter(annotation)

    def decode_other(body: bytes) -> Any:
        try:
            return adapter_any.validate_json(body)
        except ValidationError as exc:
            raise DecodeError(f"body does not decode as {annotation}: {exc}") from None

    return decode_other


def encode(body: object) -> tuple[bytes, str]:
    """The bytes and content type of a body to send."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), BYTES
    if isinstance(body, str):
        return body.encode(), TEXT
    if isinstance(body, BaseModel):
        return body.model_dump_json().encode(), JSON
    try:
        return json.dumps(body, separators=(",", ":")).encode(), JSON
    except TypeError as exc:
        raise TypeError(
            f"cannot send a {type(body).__name__}: send bytes, str, a pydantic model, "
            "or JSON-serialisable data"
        ) from exc


def outgoing(body: object, headers: Mapping[str, str] | None = None) -> OutgoingMessage:
    """A new message: the encoded body, its content type, and a fresh ``mdb_id``."""
    data, content_type = encode(body)
    merged = {CONTENT_TYPE: content_type, **(headers or {}), ID: new_id()}
    return OutgoingMessage(data, merged)


def _decode_text(body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError as exc:
        raise DecodeError(f"body is not UTF-8 text: {exc}") from None
