"""The adapters installed: the ``Broker`` factory a broker's URL names by its scheme, found in
the ``mdb.brokers`` entry-point group (docs/architecture.md, "The broker seam"), so that a
third-party adapter needs no change to mdb."""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from urllib.parse import urlsplit

from mdb.errors import ConfigurationError
from mdb.observability.redaction import redact_url
from mdb.seam.broker import Broker, ConnectionOptions

ENTRY_POINT_GROUP = "mdb.brokers"


def broker_for(options: ConnectionOptions) -> Broker:
    """The adapter registered for the URL's scheme, or a ConfigurationError listing them."""
    return factory_for(options.url)(options)


def system_of(url: str) -> str:
    """The OpenTelemetry ``messaging.system`` of the broker ``url`` names (on every span and
    metric of its messages): its scheme's last part, which names the broker after any protocol
    (``stomp+activemq``: ``activemq``, ``memory``: ``memory``), as the messaging conventions
    spell it where they have a value for it. An adapter declares nothing for it: the scheme it
    registers under says it."""
    return urlsplit(url).scheme.rpartition("+")[2]


def factory_for(url: str) -> type[Broker]:
    """The ``Broker`` factory registered for ``url``'s scheme, or a ConfigurationError listing
    them, or passing on the ``ImportError`` of an adapter that cannot be loaded (its text says
    what to install: docs/architecture.md, "The broker seam")."""
    scheme = urlsplit(url).scheme
    found = _installed()
    if scheme not in found:
        raise ConfigurationError(
            f"broker url {redact_url(url)!r}: no adapter for scheme {scheme!r}; "
            f"installed: {', '.join(sorted(found)) or 'none'}"
        )
    try:
        factory: type[Broker] = found[scheme].load()
    except ImportError as exc:  # an adapter whose library is an extra that is not installed
        raise ConfigurationError(f"broker url {redact_url(url)!r}: its adapter cannot be "
                                 f"loaded: {exc}") from None
    return factory


@cache
def _installed() -> dict[str, EntryPoint]:
    """The adapters' entry points by scheme, read once: reading them scans every installed
    distribution's metadata (a tenth of a second here), and a container asked for them once
    per connection, 24 times for three brokers."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
