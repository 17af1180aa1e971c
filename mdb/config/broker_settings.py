"""How to reach one broker (``[brokers.<name>]`` in settings): its URL (or the addresses of
one logical broker: a master and its standby, the nodes of a cluster), credentials, TLS and
timeouts, and the reconnect and failover policy. ``mdb.config.settings`` holds the rest of the
settings."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from mdb.observability.redaction import check_userinfo

# STOMP 1.2 does not escape CONNECT headers: one of these in a login, passcode or vhost would
# end the header and start another (or end the frame).
_CONNECT_UNSAFE = re.compile(r"[\r\n\x00]")

# The largest `password_file` read: a passcode is one CONNECT header line, and ActiveMQ refuses
# a header line of 10,240 bytes or more.
MAX_SECRET_BYTES = 8_192


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
        default=None,
        description="PEM file of the CA certificates the broker's certificate must chain "
                    "to (default: the system's trusted CAs)")
    cert_file: Path | None = Field(
        default=None, description="PEM client certificate, for brokers that require mutual TLS "
                                  "(needs `key_file`)")
    key_file: Path | None = Field(default=None, description="PEM private key of `cert_file`")
    min_version: Literal["1.2", "1.3"] = Field(
        default="1.2", description="lowest TLS version accepted (the connection fails below it)")

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
    # The settings only a broker's adapter reads (``ConnectionOptions.adapter_options``): it
    # validates them, the core passes them on.
    adapter_settings: ClassVar[tuple[str, ...]] = ("queue_type",)

    url: str | list[str] = Field(default="memory://", description=(
        "`memory://NAME` (embedded), `stomp+activemq://HOST:PORT` or "
        "`stomp+rabbitmq://HOST:PORT[/VHOST]`; the port is required, a password here is "
        "better given in `password` or `password_file` (here, write a `/`, `?`, `#` or `@` "
        "in it as `%2F`, `%3F`, `%23`, `%40`). A list (same scheme) is one broker at several "
        "addresses, tried in turn (docs/failover.md)"))
    username: str | None = Field(default=None, description="login, if the broker wants one")
    password: SecretStr | None = Field(
        default=None, description="passcode; never printed or logged")
    password_file: Path | None = Field(
        default=None, description="read the passcode from this file (a container secret, e.g. "
                                  f"`/run/secrets/mq`: a regular file of at most "
                                  f"{MAX_SECRET_BYTES} bytes; one trailing newline is dropped) "
                                  "at startup")
    tls: TlsSettings | None = Field(
        default=None, description="connect over TLS (see the `tls` fields; default: plaintext)")
    heartbeat_ms: Annotated[int, Field(ge=0)] = Field(
        default=4000, description=(
            "how often mdb sends a heart-beat (RabbitMQ: whole seconds, at least 4000); it asks "
            "the broker for one every quarter of it and drops a connection silent for 2.5 of "
            "the broker's intervals (ActiveMQ: 0.625x this), before the broker can drop a "
            "silent mdb (after 2-3x this); 0: no heart-beats (docs/failover.md#partitions)"))
    connect_timeout: Annotated[float, Field(gt=0)] = Field(
        default=10.0, description="seconds to wait for the broker to accept a connection")
    receipt_timeout: Annotated[float, Field(gt=0)] = Field(
        default=10.0,
        description="seconds to wait for a broker's receipt of a send, commit or subscribe")
    reconnect_delay: Annotated[float, Field(gt=0)] = Field(
        default=0.5, description="first wait before reconnecting after the connection was lost")
    reconnect_max_delay: Annotated[float, Field(gt=0)] = Field(
        default=30.0, description="longest wait between reconnect attempts (the wait doubles)")
    reconnect_give_up_after: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="after this many seconds down, report the broker failed (an event, "
                    "the health endpoint); reconnecting goes on")
    send_wait_for_reconnect: Annotated[float, Field(ge=0)] = Field(
        default=10.0, description="seconds a send waits for this broker to come back when no other "
                                  "member can take the message, before raising")
    queue_type: Literal["classic", "quorum"] | None = Field(
        default=None, description=(
            "RabbitMQ only, `classic` or `quorum`: the type of every queue mdb declares on "
            "this broker (topic subscriptions' queues, queues it listens on or sends to). "
            "`quorum`: replicated over a cluster's nodes, survives the loss of one "
            "(docs/rabbitmq.md#queue-types); unset: the broker's default (classic). Refused "
            "by other brokers"))
    # A reconnect round over the addresses of `url`, as Qpid's roundrobin failover.
    failover_retries: Annotated[int, Field(ge=0)] = Field(
        default=0, description="further attempts on the same address before the next one, in a "
                               "reconnect round (Qpid `retries`)")
    failover_delay: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="seconds between two connection attempts of a reconnect round "
                                 "(Qpid `connectdelay`)")
    failover_cycles: Annotated[int, Field(ge=1)] = Field(
        default=1, description="times through the address list in one reconnect round, before "
                               "waiting `reconnect_delay` (Qpid `cyclecount`)")

    @property
    def embedded(self) -> bool:
        """True for a ``memory://`` broker, which lives inside one process: no other process
        (another worker, ``mdb send``) can reach it."""
        return self.addresses[0].startswith("memory://")

    @property
    def addresses(self) -> tuple[str, ...]:
        """The broker's addresses in the order a reconnect round tries them: ``url`` as a
        tuple (one element for a single URL)."""
        return (self.url,) if isinstance(self.url, str) else tuple(self.url)

    def adapter_options(self) -> dict[str, str]:
        """Those of ``adapter_settings`` that are set, for the adapter."""
        return {name: str(value) for name in self.adapter_settings
                if (value := getattr(self, name)) is not None}

    @field_validator("url", mode="before")
    @classmethod
    def _url_or_list(cls, value: object) -> object:
        # Checked before the union so that a bad value gets one error, not one per choice.
        if isinstance(value, list):
            for index, item in enumerate(value):
                if not isinstance(item, str):
                    raise ValueError(f"address [{index}] is not a string")
        elif not isinstance(value, str):
            raise ValueError("must be a URL or a list of URLs")
        return value

    @field_validator("url")
    @classmethod
    def _same_broker(cls, value: str | list[str]) -> str | list[str]:
        urls = [value] if isinstance(value, str) else value
        if not urls:
            raise ValueError("the list of addresses is empty; give at least one URL")
        for index, url in enumerate(urls):
            if "://" not in url:
                where = "" if isinstance(value, str) else f"address [{index}] "
                raise ValueError(f"{where}must look like 'memory://' or "
                                 "'stomp+activemq://host:61613'")
            try:
                check_userinfo(url)
            except ValueError as exc:
                where = "" if isinstance(value, str) else f"address [{index}]: "
                raise ValueError(f"{where}{exc}") from None
        schemes = list(dict.fromkeys(url.partition("://")[0] for url in urls))
        if len(schemes) > 1:
            raise ValueError(f"the addresses mix schemes ({', '.join(schemes)}); the "
                             "addresses of one broker use one scheme (another broker "
                             "is another entry in `brokers`)")
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
            check_connect_header(read_secret(value), "the password in this file")
        return value

    @model_validator(mode="after")
    def _one_password(self) -> BrokerSettings:
        self.password = one_password(self.password, self.password_file)
        return self


def one_password(password: SecretStr | None, password_file: Path | None) -> SecretStr | None:
    """The password a ``password`` setting or a ``password_file`` gives (read now); ValueError
    when both are given."""
    if password_file is None:
        return password
    if password is not None:
        raise ValueError("give either password or password_file, not both")
    return SecretStr(read_secret(password_file))


def read_secret(path: Path) -> str:
    """A secret file's text without its one trailing newline; ValueError when it is not a
    regular file (a FIFO would block startup for ever, ``/dev/zero`` fill the memory), is larger
    than ``MAX_SECRET_BYTES`` or cannot be read."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"{path}: not a regular file")
        # Non-blocking, and checked again once open: the path may have been swapped for a FIFO.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{path}: not a regular file")
            data = os.read(fd, MAX_SECRET_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_SECRET_BYTES:
            raise ValueError(f"{path}: larger than {MAX_SECRET_BYTES} bytes, too large for a "
                             "password")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({type(exc).__name__})") from None
    return text[:-1] if text.endswith("\n") else text
