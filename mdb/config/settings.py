"""Settings: what a deployment may change without touching code.

Sources, highest priority first: keyword arguments (the CLI's ``--app``/``--server``),
``MDB_*`` environment variables (nested with ``__``, e.g. ``MDB_LISTENERS__ON_ORDER__POOL=8``),
a ``.env`` file, the TOML file given with ``--config``, then the defaults below.
"""

from __future__ import annotations

import difflib
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mdb.config.broker_settings import MAX_SECRET_BYTES, BrokerSettings, read_secret
from mdb.config.console_settings import ConsoleSettings
from mdb.config.database_settings import DatabaseSettings
from mdb.errors import ConfigurationError
from mdb.listeners.options import ListenerOverrides
from mdb.messages.destinations import Destination
from mdb.messages.topology import Member, Topology
from mdb.observability.redaction import printable

_NAME = re.compile(r"[A-Za-z0-9_]+")
MIN_IDENTITY_SECRET = 16
"""Bytes of an identity secret at least."""


def host_server_name(hostname: str) -> str:
    """The default ``server``: the host name's first label, made a valid name (a Kubernetes
    StatefulSet's pod ``orders-1`` is server ``orders_1``, stable across restarts)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", hostname.split(".")[0]) or "server"


class MemberSettings(BaseModel):
    """One member of a distributed destination: a physical destination on a broker."""

    model_config = ConfigDict(extra="forbid")

    broker: str = Field(description="name of the broker (a key of `brokers`) holding it")
    name: str | None = Field(
        default=None, description="the physical destination's name (default: the logical name)")


class DestinationSettings(BaseModel):
    """Where a destination lives: on one broker, or distributed over several members."""

    model_config = ConfigDict(extra="forbid")

    broker: str | None = Field(
        default=None,
        description="the broker holding it (shorthand for one member of the same name)")
    members: list[MemberSettings] = Field(
        default_factory=list,
        description="the members of a distributed destination, e.g. "
                    "`[{broker = \"a\"}, {broker = \"b\", name = \"orders_b\"}]`")
    forwarding: Literal["partitioned"] = Field(
        default="partitioned",
        description="`partitioned`: each message is stored on one member, so "
                    "listeners consume every member and senders pick one")

    @model_validator(mode="after")
    def _one_form(self) -> DestinationSettings:
        if (self.broker is None) == (not self.members):
            raise ValueError("give either `broker` or `members` (a list of {broker, name})")
        return self


class Settings(BaseSettings):
    """The container's settings. See docs/configuration.md for every field."""

    model_config = SettingsConfigDict(
        env_prefix="MDB_", env_nested_delimiter="__", env_file=".env",
        env_file_encoding="utf-8", extra="forbid", nested_model_default_partial_update=True,
        allow_inf_nan=False,  # an endless grace period or interval hangs
        # MDB_X= (empty) is none: it unsets what a weaker source (the TOML file) set.
        env_parse_none_str="",
    )

    app: str = Field(default="mdb", description="application name; processes of one app share work")
    server: str = Field(
        default_factory=lambda: host_server_name(socket.gethostname()),
        description="this process's name, stable across restarts (default: the host name, "
                    "each character other than a letter, digit or `_` made `_`)")
    brokers: dict[str, BrokerSettings] = Field(
        default_factory=lambda: {"default": BrokerSettings()},
        description="brokers by name; destinations not listed in `destinations` use the first "
                    "(default: one broker `default` at `memory://`)")
    destinations: dict[str, DestinationSettings] = Field(
        default_factory=dict,
        description="`queue:NAME`/`topic:NAME` → its broker or its members (the topology)")
    databases: dict[str, DatabaseSettings] = Field(
        default_factory=dict,
        description="databases by name, for listeners with `exactly_once` "
                    "(docs/exactly-once.md)")
    defaults: ListenerOverrides = Field(
        default_factory=ListenerOverrides,
        description="listener options applied where the code does not set them")
    listeners: dict[str, ListenerOverrides] = Field(
        default_factory=dict,
        description="per listener name: options that override the code (deployment descriptor)")
    container: str | None = Field(
        default=None, description="the dependency-injector container, `module:Attribute`")
    shutdown_grace_period: Annotated[float, Field(ge=0)] = Field(
        default=30.0, description="seconds in-flight handlers may take to finish on shutdown")
    status_interval: Annotated[float, Field(gt=0)] = Field(
        default=5.0,
        description="seconds between the status lines `mdb run` prints (when stdout is "
                    "not a terminal: printed only when the line changed)")
    health_port: Annotated[int, Field(ge=0, le=65535)] | None = Field(
        default=None,
        description="serve /health/live, /health/ready and /status over HTTP on this port "
                    "(default: off; 0: any free port); `mdb status` reads it")
    health_host: str = Field(
        default="127.0.0.1", description="the address the health endpoint listens on "
                                         "(`0.0.0.0` for an orchestrator probing from outside)")
    console: ConsoleSettings = Field(
        default_factory=ConsoleSettings,
        description="`mdb console`: the fleet it shows, where it listens (docs/console.md)")
    identity_secret_file: Path | None = Field(
        default=None, description=(
            "read the application's secret, with which mdb proves the messages it makes, from "
            f"this file at startup (a regular file of {MIN_IDENTITY_SECRET} to "
            f"{MAX_SECRET_BYTES} bytes, e.g. `openssl rand -hex 32`; one trailing newline is "
            "dropped): every process of the application, and every application that trusts "
            "its ids, reads the same one (default: the one `mdb db upgrade` made in the first "
            "database of `databases`, for a container with exactly-once listeners; else "
            "the process's own: docs/exactly-once.md, \"Identity\")"))
    _identity_secret: SecretStr | None = PrivateAttr(default=None)
    control_token_file: Path | None = Field(
        default=None, description=(
            "read the token that `POST /listeners/NAME/pause` and `.../resume` on the health "
            "endpoint (`mdb pause`, `mdb resume`, `mdb console`) must bring from this file at "
            f"startup (a regular file of {MIN_IDENTITY_SECRET} to {MAX_SECRET_BYTES} bytes, "
            "e.g. `openssl rand -hex 32`; one trailing newline is dropped); default: none, "
            "and every such request is refused (docs/health.md#pause-and-resume)"))
    _control_token: SecretStr | None = PrivateAttr(default=None)

    @field_validator("app", "server")
    @classmethod
    def _simple_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("may contain only letters, digits and '_' (it becomes part of "
                             "subscription names, where '-' separates the parts)")
        return value

    @field_validator("identity_secret_file", "control_token_file")
    @classmethod
    def _a_secret(cls, path: Path | None) -> Path | None:
        if path is not None and len(read_secret(path).encode()) < MIN_IDENTITY_SECRET:
            raise ValueError(f"the file holds fewer than the {MIN_IDENTITY_SECRET} bytes of a "
                             "secret no one guesses (write e.g. `openssl rand -hex 32` there)")
        return path

    @model_validator(mode="after")
    def _read_secrets(self) -> Settings:
        if self.identity_secret_file is not None:
            self._identity_secret = SecretStr(read_secret(self.identity_secret_file))
        if self.control_token_file is not None:
            self._control_token = SecretStr(read_secret(self.control_token_file))
        return self

    @property
    def identity_secret(self) -> SecretStr | None:
        """The secret ``identity_secret_file`` holds (read as the settings were), if given."""
        return self._identity_secret

    @property
    def control_token(self) -> SecretStr | None:
        """The token ``control_token_file`` holds (read as the settings were), if given."""
        return self._control_token

    @field_validator("brokers")
    @classmethod
    def _some_broker(cls, value: dict[str, BrokerSettings]) -> dict[str, BrokerSettings]:
        if not value:
            raise ValueError("needs at least one broker, e.g. brokers.default.url = 'memory://'")
        return value

    @field_validator("destinations")
    @classmethod
    def _destination_keys(
        cls, value: dict[str, DestinationSettings]
    ) -> dict[str, DestinationSettings]:
        for key, entry in value.items():
            try:
                for member in entry.members:
                    _member_destination(key, member.name)
                Destination.parse(key)
            except ConfigurationError as exc:
                raise ValueError(str(exc)) from None
        return value

    _toml_file: ClassVar[Path | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources = [init_settings, env_settings, dotenv_settings]
        if cls._toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=cls._toml_file))
        return tuple(_OnePasswordForm(source) for source in sources)

    def topology(self) -> Topology:
        """The destinations as configured; call ``check`` first."""
        members = {
            Destination.parse(key): tuple(
                Member(m.broker, _member_destination(key, m.name)) for m in entry.members
            ) or (Member(entry.broker or "", Destination.parse(key)),)
            for key, entry in self.destinations.items()
        }
        return Topology(members, default_broker=next(iter(self.brokers)))

    def check(self) -> None:
        """Cross-field checks; raises ConfigurationError naming the setting."""
        for key, entry in self.destinations.items():
            brokers = [entry.broker] if entry.broker else [m.broker for m in entry.members]
            for index, broker in enumerate(brokers):
                where = (f"destinations.{key}.broker" if entry.broker
                         else f"destinations.{key}.members[{index}].broker")
                if broker not in self.brokers:
                    raise ConfigurationError(
                        f"setting {where}: {broker!r} is not a broker; "
                        f"valid: {', '.join(self.brokers)}"
                    )
            seen = set()
            for index, member in enumerate(entry.members):
                physical = _member_destination(key, member.name)
                if (member.broker, physical) in seen:
                    raise ConfigurationError(
                        f"setting destinations.{key}.members[{index}]: {physical} on broker "
                        f"{member.broker!r} is listed twice; give each member its own broker "
                        f"or name"
                    )
                seen.add((member.broker, physical))


_PASSWORD_FORMS = (("password", "password_file"), ("password_file", "password"))


class _OnePasswordForm(PydanticBaseSettingsSource):
    """``source``, where a broker's or a database's password it gives also unsets the
    ``password_file`` a weaker source gave, and the other way round: they are one setting in
    two forms (docs/configuration.md). One source giving both is still refused."""

    def __init__(self, source: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self._source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        state = self._source()
        for group in ("brokers", "databases"):
            entries = state.get(group)
            for entry in entries.values() if isinstance(entries, dict) else ():
                for given, other in _PASSWORD_FORMS:
                    if isinstance(entry, dict) and entry.get(given) is not None:
                        entry.setdefault(other, None)
        return state


def _member_destination(key: str, name: str | None) -> Destination:
    logical = Destination.parse(key)
    return Destination.parse(f"{logical.kind.value}:{name}") if name else logical


@dataclass
class _Command:
    """Where the ``mdb`` command running in this process read its settings from."""

    config: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


_command = _Command()


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Read settings from every source (``config``: the TOML file, a path or its name as a
    ``str``); raise ConfigurationError naming each bad setting.

    Without ``config``, in a process of the ``mdb`` command (the application's resources and
    handlers under ``mdb run``), the command's own: its ``--config`` file, and its ``--app``
    and ``--server`` under ``overrides``. So a ``Producer(load_settings())`` sends where the
    container listens (docs/configuration.md)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if config is None:
        config, given = _command.config, {**_command.overrides, **given}
    path = None if config is None else Path(config)
    if path is not None and not path.is_file():
        raise ConfigurationError(f"--config {path}: no such file")

    class _FromFile(Settings):
        _toml_file = path

    try:
        settings: Settings = _FromFile(**given)
    except ValidationError as exc:
        raise ConfigurationError(describe_errors(exc)) from None
    except ValueError as exc:  # a TOML syntax error, or an unparsable environment variable
        raise ConfigurationError(f"settings could not be read: {exc}") from None
    settings.check()
    return settings


def command_settings(config: Path | None, **overrides: Any) -> Settings:
    """The ``mdb`` command's settings, ``load_settings(config, **overrides)``; from now on
    ``load_settings()`` without a file reads them from there too, in this process."""
    settings = load_settings(config, **overrides)
    _command.config = None if config is None else config.absolute()
    _command.overrides = {k: v for k, v in overrides.items() if v is not None}
    return settings


def describe_errors(exc: ValidationError) -> str:
    """One line per invalid setting, naming it and what is wrong or the fix, never the value
    given: a misspelt or mistyped password key would otherwise print the password. An unknown
    setting is told the known one its name is closest to. The names and pydantic's words are
    written printable (``mdb.observability.redaction.printable``): a key is the file's text, and
    only the line feeds between these lines are mdb's."""
    lines = ["invalid settings:"]
    for err in exc.errors(include_url=False):  # its input is read for being none, never shown
        where = printable(".".join(str(p) for p in err["loc"])) or "(top level)"
        if err["input"] is None:  # an empty environment variable
            lines.append(f"  setting {where}: empty, and it needs a value: give one, or leave "
                         "the variable out")
            continue
        if err["type"] == "extra_forbidden":
            *path, name = err["loc"] or ("",)
            close = difflib.get_close_matches(str(name), _names_at(path), n=1)
            meant = printable(".".join([*map(str, path), *close]))
            lines.append(f"  setting {where}: unknown setting; " + (
                f"did you mean {meant}?" if close else "docs/configuration.md lists them"))
            continue
        lines.append(f"  setting {where}: {printable(err['msg'])}")
    return "\n".join(lines)


def _names_at(path: Sequence[object]) -> list[str]:
    """The names of the settings at ``path`` (a setting's location, from the top), none where
    it leads to no model."""
    kind: Any = Settings
    for part in path:
        kind = _unwrapped(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(str(part))
            if field is None:
                return []
            kind = field.annotation
        elif get_origin(kind) in (dict, list):  # a part is a key or an index of it
            kind = get_args(kind)[-1]
        else:
            return []
    kind = _unwrapped(kind)
    return list(kind.model_fields) if isinstance(kind, type) and issubclass(kind, BaseModel) \
        else []


def _unwrapped(kind: Any) -> Any:
    """``kind`` without ``Annotated[...]`` and ``| None``."""
    while get_origin(kind) in (Annotated, Union, UnionType):
        kind = next(a for a in get_args(kind) if a is not type(None))
    return kind
