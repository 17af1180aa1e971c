"""@listener: options validated at decoration time, the function left unchanged."""

from __future__ import annotations

import functools

import pytest
from dependency_injector import containers, providers
from dependency_injector.wiring import Provide
from pydantic import BaseModel

from mdb import Context, Distribution, ListenerDefinitionError, Redelivery, listener
from mdb.errors import ConfigurationError
from mdb.listeners.listener import spec_of
from mdb.listeners.options import ListenerOverrides
from mdb.messages.destinations import Destination, Kind
from tests.harness.apps.in_process import specs


class Order(BaseModel):
    id: str


class Services(containers.DeclarativeContainer):
    thing = providers.Object("thing")


def test_the_decorator_records_a_spec_and_returns_the_function_unchanged() -> None:
    async def on_order(order: Order, ctx: Context, thing: str = Provide[Services.thing]) -> None:
        pass

    decorated = listener("topic:orders", pool=16, name="orders_in")(on_order)

    assert decorated is on_order
    [spec] = specs(on_order)
    assert spec.name == "orders_in"
    assert spec.destination == Destination(Kind.TOPIC, "orders")
    assert spec.options.pool == 16
    assert spec.options.distribution is Distribution.ONE_COPY_PER_APP
    assert spec.body_parameter == "order" and spec.body_type is Order
    assert spec.context_parameter == "ctx"
    assert spec.is_async
    assert str(spec.error_destination) == "queue:orders.DLQ"


def test_a_plain_function_without_annotations_gets_bytes() -> None:
    @listener("queue:raw")
    def on_raw(body):  # type: ignore[no-untyped-def]
        pass

    spec = spec_of(on_raw)
    assert spec is not None and spec.body_type is bytes and not spec.is_async


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"pool": 0}, "pool"),
        ({"pool": "many"}, "pool"),
        ({"distribution": "everywhere"}, "distribution"),
        ({"redelivery": {"limit": -1}}, "redelivery.limit"),
        ({"redelivery": {"backoff": 0.5}}, "redelivery.backoff"),
        ({"error_destination": "errors"}, "error_destination"),
        ({"subscription": "has space"}, "subscription"),
        ({"max_messages_per_transaction": 0}, "max_messages_per_transaction"),
        ({"max_messages_per_transaction": 1001}, "max_messages_per_transaction"),
        ({"prefetch": 0}, "prefetch"),
        ({"prefetch": 1001}, "prefetch"),
        ({"redelivery": {"delay": float("inf")}}, "redelivery.delay"),
        ({"redelivery": {"delay": float("nan")}}, "redelivery.delay"),
        ({"redelivery": {"delay": 86_401}}, "redelivery.delay"),
        ({"redelivery": {"max_delay": float("inf")}}, "redelivery.max_delay"),
        ({"redelivery": {"backoff": 1e308}}, "redelivery.backoff"),
        ({"redelivery": {"backoff": float("nan")}}, "redelivery.backoff"),
        ({"redelivery": {"limit": 10**20}}, "redelivery.limit"),
        ({"redelivery": {"limit": 1e20}}, "redelivery.limit"),
    ],
)
def test_an_invalid_option_fails_at_decoration_naming_it(kwargs: dict[str, object],
                                                         named: str) -> None:
    with pytest.raises(ListenerDefinitionError, match=f"@listener option {named}"):
        listener("queue:orders", **kwargs)  # type: ignore[arg-type]


def test_a_bad_destination_says_how_to_write_one() -> None:
    with pytest.raises(ListenerDefinitionError, match="'queue:NAME' or 'topic:NAME'"):
        listener("orders")


def test_one_copy_per_server_on_a_queue_is_refused() -> None:
    with pytest.raises(ListenerDefinitionError, match="applies to topics"):
        listener("queue:orders", distribution=Distribution.ONE_COPY_PER_SERVER)


def test_deleting_subscriptions_on_stop_needs_a_subscription_of_this_server() -> None:
    with pytest.raises(ListenerDefinitionError, match="under the app's other processes"):
        listener("topic:quotes", durable_subscription_deletion=True)
    with pytest.raises(ListenerDefinitionError, match="durable_subscription_deletion"):
        listener("queue:quotes", durable_subscription_deletion=True)
    listener("topic:quotes", distribution=Distribution.ONE_COPY_PER_SERVER,
             durable_subscription_deletion=True)


def test_batches_need_a_transaction_in_code_and_in_settings() -> None:
    with pytest.raises(ListenerDefinitionError, match="max_messages_per_transaction"):
        listener("queue:orders", transacted=False, max_messages_per_transaction=10)

    @listener("queue:orders", transacted=False)
    def on_order(body: bytes) -> None:
        pass

    [spec] = specs(on_order)
    with pytest.raises(ConfigurationError, match=r"'on_order'.*max_messages_per_transaction"):
        spec.with_settings(
            ListenerOverrides.model_validate({"max_messages_per_transaction": 10}), None)

    @listener("queue:orders", max_messages_per_transaction=1000)
    def on_batch(body: bytes) -> None:
        pass

    assert spec_of(on_batch).options.max_messages_per_transaction == 1000  # type: ignore[union-attr]


def test_a_parameter_that_is_neither_body_context_nor_dependency_is_refused() -> None:
    with pytest.raises(ListenerDefinitionError, match="'other'"):
        @listener("queue:orders")
        def handler(body: bytes, other: int) -> None:
            pass


def test_a_listener_name_must_be_an_identifier() -> None:
    with pytest.raises(ListenerDefinitionError, match="'name'"):
        listener("queue:orders", name="not valid")(lambda body: None)


def test_settings_override_code_which_overrides_setting_defaults() -> None:
    @listener("queue:orders", pool=4, redelivery=Redelivery(limit=3, delay=0.1))
    def on_order(body: bytes) -> None:
        pass

    [spec] = specs(on_order)
    configured = spec.with_settings(
        ListenerOverrides.model_validate({"pool": 2, "selector": "region = 'eu'"}),
        ListenerOverrides.model_validate({"redelivery": {"limit": 7}}),
    )
    assert configured.options.pool == 4  # the code beats the defaults
    assert configured.options.selector == "region = 'eu'"  # a default fills what code left
    assert configured.options.redelivery.limit == 7  # the listener's override beats the code
    assert configured.options.redelivery.delay == 0.1  # ...and keeps what it does not name


def test_an_invalid_override_names_the_setting() -> None:
    @listener("queue:orders")
    def on_order(body: bytes) -> None:
        pass

    [spec] = specs(on_order)
    with pytest.raises(ConfigurationError, match=r"listeners\.on_order\.pool"):
        spec.with_settings(ListenerOverrides(), ListenerOverrides.model_validate({"pool": 0}))


def _generator(body: bytes):  # type: ignore[no-untyped-def]
    yield body


async def _async_generator(body: bytes):  # type: ignore[no-untyped-def]
    yield body


async def _handler(body: bytes) -> None:
    pass


class _Callable:
    def __call__(self, body: bytes) -> None:
        pass

    async def method(self, body: bytes) -> None:
        pass


@pytest.mark.parametrize(("handler", "says"), [
    (_generator, "generator"),
    (_async_generator, "async generator"),
    (_Callable(), "instance of _Callable"),
    (_Callable().method, "bound method"),
    (functools.partial(_handler), "functools.partial"),
    (staticmethod(_handler), "staticmethod"),
    (classmethod(_handler), "classmethod"),  # type: ignore[arg-type]
    (_Callable, "class"),
    (print, "built-in"),
])
def test_a_handler_shape_that_cannot_work_is_refused_at_declaration(handler: object,
                                                                    says: str) -> None:
    """A generator's body would never run while every message was acked; a callable instance
    would crash startup: both are refused when decorated."""
    with pytest.raises(ListenerDefinitionError, match=f"{says}.*def or async def"):
        listener("queue:orders", name="on_order")(handler)  # type: ignore[type-var]


def test_a_coroutine_object_is_refused_as_a_call_not_a_function() -> None:
    coroutine = _handler(b"")
    try:
        with pytest.raises(ListenerDefinitionError, match=r"coroutine object.*without calling"):
            listener("queue:orders", name="on_order")(coroutine)  # type: ignore[type-var,unused-coroutine]
    finally:
        coroutine.close()


def test_a_lambda_is_a_function_and_needs_a_name() -> None:
    handler = listener("queue:orders", name="on_order")(lambda body: None)
    spec = spec_of(handler)
    assert spec is not None and spec.name == "on_order" and spec.body_parameter == "body"
    with pytest.raises(ListenerDefinitionError, match="identifier"):
        listener("queue:orders")(lambda body: None)
