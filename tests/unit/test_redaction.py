from __future__ import annotations

import pytest

from mdb.redaction import mask_secrets, redact_url


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


def test_mask_secrets_masks_url_passwords_and_passcodes_in_free_text() -> None:
    text = ("sending frame: [b'login:u\\n', b'passcode:s3cr3t\\n'] to "
            "stomp+activemq://u:s3cr3t@host:61613 and http://plain.example/")
    masked = mask_secrets(text)
    assert "s3cr3t" not in masked
    assert "passcode:***" in masked and "stomp+activemq://u:***@host:61613" in masked
    assert "http://plain.example/" in masked


def test_mask_secrets_masks_a_passcode_with_quotes_up_to_its_line_end() -> None:
    logged = str([b"CONNECT\n", b"passcode:it's \"s3cr3t\"\n", b"\n"])
    masked = mask_secrets(logged)
    assert "passcode:***" in masked and "s3cr3t" not in masked and "it's" not in masked
    assert mask_secrets("passcode:s3cr3t\nlogin:u") == "passcode:***\nlogin:u"
