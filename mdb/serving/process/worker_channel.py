"""The channel between a worker of ``mdb run --workers N`` and its supervisor.

One end of a Unix socket pair, handed to the worker as an inherited descriptor (the hidden
``--worker INDEX:FD`` option). The worker writes one JSON object per line; the supervisor only
reads:

* ``{"health": URL}`` once the worker's own health endpoint listens (on a free port of
  127.0.0.1; the supervisor asks it for the worker's snapshot);
* ``{"ready": true}`` once the worker's container reported ready.

The socket is also the worker's lifeline (``mdb.serving.process.lifeline``): the supervisor never
writes, so the worker reads end of file only when the supervisor is gone (even killed with SIGKILL),
and then stops as on SIGTERM instead of running on unsupervised.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from anyio.abc import SocketStream, UNIXSocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from mdb.errors import ConfigurationError
from mdb.serving.process import lifeline

_LINE_LIMIT = 4096


@dataclass(frozen=True)
class WorkerAssignment:
    """Which worker this process is: ``index`` (1 to N) and the channel's descriptor."""

    index: int
    fd: int

    @classmethod
    def parse(cls, text: str) -> WorkerAssignment:
        """``INDEX:FD`` as the supervisor writes it; ConfigurationError otherwise."""
        index, _, fd = text.partition(":")
        if not (index.isdigit() and fd.isdigit()):
            raise ConfigurationError(f"--worker {text!r}: INDEX:FD (given by `mdb run "
                                     f"--workers`, not by hand)")
        return cls(int(index), int(fd))

    def __str__(self) -> str:
        return f"{self.index}:{self.fd}"


class WorkerChannel:
    """The worker's end: ``report`` to the supervisor, and ``watch`` for it to go away."""

    def __init__(self, place: WorkerAssignment, stream: UNIXSocketStream) -> None:
        self.place = place
        self._stream = stream

    @classmethod
    async def open(cls, place: WorkerAssignment) -> WorkerChannel:
        """The channel on the descriptor the supervisor handed this worker."""
        return cls(place, await UNIXSocketStream.from_socket(socket.socket(fileno=place.fd)))

    async def report(self, **fields: object) -> None:
        """Send ``fields`` as one JSON line; a supervisor that is gone is the watcher's business."""
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await self._stream.send(json.dumps(fields).encode() + b"\n")

    async def watch(self, on_gone: Callable[[], None]) -> None:
        """Return after calling ``on_gone`` once the supervisor's end is closed."""
        await lifeline.watch(self._stream, on_gone, f"worker {self.place.index}",
                             "the supervisor")

    async def aclose(self) -> None:
        await self._stream.aclose()


async def reports(stream: SocketStream) -> AsyncIterator[dict[str, object]]:
    """The supervisor's end: each object a worker wrote, until it closes its end (exits). A
    line that is not a JSON object ends the channel."""
    buffered = BufferedByteReceiveStream(stream)
    while True:
        try:
            line = await buffered.receive_until(b"\n", _LINE_LIMIT)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                anyio.DelimiterNotFound, OSError):
            return
        try:
            item = json.loads(line)
        except ValueError:
            return
        if not isinstance(item, dict):
            return
        yield item
