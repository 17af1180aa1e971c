"""Telemetry: spans, trace context in message headers, metrics and the counts of what each
listener did, after the OpenTelemetry messaging semantic conventions (docs/tracing.md). The
only package of the core that imports OpenTelemetry.

* ``names``: what spans and data points record, read back by the testing kit;
* ``stats``: ``Stats``, each listener's outcomes, counted once where they happen, and ``latency``,
  the recent durations of its handler (``Latencies``: p50 and p99);
* ``instruments``: the metrics, ``Stats`` among what they observe;
* ``providers``: whether anything records (a provider set), and the attributes shared;
* ``sends``: the ``send`` span of every message mdb sends, and its trace context;
* ``processing``: the ``process`` span of each delivery (``Consumer``, ``Processing``);
* ``setup``: the SDK from ``OTEL_*`` variables (``configure``) and trace ids in log lines.
"""

from mdb.observability.telemetry.instruments import watch_brokers, watch_listener
from mdb.observability.telemetry.processing import UNSEEN, Consumer, Processing
from mdb.observability.telemetry.sends import sending
from mdb.observability.telemetry.setup import TraceIds, configure, metrics_exporter
from mdb.observability.telemetry.stats import OUTCOMES, Stats

__all__ = ["OUTCOMES", "UNSEEN", "Consumer", "Processing", "Stats", "TraceIds", "configure",
           "metrics_exporter", "sending", "watch_brokers", "watch_listener"]
