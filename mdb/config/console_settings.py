"""``[console]``: ``mdb console``, the operator's web page of a fleet of containers
(docs/console.md)."""

from __future__ import annotations

import ipaddress
import urllib.parse
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_CONTAINERS = 200
"""Containers one console polls at most: each costs a request every ``refresh`` seconds."""


class ConsoleSettings(BaseModel):
    """Where ``mdb console`` listens and which containers it shows."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    containers: Annotated[list[str], Field(max_length=MAX_CONTAINERS)] = Field(
        default_factory=list, description=(
            "the health endpoints of the fleet's containers, `http://HOST:PORT` each (their "
            "`health_host` and `health_port`), e.g. `[\"http://orders-1:8081\", "
            "\"http://orders-2:8081\"]`"))
    bind: str = Field("127.0.0.1", description=(
        "the address the console listens on; any other than a loopback address needs "
        "`control_token_file` (then reading the page needs the token too)"))
    port: Annotated[int, Field(ge=0, le=65535)] = Field(
        8780, description="the console's port (0: any free one, printed at startup)")
    refresh: Annotated[float, Field(ge=0.5, le=60)] = Field(
        2.0, description="seconds between two reads of every container's `/status` (the "
                         "page refreshes as often)")

    error_destinations: list[str] = Field(
        default_factory=list, description=(
            "the error destinations whose failed messages it shows, replays and purges, "
            "`queue:NAME` each as `mdb dlq` takes them, on the brokers of these settings "
            "(docs/console.md)"))
    modules: list[str] = Field(
        default_factory=list, description=(
            "or the listener modules whose error destinations these are, as `mdb dlq "
            "--module` takes them (importable where the console runs)"))

    @field_validator("containers")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for index, url in enumerate(urls):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip(
                    "/") or parts.query or parts.username or parts.password:
                raise ValueError(f"item {index}: not a container's health endpoint; write it "
                                 "http://HOST:PORT (its health_host and health_port)")
        if len(set(urls)) < len(urls):
            raise ValueError("a container is listed twice; list each once")
        return [url.rstrip("/") for url in urls]

    @property
    def loopback(self) -> bool:
        """Whether ``bind`` is reachable from this machine only."""
        if self.bind == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.bind).is_loopback
        except ValueError:
            return False
