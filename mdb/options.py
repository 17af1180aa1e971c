"""Listener options: one model validates both the decorator's arguments and the settings that
override them per listener (the deployment descriptor)."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mdb.destinations import Destination
from mdb.errors import ConfigurationError


class Distribution(enum.StrEnum):
    """How copies of a topic's messages are spread over the processes of an application."""

    ONE_COPY_PER_APP = "one-copy-per-app"
    """All processes of the app share one subscription: each message is processed once app-wide."""
    ONE_COPY_PER_SERVER = "one-copy-per-server"
    """Each process (server) has its own subscription: every server processes every message."""


class Redelivery(BaseModel):
    """When a handler raises: wait ``delay`` seconds (times ``backoff`` for each further failure,
    at most ``max_delay``) and deliver again, at most ``limit`` times; then move the message to
    the error destination."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limit: Annotated[int, Field(ge=0)] = 5
    delay: Annotated[float, Field(ge=0)] = 1.0
    backoff: Annotated[float, Field(ge=1)] = 2.0
    max_delay: Annotated[float, Field(ge=0)] = 60.0

    def delay_before(self, delivery_count: int) -> float:
        """Seconds to wait before delivering again after delivery ``delivery_count`` failed."""
        return min(self.delay * self.backoff ** (delivery_count - 1), self.max_delay)


class ListenerOptions(BaseModel):
    """Every option of ``@listener`` except the destination and the name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    distribution: Distribution = Distribution.ONE_COPY_PER_APP
    pool: Annotated[int, Field(ge=1, le=1024)] = 1
    transacted: bool = True
    selector: str | None = None
    redelivery: Redelivery = Redelivery()
    error_destination: str | None = None
    durable: bool = True
    subscription: str | None = None
    durable_subscription_deletion: bool = False
    max_messages_per_transaction: Annotated[int, Field(ge=1, le=1000)] = 1

    @field_validator("error_destination")
    @classmethod
    def _destination(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Destination.parse(value)
            except ConfigurationError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("subscription")
    @classmethod
    def _subscription_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            name = value.format(app="a", server="s", listener="l")
        except (KeyError, IndexError, ValueError):
            raise ValueError("the only placeholders are {app}, {server} and {listener}") from None
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError("may contain only letters, digits, '_', '-' and the placeholders "
                             "{app}, {server} and {listener}")
        return value


class ListenerOverrides(BaseModel):
    """The same options, all optional: what settings may change for a listener."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    distribution: Distribution | None = None
    pool: int | None = None
    transacted: bool | None = None
    selector: str | None = None
    redelivery: Redelivery | None = None
    error_destination: str | None = None
    durable: bool | None = None
    subscription: str | None = None
    durable_subscription_deletion: bool | None = None
    max_messages_per_transaction: int | None = None
