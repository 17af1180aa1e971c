"""``mdb console [--config FILE]``: the console's process. One event loop runs the poller
(``poller.Fleet``) and answers every request (``router.Router``), which the probe server reads
in threads of its own (``mdb.serving.http.server``) and hands to the loop."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from mdb.commands.console.auth import Auth
from mdb.commands.console.failed_pages import FailedPages
from mdb.commands.console.poller import Fleet
from mdb.commands.console.router import MAX_FORM_BYTES, Control, Router
from mdb.commands.console.subscription_pages import Delete, Subscriptions
from mdb.commands.subscriptions import delete_subscription
from mdb.config.settings import Settings
from mdb.errors import ConfigurationError
from mdb.messages.destinations import Destination
from mdb.messages.topology import Member
from mdb.routing.brokers import Brokers
from mdb.serving.http import client
from mdb.serving.http.server import Answer, HttpRequest, ProbeServer

CONTROL_SECONDS = 30.0
"""How long a container may take to pause a listener (its messages in flight finish first)."""


class ConsoleServer(ProbeServer):
    """The probe server, with the time a replay of a selection of failed messages takes."""

    DEADLINE = 60.0


def check(settings: Settings) -> None:
    """ConfigurationError naming the setting when the console cannot run as configured."""
    console = settings.console
    if not console.containers:
        raise ConfigurationError(
            "setting console.containers: no container to show; list their health endpoints, "
            "e.g. containers = [\"http://orders-1:8081\"] under [console] (docs/console.md)")
    if not console.loopback and settings.control_token is None:
        raise ConfigurationError(
            f"setting console.bind: {console.bind} is reachable beyond this machine, and "
            "without a token anyone reaching it would read the fleet; set control_token_file "
            "(reading then needs a login too), or bind 127.0.0.1 (docs/console.md)")


def listen(settings: Settings) -> socket.socket:
    console = settings.console
    family = socket.AF_INET6 if ":" in console.bind else socket.AF_INET
    try:
        return socket.create_server((console.bind, console.port), family=family)
    except OSError as exc:
        raise ConfigurationError(
            f"setting console.port: cannot listen on {console.bind}:{console.port}: "
            f"{exc.strerror or exc}; choose another console.port (0: any free one) or "
            "console.bind") from None


async def serve(settings: Settings, control: Control, *,
                ready: Callable[[int], None] = lambda _: None) -> None:
    """Run the console of ``settings`` until cancelled; ``ready`` is told its port."""
    check(settings)
    console = settings.console
    failed = FailedPages.of(settings, console.error_destinations, console.modules)
    fleet = Fleet(console.containers, console.refresh)
    auth = Auth(settings.control_token, open_reading=console.loopback)
    router = Router(fleet, auth, control, failed, Subscriptions(_deleting(settings)))
    token = anyio.lowlevel.current_token()

    def answer(request: HttpRequest) -> Answer:
        return anyio.from_thread.run(router.answer, request, token=token)

    sock = listen(settings)
    server = ConsoleServer(sock, answer, max_body=MAX_FORM_BYTES)
    server.start()
    try:
        await fleet.read_all()  # the first page shows the fleet
        ready(sock.getsockname()[1])
        await fleet.run()
    finally:
        server.close()
        await failed.close()


async def command(args: argparse.Namespace, settings: Settings) -> int:
    def said(port: int) -> None:
        print(f"mdb console on http://{settings.console.bind}:{port}/ "
              f"({len(settings.console.containers)} containers)", flush=True)

    await serve(settings, _control(settings), ready=said)
    return 0


def _control(settings: Settings) -> Control:
    """Pause or resume through a container's control route, with the control token."""
    token = settings.control_token

    async def control(url: str, listener: str, action: str) -> tuple[bool, str]:
        assert token is not None  # the router lets no action through without one
        try:
            said = await anyio.to_thread.run_sync(
                client.control, url, action, listener, token.get_secret_value(),
                CONTROL_SECONDS)
        except (client.Refused, client.Unreachable) as exc:
            return False, str(exc)
        return True, f"{action}d in {said.get('workers', 1)} workers"

    return control


def _deleting(settings: Settings) -> Delete:
    """Delete a subscription on a broker of the console's settings, as ``mdb subscriptions
    --delete`` does."""
    brokers: list[Brokers] = []  # made at the first cleanup: most consoles never make one

    async def delete(broker: str, destination: str, name: str) -> None:
        if broker not in settings.brokers:
            raise ConfigurationError(
                f"broker {broker!r} is not in the console's settings: add [brokers.{broker}] "
                "with its url to delete subscriptions there")
        if not brokers:
            brokers.append(Brokers(settings))
        await delete_subscription(brokers[0], f"{settings.app}.console.admin",
                                  Member(broker, Destination.parse(destination)), name)

    return delete
