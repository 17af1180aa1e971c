"""``mdb pause LISTENER`` and ``mdb resume LISTENER``: the operator's controls of a running
container, posted to its health endpoint (``POST /listeners/NAME/pause``, ``.../resume``,
``mdb.serving.http.routes``) with the token of ``control_token_file`` (docs/health.md, "Pause
and resume"). One line; exit 0 when done, 1 when refused, 3 when nothing answers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio.to_thread

from mdb.config.broker_settings import read_secret
from mdb.config.settings import Settings
from mdb.errors import ConfigurationError
from mdb.serving.http.client import (
    NotLive,
    Refused,
    Unreachable,
    control,
    fetch_status,
    health_url,
)


async def command(args: argparse.Namespace, settings: Settings) -> int:
    action = args.action
    url = args.url or health_url(settings)
    if "://" not in url:
        url = f"http://{url}"
    token = _token(args.token_file, settings, action)
    try:
        answer = await anyio.to_thread.run_sync(control, url, action, args.listener, token,
                                                args.timeout)
    except Refused as exc:
        print(f"mdb: {action} {args.listener} at {url} refused: {exc}", file=sys.stderr)
        return 1
    except Unreachable as exc:
        print(f"mdb: {exc}", file=sys.stderr)
        return 3
    try:  # which container did it, for the line
        identity = (await anyio.to_thread.run_sync(fetch_status, url, args.timeout)).identity
        where = f"{identity.app}/{identity.server}" if identity.app else url
    except (NotLive, Unreachable):
        where = url
    workers = answer.get("workers", 1)
    print(f"{'paused' if action == 'pause' else 'resumed'} {args.listener} on {where} "
          f"({workers} worker{'' if workers == 1 else 's'})", flush=True)
    return 0


def _token(path: Path | None, settings: Settings, action: str) -> str:
    if path is None:
        if settings.control_token is None:
            raise ConfigurationError(f"mdb {action}: give --token-file FILE, or set "
                                     "control_token_file, the container's token")
        return settings.control_token.get_secret_value()
    try:
        return read_secret(path)
    except ValueError as exc:
        raise ConfigurationError(f"--token-file: {exc}") from None


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``mdb pause`` and ``mdb resume``, on the ``mdb`` command's subparsers."""
    for action, does in (("pause", "take no new message (what runs finishes)"),
                         ("resume", "take messages again")):
        p = sub.add_parser(action, help=f"make a listener of a running container {does} "
                                        "(exit 0: done, 1: refused, 3: no answer)")
        p.add_argument("listener", metavar="LISTENER", help="the listener's name")
        p.add_argument("--config", type=Path, help="TOML settings file")
        p.add_argument("--url", help="its health endpoint, http://HOST:PORT (default: from "
                                     "the settings health_host and health_port)")
        p.add_argument("--token-file", type=Path, metavar="FILE",
                       help="the file of the container's token (default: the setting "
                            "control_token_file)")
        p.add_argument("--timeout", type=float, default=10.0,
                       help="seconds to wait for the answer (default: 10)")
        p.set_defaults(command=command, action=action, app=None, server=None)
