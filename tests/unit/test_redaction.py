from __future__ import annotations

import pytest

from mdb.observability.redaction import mask_secrets, redact_url


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


# The rules of docs/security.md, "Secrets": what mask_secrets masks in free text (an exception's
# text, a log line, a header's value), and what it must leave alone.
CARD = "4111 1111 1111 1111"  # passes the Luhn check


@pytest.mark.parametrize(("text", "shown"), [
    ("cannot reach postgresql://shop:hunter2@db:5432/orders",
     "cannot reach postgresql://shop:***@db:5432/orders"),
    ("login failed: password=hunter2 for shop", "login failed: password=*** for shop"),
    ("DB_PASSWORD = hunter2", "DB_PASSWORD = ***"),
    ("token: abc.def.ghi", "token: ***"),
    ("passwd: hunter2", "passwd: ***"),
    ("pwd=hunter2;user=shop", "pwd=***"),
    ("client_secret=s3cr3t&scope=all", "client_secret=***&scope=all"),
    ("x-api-key: k-123", "x-api-key: ***"),
    ("{'user': 'shop', 'password': 'hun ter2'}", "{'user': 'shop', 'password': '***'}"),
    ('{"user": "shop", "password": "hun\\"ter2"}', '{"user": "shop", "password": "***"}'),
    ('{"api_key": "k-123", "n": 1}', '{"api_key": "***", "n": 1}'),
    ("GET https://api.example/v1?api_key=k-123&page=2 failed",
     "GET https://api.example/v1?api_key=***&page=2 failed"),
    ("Authorization: Bearer eyJhbGciOi.eyJzdWIi.SflKxw", "Authorization: ***"),
    ("sent Bearer eyJhbGciOi.eyJzdWIi.SflKxw", "sent Bearer ***"),
    ("headers={'Authorization': 'Basic dXNlcjpwYXNz'}", "headers={'Authorization': '***'}"),
    ("passcode:s3cr3t", "passcode:***"),
    (f"invalid literal for int() with base 10: '{CARD}'",
     "invalid literal for int() with base 10: '***'"),
    ("card 4111-1111-1111-1111 declined", "card *** declined"),
    ("card 4111111111111111 declined", "card *** declined"),
    ("amex 3782 822463 10005", "amex ***"),
    (f"{CARD} 2026", "*** 2026"),  # a card followed by another number
])
def test_mask_secrets_masks_by_the_documented_rules(text: str, shown: str) -> None:
    assert mask_secrets(text) == shown


@pytest.mark.parametrize("text", [
    "order 4111111111111112 failed",  # 16 digits that fail the Luhn check: an order id
    "at 1765432100000 ms",  # a time in ms passes or not, it starts with 1: no card
    "message 6e2f1a4111111111111111b3c4d5e6 failed",  # digits inside an id
    "quantity: 500 over the limit",
    "test passed: 3 of 4",
    "https://example.org/orders?page=2&user=shop",
    "stomp+activemq://shop@mq:61613",
    "2026-11-27 23:16:14 ValueError",
    # mdb's own errors name a setting, never its value, and a file may be called a secret
    "  setting brokers.main.password: Input should be a valid string",
    "setting brokers.main.password_file: Value error, /run/secret: not a regular file",
])
def test_mask_secrets_leaves_what_is_no_secret(text: str) -> None:
    assert mask_secrets(text) == text


def test_masking_twice_changes_nothing_more() -> None:
    text = f"password=hunter2 card {CARD} postgresql://shop:pw@db Authorization: Bearer x.y"
    assert mask_secrets(mask_secrets(text)) == mask_secrets(text)
