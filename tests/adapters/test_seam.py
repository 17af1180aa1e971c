"""The broker seam's contract (``mdb.testing.seam``) on mdb's three adapters: the memory
broker, ActiveMQ and RabbitMQ over STOMP (harness brokers)."""

from __future__ import annotations

import uuid

import pytest

from mdb.testing.seam import *  # noqa: F403


@pytest.fixture(params=["memory", pytest.param("activemq", marks=pytest.mark.activemq),
                        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def seam_url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return f"memory://seam-{uuid.uuid4().hex[:8]}"
    return str(request.getfixturevalue(request.param).url)
