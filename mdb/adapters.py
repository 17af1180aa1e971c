"""The adapters installed: the ``Broker`` factory a broker's URL names by its scheme, found in
the ``mdb.brokers`` entry-point group (docs/architecture.md, "The broker seam"), so that a
third-party adapter needs no change to mdb."""

from __future__ import annotations

from importlib.metadata import entry_points
from urllib.parse import urlsplit

from mdb.broker import Broker, ConnectionOptions
from mdb.errors import ConfigurationError
from mdb.redaction import redact_url

ENTRY_POINT_GROUP = "mdb.brokers"


def broker_for(options: ConnectionOptions) -> Broker:
    """The adapter registered for the URL's scheme, or a ConfigurationError listing them."""
    return factory_for(options.url)(options)


def factory_for(url: str) -> type[Broker]:
    """The ``Broker`` factory registered for ``url``'s scheme, or a ConfigurationError listing
    them, or passing on the ``ImportError`` of an adapter that cannot be loaded (its text says
    what to install: docs/architecture.md, "The broker seam")."""
    scheme = urlsplit(url).scheme
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
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
