"""The one HTTP client of mdb, for its own endpoints: ``mdb status`` reads a container's
``/status`` (``fetch_status``), ``mdb pause`` and ``mdb resume`` post to its controls
(``control``), and the supervisor of ``mdb run --workers N`` reads its workers' ``/metrics``
pages (``fetch_pages``) and passes the controls on to them."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

from mdb.config.settings import Settings
from mdb.errors import ConfigurationError
from mdb.observability.health import Health
from mdb.observability.redaction import printable

MAX_STATUS_BYTES = 4 << 20
"""The largest ``/status`` read: a larger answer is not one mdb gives."""


class Unreachable(Exception):
    """``fetch_status``: no answer from the health endpoint, or not one mdb would give."""


class NotLive(Exception):
    """``fetch_status``: the health endpoint answered that the container's event loop is not
    running."""


def fetch_status(url: str, timeout: float) -> Health:
    """GET ``url``/status and rebuild the snapshot; blocking, so call it from a worker thread."""
    target = f"{url.rstrip('/')}/status"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            body = response.read(MAX_STATUS_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            raise Unreachable(f"{target}: HTTP {exc.code}; is this an mdb health "
                               f"endpoint?") from None
        try:
            said = printable(str(json.loads(exc.read())["error"]))  # for a terminal
        except (ValueError, KeyError, TypeError):
            said = "HTTP 503"
        raise NotLive(said) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(why, TimeoutError):
            why = f"no answer within {timeout:g} s (is its event loop blocked?)"
        raise Unreachable(f"cannot reach {target}: {why}") from None
    if len(body) > MAX_STATUS_BYTES:
        raise Unreachable(f"{target}: an answer over {MAX_STATUS_BYTES >> 20} MiB is not an "
                          "mdb health snapshot")
    try:
        return Health.from_json(json.loads(body))
    except (ValueError, AttributeError) as exc:
        raise Unreachable(f"{target}: not an mdb health snapshot ({exc})") from None


class Refused(Exception):
    """``control``: the health endpoint answered ``status``, refusing; the message is its
    reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def control(url: str, action: str, listener: str, token: str, timeout: float) -> dict[str, Any]:
    """POST ``url``/listeners/``listener``/``action`` with ``token``; the answer's JSON.
    Blocking. ``Refused`` with the endpoint's reason, ``Unreachable`` without an answer."""
    target = f"{url.rstrip('/')}/listeners/{urllib.parse.quote(listener, safe='')}/{action}"
    request = urllib.request.Request(target, data=b"", method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        try:
            said = printable(str(json.loads(exc.read())["error"]))  # for a terminal
        except (ValueError, KeyError, TypeError, OSError):
            said = f"HTTP {exc.code}; is this an mdb health endpoint?"
        raise Refused(exc.code, said) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(why, TimeoutError):
            why = f"no answer within {timeout:g} s"
        raise Unreachable(f"cannot reach {target}: {why}") from None
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise Unreachable(f"{target}: not an mdb answer")
    return answer


def health_url(settings: Settings) -> str:
    """The URL of the health endpoint ``settings`` give a container on this host (``mdb
    status``); ConfigurationError when they give none that can be known here."""
    if settings.health_port is None:
        raise ConfigurationError("mdb status: set `health_port` (the container's health "
                                 "endpoint) in the settings, or give --url http://HOST:PORT")
    if settings.health_port == 0:
        raise ConfigurationError("mdb status: `health_port` is 0 (any free port), so the port "
                                 "is not known here; give --url http://HOST:PORT")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
        settings.health_host, settings.health_host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.health_port}"


def fetch_pages(urls: Iterable[tuple[int, str]], timeout: float) -> dict[int, str]:
    """GET each worker's ``/metrics`` in the Prometheus text format; blocking. A worker that
    does not answer is left out (its ``mdb_worker_ready`` says so)."""
    pages = {}
    for index, url in urls:
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout) as answer:
                pages[index] = answer.read().decode()
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return pages
