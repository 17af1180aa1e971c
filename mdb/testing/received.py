"""``Received``: a message a test took from a queue, and the failure an error destination's
copy carries in its headers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mdb.messages import codec
from mdb.messages.headers import (
    DELIVERY_COUNT,
    ERROR_LISTENER,
    ERROR_MESSAGE,
    ERROR_TYPE,
    ID,
    ORIGINAL_DESTINATION,
)
from mdb.seam.broker import Delivery


@dataclass(frozen=True)
class Failure:
    """Why a message is on an error destination (the ``mdb_error_*`` headers)."""

    error_type: str
    error_message: str
    listener: str
    original_destination: str
    delivery_count: int


@dataclass(frozen=True)
class Received:
    """One message taken from a queue: its ``body`` and all its ``headers``."""

    body: bytes
    headers: dict[str, str]

    @classmethod
    def of(cls, delivery: Delivery) -> Received:
        return cls(delivery.body, dict(delivery.headers))

    @property
    def id(self) -> str:
        """Its ``mdb_id``, the same on every copy of one message."""
        return self.headers.get(ID, "")

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)

    def decode(self, annotation: Any) -> Any:
        """The body as a handler annotated ``annotation`` would get it (a pydantic model, ...)."""
        return codec.decoder_for(annotation)(self.body)

    @property
    def failure(self) -> Failure | None:
        """What failed, on a copy moved to an error destination; None on any other message."""
        if ERROR_TYPE not in self.headers:
            return None
        return Failure(
            error_type=self.headers[ERROR_TYPE],
            error_message=self.headers.get(ERROR_MESSAGE, ""),
            listener=self.headers.get(ERROR_LISTENER, ""),
            original_destination=self.headers.get(ORIGINAL_DESTINATION, ""),
            delivery_count=int(self.headers.get(DELIVERY_COUNT, "1")),
        )
