"""The options of ``format("mdb")``, read the same way on the driver and on executors.

Spark hands options over as strings (case-insensitive keys); these dataclasses hold only
plain values, so they pickle to executors and to Spark's driver-side Python process.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mdb.config.settings import Settings, load_settings
from mdb.errors import ConfigurationError
from mdb.messages.destinations import Destination, Kind
from mdb.messages.topology import Member

_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def _destination(options: Mapping[str, str], example: str) -> str:
    """The required ``destination`` option, checked (ConfigurationError says what is valid)."""
    destination = options.get("destination")
    if not destination:
        raise ConfigurationError(f"option destination is required, e.g. '{example}'")
    Destination.parse(destination)
    return destination


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _positive(options: Mapping[str, str], key: str, default: int | None) -> int | None:
    text = options.get(key)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(f"option {key}: {text!r} is not a whole number") from None
    if value <= 0:
        raise ConfigurationError(f"option {key}: must be > 0 (got {value})")
    return value


@dataclass(frozen=True, slots=True)
class Connect:
    """Where the mdb settings come from: ``config`` (a TOML file) and/or ``settings`` (JSON,
    taking precedence), plus ``app``."""

    config: str | None
    settings_json: str | None
    app: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Connect:
        config = options.get("config")
        return cls(os.path.abspath(config) if config else None, options.get("settings"),
                   options.get("app"))

    def settings(self) -> Settings:
        try:
            overrides = json.loads(self.settings_json) if self.settings_json else {}
        except ValueError as exc:
            raise ConfigurationError(f"option settings: not JSON: {exc}") from None
        if self.app:
            overrides["app"] = self.app
        return load_settings(Path(self.config) if self.config else None, **overrides)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What the source's and the sink's options both hold: where the mdb settings come from,
    and the required ``destination`` (checked)."""

    connect: Connect
    destination: str

    @staticmethod
    def read(options: Mapping[str, str], example: str) -> tuple[dict[str, str], Connect, str]:
        """The options with lower-case keys, the ``Connect`` and the ``destination`` they give
        (``example`` shows a valid one when it is missing)."""
        lowered = _lower(options)
        return lowered, Connect.parse(lowered), _destination(lowered, example)


@dataclass(frozen=True, slots=True)
class SourceOptions(Endpoint):
    """``spark.readStream.format("mdb")`` options; see docs/spark.md."""

    name: str
    journal: str
    max_messages_per_batch: int | None
    prefetch: int
    max_journal_messages: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        lowered, connect, destination = cls.read(options, "topic:orders")
        name = lowered.get("name", "spark")
        if not _NAME.match(name):
            raise ConfigurationError(f"option name {name!r}: only letters, digits and '_'")
        journal = lowered.get("journal", "mdb_journal")
        if "://" not in journal:
            journal = os.path.abspath(journal)  # executors may run in another directory
        return cls(
            connect, destination, name, journal.rstrip("/"),
            _positive(lowered, "max_messages_per_batch", None),
            _positive(lowered, "prefetch", 100) or 100,
            _positive(lowered, "max_journal_messages", 100_000) or 100_000,
        )

    def subscription(self, settings: Settings) -> str | None:
        """The shared subscription's name on every member of a topic: ``<app>-<name>``, the
        per-app rule of docs/distribution.md with the query's name as the listener's."""
        if Destination.parse(self.destination).kind is Kind.QUEUE:
            return None
        return f"{settings.app}-{self.name}"

    def journal_url(self, settings: Settings, member: Member) -> str:
        folder = self.subscription(settings) or f"{settings.app}-{self.name}"
        physical = f"{member.destination.kind.value}_{member.destination.name}"
        return f"{self.journal}/{folder}/{member.broker}_{physical}"


def member_key(member: Member) -> str:
    """A member's key in Spark offsets and in the ``member`` column: ``broker/kind:name``."""
    return f"{member.broker}/{member.destination}"


@dataclass(frozen=True, slots=True)
class SinkOptions(Endpoint):
    """``df.writeStream.format("mdb")`` options; see docs/spark.md."""

    query: str
    rows_per_transaction: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        lowered, connect, destination = cls.read(options, "queue:totals")
        query = lowered.get("query") or lowered.get("name") or "spark"
        return cls(connect, destination, query,
                   _positive(lowered, "rows_per_transaction", 500) or 500)
