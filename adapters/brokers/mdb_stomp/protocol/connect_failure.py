"""Why a STOMP connection could not be opened, in one line naming the broker and the cause."""

from __future__ import annotations

import re

import anyio.to_thread

from mdb.errors import ConnectionFailed, CredentialsRefused
from mdb.seam.broker import ConnectionOptions
from mdb_stomp.protocol import tls

# What ActiveMQ ("User name [u] or password is invalid.") and RabbitMQ ("Bad CONNECT: Access
# refused for user 'u'") answer a CONNECT with wrong credentials.
_CREDENTIALS_REFUSED = re.compile(r"password|access refused|credential|authenticat|login",
                                  re.IGNORECASE)
# RabbitMQ: "Bad CONNECT: Virtual host 'x' access denied" (the user may not use the vhost).
_VHOST_REFUSED = re.compile(r"virtual host .* access denied", re.IGNORECASE)
# Failures that already say the port is closed or silent: no TLS hint for those.
_NOT_TLS = ("no CONNECTED", "ConnectFailed", "ConnectionRefused")


async def explain(options: ConnectionOptions, host: str, port: int, failure: str,
                  refused: bool, username: str | None) -> ConnectionFailed:
    """The ``ConnectionFailed`` for ``failure`` (``refused``: the broker answered the CONNECT
    with an ERROR frame). A refusal of the login is ``CredentialsRefused`` naming the user; a
    TLS connection that failed is diagnosed with one more handshake (``tls.diagnose``); a
    plaintext one the broker dropped may have reached a TLS port, and the message says so."""
    where = f"broker {options.broker} ({host}:{port})"
    if refused:
        if _CREDENTIALS_REFUSED.search(failure):
            return CredentialsRefused(
                f"{where} refused the credentials of user {username or '(none)'}: {failure}")
        if _VHOST_REFUSED.search(failure):
            return CredentialsRefused(f"{where} refused the connection: {failure}")
        return ConnectionFailed(f"{where} refused the connection: {failure}")
    if options.tls is not None:
        diagnosis = await anyio.to_thread.run_sync(
            tls.diagnose, host, port, options.tls, options.connect_timeout,
            abandon_on_cancel=True)
        if diagnosis is not None:
            return ConnectionFailed(f"{where}: {diagnosis}")
    elif not failure.startswith(_NOT_TLS):
        failure += " (if this is the broker's TLS port, set its tls settings)"
    return ConnectionFailed(f"{where}: could not connect: {failure}")
