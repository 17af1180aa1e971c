"""The one HTTP client of mdb, for its own endpoints: ``mdb status`` reads a container's
``/status`` (``fetch_status``), and the supervisor of ``mdb run --workers N`` its workers'
``/metrics`` pages (``fetch_pages``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable

from mdb.errors import ConfigurationError
from mdb.health import Health
from mdb.redaction import printable
from mdb.settings import Settings


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
            body = response.read()
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
    try:
        return Health.from_json(json.loads(body))
    except (ValueError, AttributeError) as exc:
        raise Unreachable(f"{target}: not an mdb health snapshot ({exc})") from None


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
