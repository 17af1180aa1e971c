from __future__ import annotations

import pytest

from mdb.redaction import redact_url


@pytest.mark.parametrize(("url", "shown"), [
    ("stomp+activemq://u:pw@host:61613", "stomp+activemq://u:***@host:61613"),
    ("stomp+rabbitmq://u:pw@host/vh", "stomp+rabbitmq://u:***@host/vh"),
    ("stomp+activemq://[::1]:61613", "stomp+activemq://[::1]:61613"),
    ("stomp+activemq://u:p%40w@[::1]:1", "stomp+activemq://u:***@[::1]:1"),
    ("memory://default", "memory://default"),
    ("stomp+activemq://u@host:1", "stomp+activemq://u@host:1"),
])
def test_the_password_is_masked_and_the_rest_kept(url: str, shown: str) -> None:
    assert redact_url(url) == shown
