"""``StompBroker``: the factory registered under ``stomp+activemq`` and ``stomp+rabbitmq``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import NoReturn
from urllib.parse import SplitResult, unquote, urlsplit

from mdb.errors import ConfigurationError
from mdb.observability.redaction import check_userinfo, redact_url
from mdb.seam.broker import Capabilities, ConnectionOptions, never
from mdb_stomp.connection import StompConnection
from mdb_stomp.dialects.activemq import ActiveMQDialect
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.dialects.rabbitmq import RabbitMQDialect
from mdb_stomp.protocol.heartbeats import Heartbeats
from mdb_stomp.protocol.limits import HEADER_LIMITS
from mdb_stomp.protocol.wire import Wire
from mdb_stomp.subscriptions.subscription import holds_unsettled

# STOMP 1.2 does not escape CONNECT headers (login, passcode, host): these would inject one.
_CONNECT_UNSAFE = ("\r", "\n", "\x00")

# The dialect each URL scheme selects.
DIALECTS: dict[str, type[Dialect]] = {
    ActiveMQDialect.scheme: ActiveMQDialect,
    RabbitMQDialect.scheme: RabbitMQDialect,
}


class StompBroker:
    """``Broker`` for ``stomp+<dialect>://[USER[:PASSWORD]@]HOST:PORT[/VHOST]`` URLs
    (``stomp+activemq``, ``stomp+rabbitmq``).

    Construction validates the URL and raises ``ConfigurationError`` naming the setting for
    anything it does not understand, rather than ignoring it: an ``@`` after the host part (a
    password holding an unencoded ``/``, ``?`` or ``#``, whose rest would be read as the host),
    a query (``?ssl=true``: TLS is the ``tls`` setting), a fragment, a path on a broker without
    virtual hosts, a missing port (a TLS port and a plaintext one differ: mdb does not guess),
    or a login, passcode or vhost that would inject a CONNECT header. User-info and the vhost
    are percent-decoded; the options' ``username``/``password`` take precedence over the URL's.
    Of the ``adapter_options`` it knows ``queue_type`` (``Dialect.queue_types``: none on
    ActiveMQ), and refuses any other.

    ``capabilities`` are the dialect's (``capabilities_of``).

    ``connect`` opens one STOMP 1.2 connection with heart-beats planned from ``heartbeat_ms``
    (``mdb_stomp.protocol.heartbeats``), over TLS when ``options.tls`` says so. No ``client-id`` is
    sent: ActiveMQ refuses a second connection with the same one, and the container opens
    several.
    """

    header_limits = HEADER_LIMITS

    def __init__(self, options: ConnectionOptions) -> None:
        self.options = options
        try:
            check_userinfo(options.url)
        except ValueError as exc:
            self._refuse(str(exc))
        parts = urlsplit(options.url)
        dialect = DIALECTS.get(parts.scheme)
        if dialect is None:
            self._refuse(f"mdb_stomp serves {', '.join(sorted(DIALECTS))}")
        queue_type = options.adapter_options.get("queue_type")
        for name in options.adapter_options.keys() - {"queue_type"}:
            self._refuse(f"not a setting of {dialect.broker}", name)
        if queue_type is not None and queue_type not in dialect.queue_types:
            self._refuse(f"{dialect.broker} has no queue types to choose from"
                         if not dialect.queue_types else
                         f"{queue_type!r} is not one of "
                         f"{', '.join(sorted(dialect.queue_types))}", "queue_type")
        self._dialect = dialect(queue_type, options.broker)
        self.capabilities = capabilities_of(self._dialect)
        if not parts.hostname:
            self._refuse(f"must be written '{parts.scheme}://HOST:PORT'")
        if parts.query or options.url.endswith("?"):
            self._refuse("a query is not understood (for TLS, set the broker's `tls` settings)")
        if parts.fragment or "#" in options.url:
            self._refuse("a fragment is not understood")
        try:
            port = parts.port
        except ValueError:
            self._refuse("invalid port")
        if port is None:
            self._refuse(f"the port is required ('{parts.scheme}://HOST:PORT')")
        self._host: str = parts.hostname
        self._port: int = port
        self.vhost = self._vhost(parts)
        self.username = self._credential("username", options.username, parts.username)
        self.password = self._credential("password", options.password, parts.password)

    def _credential(self, field: str, given: str | None, in_url: str | None) -> str | None:
        """The options' ``field`` if given, else the URL's (percent-decoded)."""
        if given is not None:
            return self._safe(given, f"the {field}", field)
        return self._safe(None if in_url is None else unquote(in_url), f"the {field}")

    def _vhost(self, parts: SplitResult) -> str | None:
        """The CONNECT ``host`` header: the URL's path where the dialect has virtual hosts."""
        path = parts.path
        if not self._dialect.has_vhosts:
            if path not in ("", "/"):
                self._refuse(f"a path is not understood ({self._dialect.broker} has no "
                             "virtual hosts)")
            return self._dialect.vhost
        if path.count("/") > 1:
            self._refuse("the path must be one virtual host: '/VHOST' (write a '/' inside "
                         "its name as %2F)")
        return self._safe(unquote(path[1:]) or "/", "the virtual host")

    def _safe(self, value: str | None, what: str, setting: str = "url") -> str | None:
        if value is not None and any(c in value for c in _CONNECT_UNSAFE):
            self._refuse(f"{what} may not contain a newline, carriage return or NUL (it would "
                         "inject a header into the STOMP CONNECT frame)", setting)
        return value

    def _refuse(self, why: str, setting: str = "url") -> NoReturn:
        shown = f" ({redact_url(self.options.url)})" if setting == "url" else ""
        raise ConfigurationError(f"setting brokers.{self.options.broker}.{setting}{shown}: {why}")

    async def connect(self) -> StompConnection:
        """Open a connection; raises ``ConnectionFailed`` (refused, a TLS failure, or no
        CONNECTED frame within ``connect_timeout``), ``CredentialsRefused`` when the broker
        refuses the login or the vhost."""
        return StompConnection(await self.open_wire(), self._dialect, self.capabilities,
                               self.open_wire)

    async def open_wire(self, headers: Mapping[str, str] | None = None, *,
                        hears_broker: bool = True) -> Wire:
        """One more STOMP connection to the broker (``mdb_stomp.protocol.wire.OpenWire``): a
        connection's own (``connect``), or one it opens for a browse, a take or a lock. Raises
        as ``connect`` does."""
        dialect = self._dialect
        heartbeats = Heartbeats.plan(self.options.heartbeat_ms, dialect.heartbeat_unit_ms,
                                     dialect.min_heartbeat_ms)
        if not hears_broker:
            heartbeats = Heartbeats(heartbeats.send_ms, 0)
        wire = Wire(self.options, self._host, self._port, self.vhost, asyncio.get_running_loop(),
                    heartbeats, dialect.explain, dialect.orphans_delivery, dialect.lost_race)
        await wire.open(self.username, self.password, headers)
        return wire


def capabilities_of(dialect: Dialect) -> Capabilities:
    """What ``dialect``'s broker can do, as its flags declare it, before connecting: whether
    it holds a delayed send back is known only once connected where a probe finds it out
    (``StompConnection.capabilities``)."""
    return Capabilities(
        atomic_transactions=dialect.atomic_transactions,
        dead_letters=dialect.dead_letters,
        dead_letter_origin=dialect.dead_letter_origin,
        closing_ends_connection=never if dialect.unsubscribe_releases_unacked
        else holds_unsettled,
        closing_keeps_unsettled=not dialect.unsubscribe_releases_unacked,
        cannot_hold_delays="its scheduler is probed once connected" if dialect.probes_delay
        else None,
        browsing=dialect.browsing, assigned_ids=dialect.assigns_message_ids)
