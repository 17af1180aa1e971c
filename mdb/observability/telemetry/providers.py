"""Whether anything records what mdb would: a tracer provider, a meter provider set (by mdb's
``configure`` or by the application), and whether spans may hold message bodies; and the
attributes every span and data point of a destination shares."""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal

from mdb.messages.message import ReplyTo
from mdb.observability.telemetry.instruments import Attributes
from mdb.observability.telemetry.names import DESTINATION

# Whether a provider is set is asked for every message. The API's getters read an environment
# variable on every call while none is set, which would cost more than all the rest of a
# message's telemetry, so the API's own module globals are read instead, with the getters as
# the fallback should a release rename them.
_UNKNOWN = object()


def tracing_on() -> bool:
    """Whether a tracer provider is set (else no span would be recorded)."""
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return provider is not None


def metrics_on() -> bool:
    """Whether a meter provider is set (else no metric would be recorded)."""
    provider = getattr(metrics_internal, "_METER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        return not type(metrics.get_meter_provider()).__name__.startswith("_Proxy")
    return provider is not None


def record_bodies() -> bool:
    """Whether spans record message bodies (``MDB_TRACE_BODIES=true``); off by default."""
    return os.environ.get("MDB_TRACE_BODIES", "").lower() in {"1", "true", "yes"}


def attributes(system: str, destination: ReplyTo, operation: str) -> Attributes:
    """The messaging attributes of ``operation`` on ``destination`` of a ``system``."""
    return {"messaging.system": system, DESTINATION: str(destination),
            "messaging.operation.name": operation, "messaging.operation.type": operation}


def metric_attributes(attributes: Mapping[str, str | int | bool]) -> Attributes:
    """``attributes`` as a data point takes them (the operation's type is the span's)."""
    return {k: v for k, v in attributes.items() if k != "messaging.operation.type"}
