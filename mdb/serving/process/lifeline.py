"""A child process's lifeline: how an ``mdb run`` started by another one notices that its
parent is gone, however the parent ended (SIGKILL, the OOM killer, a crash), and stops in order
instead of running on unwatched for ever.

The parent makes a socket pair, hands one end to the child as an inherited descriptor and keeps
the other, on which it never writes. The kernel closes the parent's end when the parent exits,
so the child reads end of file then and only then: nothing is polled and nothing is done per
message. It works wherever Unix sockets do (``prctl(PR_SET_PDEATHSIG)`` is Linux's alone, and
a parent's pid can be reused). Two kinds of parent hand one out: the supervisor of ``mdb run
--workers N``, whose channel to each worker is also its lifeline
(``mdb.serving.process.worker_channel``), and the watcher of ``mdb run --reload``, whose container
gets the hidden ``--lifeline FD``.

The child watches from its start, as it listens for signals: a parent gone while the child is
still connecting stops it as soon as it has started.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import anyio
from anyio.abc import ByteReceiveStream, UNIXSocketStream

log = logging.getLogger("mdb.process.lifeline")


async def watch(stream: ByteReceiveStream, on_gone: Callable[[], None], who: str,
                parent: str) -> None:
    """Return after calling ``on_gone`` once the other end of ``stream`` (``parent``'s) is
    closed; whatever arrives on it is ignored. ``who`` and ``parent`` name both in the log."""
    try:
        while await stream.receive():
            pass
    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
        pass
    log.warning("%s: %s is gone; stopping", who, parent)
    on_gone()


async def watch_descriptor(fd: int, on_gone: Callable[[], None], who: str) -> None:
    """``watch`` the inherited end ``fd`` (``--lifeline FD``) of ``mdb run --reload``'s
    watcher, closing it at the end."""
    async with await UNIXSocketStream.from_socket(socket.socket(fileno=fd)) as stream:
        await watch(stream, on_gone, who, "the --reload watcher")
