"""The benchmark's application, run by ``mdb run`` as a user runs theirs (``tests.bench.loops``,
``mdb_run``): one listener, ``bench``, on ``queue:$BENCH_QUEUE``, doing ``$BENCH_WORKLOAD``:

* ``W1``: nothing (an empty ``async def handler(body: bytes, ctx: Context)``);
* ``W1s``: ``await ctx.send("queue:$BENCH_QUEUE.out", body)``, transacted (the default);
* ``W2``: ``await anyio.sleep(0.002)``, a handler waiting on I/O;
* ``W3``: 2 ms of this thread's CPU in pure Python: an ``async def`` handler that never awaits
  holds its event loop (and the GIL) for the whole 2 ms, as CPU-bound Python code does, so one
  process can use at most one core for it: what ``--workers`` is for;

with ``pool = $BENCH_POOL`` (default 1) and ``prefetch = $BENCH_PREFETCH`` (default: mdb's).
``$BENCH_TRACING``, ``sampled-out`` or ``recorded``, sets the OpenTelemetry SDK's tracer
provider as ``mdb run`` does for ``OTEL_TRACES_EXPORTER`` (a batch span processor), spans
sampled out at their start or recorded and handed to an exporter that drops them (what an
exporter costs is its own); no meter provider, as ``mdb run`` sets none without
``OTEL_METRICS_EXPORTER``.
``$BENCH_PROFILE``, ``COUNT:PATH``, profiles the event loop's thread (which does all the work per
message) from the first message handled to the COUNT-th and writes the profile to PATH, for
``tests.bench.profile_calls``; ``$BENCH_STOP_AFTER``, a count, stops the process (SIGTERM, as an
operator stops it) once that many messages were handled, for its instructions under callgrind.
"""

from __future__ import annotations

import cProfile
import os
import signal
import time

import anyio

from mdb import Context, listener

BURN = 0.002  # seconds of this thread's CPU per message, W3
QUEUE = os.environ.get("BENCH_QUEUE", "bench")
WORKLOAD = os.environ.get("BENCH_WORKLOAD", "W1")
PREFETCH = os.environ.get("BENCH_PREFETCH")
PROFILE = os.environ.get("BENCH_PROFILE", "")
STOP_AFTER = int(os.environ.get("BENCH_STOP_AFTER", "0"))


def burn() -> None:
    end = time.thread_time() + BURN
    while time.thread_time() < end:
        pass


async def handler(body: bytes, ctx: Context) -> None:
    if WORKLOAD == "W1s":
        await ctx.send(f"queue:{QUEUE}.out", body)
    elif WORKLOAD == "W2":
        await anyio.sleep(0.002)
    elif WORKLOAD == "W3":
        burn()
    if PROFILE or STOP_AFTER:
        counted()


profile = cProfile.Profile()
seen = 0


def counted() -> None:
    global seen
    seen += 1
    if seen == STOP_AFTER:
        os.kill(os.getpid(), signal.SIGTERM)
    if not PROFILE:
        return
    count, path = PROFILE.split(":", 1)
    if seen == 1:
        profile.enable()
    elif seen == int(count):
        profile.disable()
        profile.dump_stats(path + ".part")
        os.replace(path + ".part", path)  # whole when it appears


bench = listener(f"queue:{QUEUE}", name="bench", pool=int(os.environ.get("BENCH_POOL", "1")),
                 prefetch=int(PREFETCH) if PREFETCH else None)(handler)

if os.environ.get("BENCH_TRACING"):
    from collections.abc import Sequence

    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    class Dropped(SpanExporter):
        """Exports nowhere: what an exporter costs is its own."""

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    recorded = os.environ["BENCH_TRACING"] == "recorded"
    provider = TracerProvider(sampler=ALWAYS_ON if recorded else ALWAYS_OFF)
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
