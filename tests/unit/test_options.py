"""Listener options are declared once (``ListenerOptions``); what is derived from them or
written beside them must agree with that declaration."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mdb import Distribution, Redelivery, listener
from mdb.config import reference
from mdb.config.settings import load_settings
from mdb.errors import ConfigurationError
from mdb.listeners.options import ListenerOptions, ListenerOverrides
from tests.harness.apps.in_process import specs

# A value other than the declared default for every option, valid on a per-server topic.
SAMPLES: dict[str, Any] = {
    "distribution": Distribution.ONE_COPY_PER_SERVER,
    "pool": 3,
    "transacted": True,
    "selector": "region = 'eu'",
    "redelivery": Redelivery(limit=2),
    "error_destination": "queue:failed",
    "durable": False,
    "subscription": "{app}-{server}-prices",
    "durable_subscription_deletion": True,
    "max_messages_per_transaction": 10,
    "prefetch": 12,
    "handler_timeout": 30.0,
    "exactly_once": "main",
    "paused": True,
}


def _decorator_options() -> dict[str, inspect.Parameter]:
    return {name: param for name, param in inspect.signature(listener).parameters.items()
            if param.kind is param.KEYWORD_ONLY and name != "name"}


def test_the_decorators_keyword_parameters_are_the_declared_options() -> None:
    # The decorator keeps typed keyword parameters for IDEs and type checkers; this is what
    # keeps that one copy from drifting: same names in the same order, each defaulting to None
    # ("not given": the settings' defaults, then the declared default apply) and accepting at
    # least the declared type.
    parameters = _decorator_options()
    assert list(parameters) == list(ListenerOptions.model_fields)
    hints = typing.get_type_hints(listener)
    for name, info in ListenerOptions.model_fields.items():
        assert parameters[name].default is None, name
        accepted = set(typing.get_args(hints[name]))
        declared = set(typing.get_args(info.annotation)) or {info.annotation}
        assert declared | {type(None)} <= accepted, name


def test_without_options_the_declared_defaults_apply() -> None:
    @listener("topic:prices")
    def on_price(body: bytes) -> None:
        pass

    [spec] = specs(on_price)
    assert spec.options == ListenerOptions()
    assert spec.options.model_dump() == {
        name: info.get_default() for name, info in ListenerOptions.model_fields.items()
    } | {"redelivery": Redelivery().model_dump()}


def test_every_option_given_to_the_decorator_reaches_the_spec_as_given() -> None:
    assert set(SAMPLES) == set(ListenerOptions.model_fields)
    for name, value in SAMPLES.items():
        assert value != ListenerOptions.model_fields[name].default or name == "transacted"

    @listener("topic:prices", **SAMPLES)
    def on_price(body: bytes) -> None:
        pass

    [spec] = specs(on_price)
    assert spec.options.model_dump() == ListenerOptions(**SAMPLES).model_dump()
    assert spec.options.model_fields_set == set(SAMPLES)


def test_overrides_have_every_option_optional_and_unset_by_default() -> None:
    assert list(ListenerOverrides.model_fields) == list(ListenerOptions.model_fields)
    for name, info in ListenerOverrides.model_fields.items():
        assert info.default is None
        assert info.description == ListenerOptions.model_fields[name].description
    assert ListenerOverrides().model_dump(exclude_unset=True) == {}
    assert ListenerOverrides.model_validate(SAMPLES).model_dump(exclude_unset=True) == \
        ListenerOptions(**SAMPLES).model_dump(exclude_unset=True)


def test_overrides_check_types_when_read_and_bounds_once_merged() -> None:
    with pytest.raises(ValidationError, match="pool"):
        ListenerOverrides.model_validate({"pool": "many"})
    with pytest.raises(ValidationError, match="poll"):
        ListenerOverrides.model_validate({"poll": 2})
    # A bound applies to the merged layers (ListenerSpec.with_settings), see test_listener.
    assert ListenerOverrides.model_validate({"pool": 0}).model_dump(exclude_unset=True) == \
        {"pool": 0}


def test_the_reference_shows_each_options_declared_default_range_and_meaning() -> None:
    text = reference.markdown()
    for name, info in ListenerOptions.model_fields.items():
        [row] = [line for line in text.splitlines()
                 if line.startswith(f"| `{name}` |") and "MDB_LISTENERS__LISTENER__" in line]
        assert row.endswith(f"| {' '.join(str(info.description).split())} |")
    assert "| `pool` | `1` | 1 to 1024 |" in text
    assert "| `distribution` | `'one-copy-per-app'` |  |" in text
    assert "| `backoff` | `2.0` | 1 to 10 |" in text
    assert "| `health_port` | none | 0 to 65535 |" in text
    assert "| `broker` | required |" in text


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), -1.0, 86_401.0])
def test_a_handler_timeout_is_a_finite_number_of_seconds_up_to_a_day(seconds: float) -> None:
    with pytest.raises(ValidationError, match="handler_timeout"):
        ListenerOptions(handler_timeout=seconds)


@pytest.mark.parametrize(("toml", "setting"), [
    *((f"[listeners.on_order.redelivery]\n{line}", f"listeners.on_order.redelivery.{name}")
      for name, line in [("delay", "delay = inf"), ("delay", "delay = nan"),
                         ("max_delay", "max_delay = inf"), ("backoff", "backoff = 1e308"),
                         ("limit", "limit = 100001")]),
    ("shutdown_grace_period = inf", "shutdown_grace_period"),
    ("[brokers.main]\nconnect_timeout = inf", "brokers.main.connect_timeout"),
    ("[brokers.main]\nreceipt_timeout = nan", "brokers.main.receipt_timeout"),
])
def test_settings_that_would_hang_a_slot_or_loop_a_message_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, toml: str, setting: str,
) -> None:
    """``delay = inf`` would hold a pool slot for ever, and an endless timeout would wait for
    ever on a hung broker: both are refused."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "mdb.toml"
    config.write_text(toml + "\n")
    with pytest.raises(ConfigurationError, match=rf"setting {re.escape(setting)}"):
        load_settings(config)
