"""What the core hands an adapter's ``Broker`` factory and what the factory tells the core before
any connection: the connection's options (``ConnectionOptions``, with ``TlsOptions``) and the
headers its broker surely takes (``HeaderLimits``). Part of the broker seam, ``mdb.seam.broker``
(docs/architecture.md, "The broker seam")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """TLS for a connection: file paths (PEM) and the lowest TLS version. ``ca_file`` None
    means the system's trusted CAs; ``cert_file``/``key_file`` a client certificate (mutual
    TLS). The broker's certificate is always verified, its host name included."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    min_version: str = "1.2"


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """What the container tells an adapter about the connection it wants.

    ``broker`` is the broker's name in settings, for messages (``brokers.<broker>.url``);
    ``tls`` None means plaintext; an adapter that cannot do TLS refuses it (ConfigurationError).
    Credentials given here take precedence over those in the URL. ``heartbeat_ms`` is how often
    the client sends heart-beats (0: none); with them, an adapter notices a silent connection
    before the broker can give up on it, and hands on nothing read after a silence the broker
    may not have tolerated: the broker may have redelivered it elsewhere (docs/failover.md).
    ``adapter_options`` are the broker's settings that only its adapter reads, by name
    (``brokers.<broker>.<name>``, e.g. ``queue_type``): the adapter refuses one it does not
    know (ConfigurationError naming the setting).
    """

    url: str
    username: str | None = None
    password: str | None = None
    broker: str = "default"
    tls: TlsOptions | None = None
    client_id: str = "mdb"
    heartbeat_ms: int = 4000
    connect_timeout: float = 10.0
    receipt_timeout: float = 10.0
    adapter_options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HeaderLimits:
    """The headers a broker surely takes in one message: at most ``count`` of them, each at
    most ``line`` bytes and all of them at most ``total`` bytes, where ``size(name, value)``
    is how many bytes one header takes as the adapter's protocol writes it. An adapter keeps
    them below what its broker refuses, with room for the headers it adds to a frame. The core
    sends nothing beyond the limits of any adapter its brokers use, and leaves headers out of a
    copy rather than have it refused (``mdb.routing.brokers.Brokers.header_limits``)."""

    count: int
    line: int
    total: int
    size: Callable[[str, str], int]
