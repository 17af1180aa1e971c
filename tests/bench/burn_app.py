"""W3 of the benchmark, run by ``mdb run``: a handler that burns 2 ms of CPU in pure Python.

It serves ``queue:$BENCH_QUEUE`` with a pool of 4; an ``async def`` handler that never awaits
holds its event loop (and the GIL) for the whole 2 ms, as CPU-bound Python code does, so one
process can use at most one core for it: what ``--workers`` is for.
"""

from __future__ import annotations

import os
import time

from mdb import listener

BURN = 0.002  # seconds of this thread's CPU per message


@listener(f"queue:{os.environ.get('BENCH_QUEUE', 'bench')}", pool=4, name="burn")
async def burn(body: bytes) -> None:
    end = time.thread_time() + BURN
    while time.thread_time() < end:
        pass
