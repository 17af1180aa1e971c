"""Private brokers for a test, and what a test does when a server it needs is not installed:
it skips on a developer's machine, and fails in CI (``CI=true``), where every server must be
there (``tests/run`` installs them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.harness.servers.process import BrokerProcess, started_together

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true); tests/run installs it")
    pytest.skip(f"{what} is not installed here (tests/run installs it)")


@contextmanager
def private_brokers(kind: str, count: int = 1) -> Iterator[list[BrokerProcess]]:
    """``count`` private brokers of ``kind`` (``activemq`` or ``rabbitmq``) on their own ports
    and data directories, started in parallel and closed at the end. Skips (fails in CI) when
    the broker is not installed."""
    from tests.harness.servers.activemq import ActiveMQ, activemq_available
    from tests.harness.servers.rabbitmq import RabbitMQ, rabbitmq_available

    make, available, what = {
        "activemq": (ActiveMQ, activemq_available, "ActiveMQ Classic"),
        "rabbitmq": (RabbitMQ, rabbitmq_available, "RabbitMQ with the STOMP plugin"),
    }[kind]
    if not available():
        missing(what)
    with started_together(make, count) as brokers:
        yield brokers
