"""The operator's controls under ``mdb run --workers N``: the supervisor's health endpoint
passes ``POST /listeners/NAME/pause`` and ``.../resume`` on to every worker's own (on
127.0.0.1, where the supervisor reads their snapshots), with the same token, at once, and
answers once all did (docs/health.md, "Pause and resume"). The worker channel does not carry
them: the supervisor never writes on it, which is what makes it the worker's lifeline
(``mdb.serving.process.worker_channel``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio
import anyio.to_thread
from pydantic import SecretStr

from mdb.errors import UnknownListener
from mdb.observability import logs
from mdb.serving.http.client import Refused, Unreachable, control
from mdb.serving.http.routes import NotDone
from mdb.serving.process.workers import Worker

ASK_TIMEOUT = 2.0  # seconds a worker's endpoint may take to answer, as for its snapshot


class Controls:
    """The supervisor's: what was paused through it (with ``token``, the server's
    ``control_token``), kept for the workers it starts later, also when one did not do it at
    once."""

    def __init__(self, token: SecretStr | None) -> None:
        self._token = token
        self._paused: set[str] = set()

    async def act(self, places: Sequence[Worker], action: str, name: str) -> int:
        """``POST /listeners/NAME/pause`` or ``.../resume`` (``mdb.serving.http.routes.Act``)
        for the workers in ``places``: ``pass_on``."""
        assert self._token is not None  # the health server acts only for a request with it
        (self._paused.add if action == "pause" else self._paused.discard)(name)
        return await pass_on(
            [(p.index, p.health_url if p.state in ("ready", "starting") else None, p.state)
             for p in places], self._token, action, name)

    async def again(self, place: Worker) -> None:
        """The worker in ``place`` started (again), and is ready: the listeners paused through
        the supervisor are paused there too (it started as its configuration says)."""
        for name in sorted(self._paused):
            assert self._token is not None  # only a request that brought it paused one
            try:
                await pass_on([(place.index, place.health_url, place.state)], self._token,
                              "pause", name)
            except (NotDone, UnknownListener) as exc:
                logs.tell(f"mdb: worker {place.index}: listener {name} not paused again: {exc}",
                          logging.ERROR)


async def pass_on(workers: Sequence[tuple[int, str | None, str]], token: SecretStr,
                  action: str, name: str) -> int:
    """Do ``action`` ("pause" or "resume") to listener ``name`` in each of ``workers``
    (index, its health endpoint's URL, or None while it does not run, and its state); the
    number of workers, once all did it. ``UnknownListener`` when none runs such a listener;
    ``NotDone`` naming each worker that did not (not running now, no answer, or refused)."""
    failures: dict[int, str] = {}
    unknown: list[str] = []

    async def ask(index: int, url: str) -> None:
        try:
            await anyio.to_thread.run_sync(control, url, action, name,
                                           token.get_secret_value(), ASK_TIMEOUT)
        except Refused as exc:
            failures[index] = str(exc)
            if exc.status == 404:
                unknown.append(str(exc))
        except Unreachable as exc:
            failures[index] = str(exc)

    async with anyio.create_task_group() as asking:
        for index, url, state in workers:
            if url is None:
                failures[index] = f"it is {state}"
            else:
                asking.start_soon(ask, index, url)
    if unknown and len(unknown) == len(workers):
        raise UnknownListener(unknown[0])
    if failures:
        why = "; ".join(f"worker {index} did not ({reason})"
                        for index, reason in sorted(failures.items()))
        raise NotDone(f"{action} {name}: {why}; {len(workers) - len(failures)} of "
                      f"{len(workers)} workers did")
    return len(workers)
