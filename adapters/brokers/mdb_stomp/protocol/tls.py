"""TLS for a STOMP connection, through stomp.py's own support (``set_ssl``), and why a
handshake failed.

stomp.py builds its ``SSLContext`` itself from ``set_ssl``'s arguments: the CA file (else the
system's CAs), the client certificate and key, certificate verification with the URL's host
checked against the certificate (always on here: stomp.py cannot verify the chain without
the host name, and verifying neither would let anyone in the path read the passcode). Its
context refuses versions below TLS 1.2 (Python's default); a higher ``min_version`` is checked
by the ``cert_validator`` hook, which runs after the handshake and before the CONNECT frame
(with the passcode) is written.

stomp.py only logs why a handshake failed. ``diagnose`` finds out again, after a failed
connect, with one handshake of its own made with the same settings, so the error can say it.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from typing import Any

from mdb.seam.broker import TlsOptions

# A diagnosis handshake waits at most this long (the connect already waited its timeout).
DIAGNOSIS_TIMEOUT = 3.0
_PLAINTEXT = " (does the port speak TLS? It may be the broker's plaintext port)"
_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
_NAMES = {"TLSv1": "1.0", "TLSv1.1": "1.1", "TLSv1.2": "1.2", "TLSv1.3": "1.3"}


def enable(stomp_connection: Any, host: str, port: int, tls: TlsOptions) -> None:
    """Make ``stomp_connection`` (a ``stomp.Connection12``) connect to ``host:port`` over TLS."""
    stomp_connection.set_ssl(
        for_hosts=[(host, port)],
        ca_certs=tls.ca_file,
        cert_file=tls.cert_file,
        key_file=tls.key_file,
        verify=True,
        cert_validator=_at_least(tls.min_version, stomp_connection),
    )


def _at_least(
    minimum: str, stomp_connection: Any
) -> Callable[[object, str], tuple[bool, str]]:
    def check(_cert: object, _host: str) -> tuple[bool, str]:
        version = stomp_connection.transport.socket.version()
        if _VERSIONS[_NAMES.get(version, "1.2")] < _VERSIONS[minimum]:
            return False, f"the broker negotiated {version}, below min_version {minimum}"
        return True, ""
    return check


def context(tls: TlsOptions) -> ssl.SSLContext:
    """The context stomp.py makes from ``tls``, with ``min_version`` applied."""
    made = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    if tls.ca_file:
        made.load_verify_locations(tls.ca_file)
    else:
        made.load_default_certs()
    if tls.cert_file:
        made.load_cert_chain(tls.cert_file, tls.key_file)
    made.minimum_version = _VERSIONS[tls.min_version]
    return made


def diagnose(host: str, port: int, tls: TlsOptions, timeout: float) -> str | None:
    """Why a TLS connection to ``host:port`` with ``tls`` fails, in a few words, by trying one
    handshake (blocking: call it from a worker thread); None when the handshake succeeds or
    the failure is not TLS's (the port does not answer: the connect error says it)."""
    try:
        tls_context = context(tls)
    except (OSError, ValueError) as error:
        return f"TLS settings unusable: {_reason(error)}"
    timeout = min(timeout, DIAGNOSIS_TIMEOUT)
    try:
        with (socket.create_connection((host, port), timeout=timeout) as raw,
              tls_context.wrap_socket(raw, server_hostname=host) as wrapped):
            wrapped.settimeout(min(timeout, 0.5))
            try:
                # A broker that wants a client certificate (TLS 1.3) refuses after the
                # handshake: its alert is the first thing to read.
                wrapped.recv(1)
            except TimeoutError:
                return None
    except ssl.SSLCertVerificationError as error:
        return f"TLS: the broker's certificate was not accepted: {error.verify_message}"
    except ssl.SSLError as error:
        return f"TLS handshake failed: {_reason(error)}{_hint(error)}"
    except TimeoutError:
        return f"no answer to the TLS handshake within {timeout:g}s{_PLAINTEXT}"
    except OSError:
        return None
    return None


def _reason(error: Exception) -> str:
    reason = getattr(error, "reason", None)
    return str(reason).replace("_", " ").lower() if reason else str(error)


def _hint(error: ssl.SSLError) -> str:
    if error.reason in ("WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING") or isinstance(
            error, ssl.SSLEOFError):
        return _PLAINTEXT
    if error.reason in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE",
                        "TLSV1_ALERT_UNKNOWN_CA"):
        return " (the broker did not accept the client certificate: set tls.cert_file and " \
               "tls.key_file to one it trusts)"
    return ""
