"""Fixtures of the hostile-input suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.harness.apps.in_process import record_spans


@pytest.fixture(scope="session")
def spans() -> Iterator[InMemorySpanExporter]:
    """Every span finished from the first test that asks on (tests tell theirs apart by their
    unique destinations)."""
    exporter = InMemorySpanExporter()
    record_spans(exporter)
    yield exporter
