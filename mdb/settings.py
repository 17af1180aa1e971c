"""Settings: what a deployment may change without touching code.

Sources, highest priority first: keyword arguments (the CLI's ``--app``/``--server``),
``MDB_*`` environment variables (nested with ``__``, e.g. ``MDB_LISTENERS__ON_ORDER__POOL=8``),
a ``.env`` file, the TOML file given with ``--config``, then the defaults below.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from mdb.destinations import Destination
from mdb.errors import ConfigurationError
from mdb.options import ListenerOverrides
from mdb.topology import Member, Topology

_NAME = re.compile(r"[A-Za-z0-9_]+")


# STOMP 1.2 does not escape CONNECT headers: one of these in a login, passcode or vhost would
# end the header and start another (or end the frame).
_CONNECT_UNSAFE = re.compile(r"[\r\n\x00]")


def check_connect_header(value: str, what: str) -> str:
    """``value`` if it can be a CONNECT header value, else ValueError saying why (never the
    value: it may be a secret)."""
    if _CONNECT_UNSAFE.search(value):
        raise ValueError(f"{what} may not contain a newline, carriage return or NUL (it would "
                         "inject a header into the STOMP CONNECT frame)")
    return value


class TlsSettings(BaseModel):
    """TLS to one broker. Present (even empty: `[brokers.X.tls]`) means the connection is TLS."""

    model_config = ConfigDict(extra="forbid")

    ca_file: Path | None = Field(
        None, description="PEM file of the CA certificates the broker's certificate must chain "
                          "to (default: the system's trusted CAs)")
    cert_file: Path | None = Field(
        None, description="PEM client certificate, for brokers that require mutual TLS "
                          "(needs `key_file`)")
    key_file: Path | None = Field(None, description="PEM private key of `cert_file`")
    min_version: Literal["1.2", "1.3"] = Field(
        "1.2", description="lowest TLS version accepted (the connection fails below it)")

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value}: no such file")
        return value

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give both cert_file and key_file (mutual TLS), or neither")
        return self


class BrokerSettings(BaseModel):
    """One broker the container connects to. No number may be inf or nan: an endless timeout
    or delay hangs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    url: str = Field("memory://", description=(
        "`memory://NAME` (embedded), `stomp+activemq://HOST:PORT` or "
        "`stomp+rabbitmq://HOST:PORT[/VHOST]`; the port is required, a password here is "
        "better given in `password` or `password_file`"))
    username: str | None = Field(None, description="login, if the broker wants one")
    password: SecretStr | None = Field(None, description="passcode; never printed or logged")
    password_file: Path | None = Field(
        None, description="read the passcode from this file (a container secret, e.g. "
                          "`/run/secrets/mq`; one trailing newline is dropped) at startup")
    tls: TlsSettings | None = Field(
        None, description="connect over TLS (see the `tls` fields; default: plaintext)")
    heartbeat_ms: Annotated[int, Field(ge=0)] = Field(
        4000, description="heartbeat interval both ways; a hung broker is noticed after ~2.5x")
    connect_timeout: Annotated[float, Field(gt=0)] = Field(
        10.0, description="seconds to wait for the broker to accept a connection")
    receipt_timeout: Annotated[float, Field(gt=0)] = Field(
        10.0, description="seconds to wait for a broker's receipt of a send, commit or subscribe")
    reconnect_delay: Annotated[float, Field(gt=0)] = Field(
        0.5, description="first wait before reconnecting after the connection was lost")
    reconnect_max_delay: Annotated[float, Field(gt=0)] = Field(
        30.0, description="longest wait between reconnect attempts (the wait doubles)")
    reconnect_give_up_after: Annotated[float, Field(gt=0)] | None = Field(
        None, description="after this many seconds down, report the broker failed (an event, "
                          "the health endpoint); reconnecting goes on")
    send_wait_for_reconnect: Annotated[float, Field(ge=0)] = Field(
        10.0, description="seconds a send waits for this broker to come back when no other "
                          "member can take the message, before raising")

    @field_validator("url")
    @classmethod
    def _has_scheme(cls, value: str) -> str:
        if "://" not in value:
            raise ValueError("must look like 'memory://' or 'stomp+activemq://host:61613'")
        return value

    @field_validator("username")
    @classmethod
    def _safe_username(cls, value: str | None) -> str | None:
        return None if value is None else check_connect_header(value, "the username")

    @field_validator("password")
    @classmethod
    def _safe_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_connect_header(value.get_secret_value(), "the password")
        return value

    @field_validator("password_file")
    @classmethod
    def _safe_password_file(cls, value: Path | None) -> Path | None:
        if value is not None:
            check_connect_header(_read_secret(value), "the password in this file")
        return value

    @model_validator(mode="after")
    def _one_password(self) -> BrokerSettings:
        if self.password_file is not None:
            if self.password is not None:
                raise ValueError("give either password or password_file, not both")
            self.password = SecretStr(_read_secret(self.password_file))
        return self


def _read_secret(path: Path) -> str:
    """A secret file's text without its one trailing newline; ValueError when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({type(exc).__name__})") from None
    return text[:-1] if text.endswith("\n") else text


class MemberSettings(BaseModel):
    """One member of a distributed destination: a physical destination on a broker."""

    model_config = ConfigDict(extra="forbid")

    broker: str = Field(description="name of the broker (a key of `brokers`) holding it")
    name: str | None = Field(
        None, description="the physical destination's name (default: the logical name)")


class DestinationSettings(BaseModel):
    """Where a destination lives: on one broker, or distributed over several members."""

    model_config = ConfigDict(extra="forbid")

    broker: str | None = Field(
        None, description="the broker holding it (shorthand for one member of the same name)")
    members: list[MemberSettings] = Field(
        default_factory=list,
        description="the members of a distributed destination, e.g. "
                    "`[{broker = \"a\"}, {broker = \"b\", name = \"orders_b\"}]`")
    forwarding: Literal["partitioned"] = Field(
        "partitioned", description="`partitioned`: each message is stored on one member, so "
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
    )

    app: str = Field("mdb", description="application name; processes of one app share work")
    server: str = Field(
        default_factory=lambda: socket.gethostname().split(".")[0],
        description="this process's name, stable across restarts (default: the host name)")
    brokers: dict[str, BrokerSettings] = Field(
        default_factory=lambda: {"default": BrokerSettings()},
        description="brokers by name; destinations not listed in `destinations` use the first "
                    "(default: one broker `default` at `memory://`)")
    destinations: dict[str, DestinationSettings] = Field(
        default_factory=dict,
        description="`queue:NAME`/`topic:NAME` → its broker or its members (the topology)")
    defaults: ListenerOverrides = Field(
        default_factory=ListenerOverrides,
        description="listener options applied where the code does not set them")
    listeners: dict[str, ListenerOverrides] = Field(
        default_factory=dict,
        description="per listener name: options that override the code (deployment descriptor)")
    container: str | None = Field(
        None, description="the dependency-injector container, `module:Attribute`")
    shutdown_grace_period: Annotated[float, Field(ge=0)] = Field(
        30.0, description="seconds in-flight handlers may take to finish on shutdown")
    status_interval: Annotated[float, Field(gt=0)] = Field(
        5.0, description="seconds between the status lines `mdb run` prints (when stdout is "
                         "not a terminal: printed only when the line changed)")
    health_port: Annotated[int, Field(ge=0, le=65535)] | None = Field(
        None, description="serve /health/live, /health/ready and /status over HTTP on this port "
                          "(default: off; 0: any free port); `mdb status` reads it")
    health_host: str = Field(
        "127.0.0.1", description="the address the health endpoint listens on "
                                 "(`0.0.0.0` for an orchestrator probing from outside)")

    @field_validator("app", "server")
    @classmethod
    def _simple_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("may contain only letters, digits and '_' (it becomes part of "
                             "subscription names, where '-' separates the parts)")
        return value

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
        return tuple(sources)

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


def _member_destination(key: str, name: str | None) -> Destination:
    logical = Destination.parse(key)
    return Destination.parse(f"{logical.kind.value}:{name}") if name else logical


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Read settings from every source (``config``: the TOML file, a path or its name as a
    ``str``); raise ConfigurationError naming each bad setting."""
    path = None if config is None else Path(config)
    if path is not None and not path.is_file():
        raise ConfigurationError(f"--config {path}: no such file")

    class _FromFile(Settings):
        _toml_file = path

    try:
        settings: Settings = _FromFile(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigurationError(describe_errors(exc)) from None
    except ValueError as exc:  # a TOML syntax error, or an unparsable environment variable
        raise ConfigurationError(f"settings could not be read: {exc}") from None
    settings.check()
    return settings


def describe_errors(exc: ValidationError) -> str:
    """One line per invalid setting, naming it and what is wrong, never the value given: a
    misspelt or mistyped password key would otherwise print the password."""
    lines = ["invalid settings:"]
    for err in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        unknown = err["type"] == "extra_forbidden"
        hint = " — unknown setting; see docs/configuration.md" if unknown else ""
        lines.append(f"  setting {where}: {err['msg']}{hint}")
    return "\n".join(lines)
