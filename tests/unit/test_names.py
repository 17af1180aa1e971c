"""Names that become part of frames and subscription names are refused with a trailing newline
(a newline in a header would end it): ``$`` in a regular expression also matches before a final
newline."""

from __future__ import annotations

import pytest

from mdb.config.settings import load_settings
from mdb.errors import ConfigurationError
from mdb.messages.destinations import Destination


@pytest.mark.parametrize("text", ["queue:orders\n", "topic:prices\n", "queue:a\nb"])
def test_a_destination_name_with_a_newline_is_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="may contain only"):
        Destination.parse(text)


@pytest.mark.parametrize("field", ["app", "server"])
def test_an_app_or_server_name_with_a_trailing_newline_is_refused(field: str) -> None:
    with pytest.raises(ConfigurationError, match=f"setting {field}: .*only letters"):
        load_settings(None, **{field: "shop\n"})


def test_a_destinations_key_with_a_trailing_newline_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDB_DESTINATIONS", '{"queue:orders\\n": {"broker": "default"}}')
    with pytest.raises(ConfigurationError, match="may contain only"):
        load_settings()
