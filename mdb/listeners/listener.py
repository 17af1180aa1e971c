"""``@listener``: declare that a function handles the messages of a destination.

The decorator validates its options, records a frozen ``ListenerSpec`` on the function and
returns the function unchanged, so a handler stays a plain function to call in a unit test.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pydantic import ValidationError

from mdb.errors import ConfigurationError, ListenerDefinitionError
from mdb.listeners.context import Context
from mdb.listeners.options import Distribution, ListenerOptions, ListenerOverrides, Redelivery
from mdb.messages.destinations import Destination, Kind

F = TypeVar("F", bound=Callable[..., Any])

SPEC_ATTRIBUTE = "__mdb_listener__"


@dataclass(frozen=True)
class ListenerSpec:
    """Everything the container needs to know about one listener."""

    name: str
    destination: Destination
    options: ListenerOptions
    handler: Callable[..., Any]
    body_type: Any
    """The annotation of the body parameter (``bytes`` when there is none or no body parameter)."""
    body_parameter: str | None
    context_parameter: str | None
    session_parameter: str | None = None
    """The parameter annotated ``AsyncSession`` (SQLAlchemy): the session of an exactly-once
    listener's database transaction (docs/exactly-once.md)."""

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.handler)

    @property
    def error_destination(self) -> Destination:
        """Where messages go that failed too often or do not decode (default ``queue:NAME.DLQ``)."""
        named = self.options.error_destination
        return self.destination.error_queue if named is None else Destination.parse(named)

    def with_settings(
        self, defaults: ListenerOverrides, override: ListenerOverrides | None
    ) -> ListenerSpec:
        """Apply settings: an override for this listener beats the decorator's explicit
        arguments, which beat the settings' defaults, which beat the built-in defaults."""
        merged: dict[str, Any] = {}
        layers: list[Mapping[str, Any]] = [
            defaults.model_dump(exclude_unset=True),
            self.options.model_dump(exclude_unset=True),
        ]
        if override is not None:
            layers.append(override.model_dump(exclude_unset=True))
        for layer in layers:
            _deep_merge(merged, layer)
        try:
            options = ListenerOptions.model_validate(merged)
        except ValidationError as exc:
            raise ConfigurationError(
                _describe(exc, f"settings for listener {self.name!r}: listeners.{self.name}.")
            ) from None
        _check_combination(self.destination, options, f"settings for listener {self.name!r}")
        return replace(self, options=options)


def listener(
    destination: str,
    *,
    distribution: Distribution | str | None = None,
    pool: int | None = None,
    transacted: bool | None = None,
    selector: str | None = None,
    redelivery: Redelivery | Mapping[str, Any] | None = None,
    error_destination: str | None = None,
    durable: bool | None = None,
    subscription: str | None = None,
    durable_subscription_deletion: bool | None = None,
    max_messages_per_transaction: int | None = None,
    prefetch: int | None = None,
    handler_timeout: float | None = None,
    exactly_once: str | None = None,
    paused: bool | None = None,
    name: str | None = None,
) -> Callable[[F], F]:
    """Make the decorated function (``def`` or ``async def``) the handler of ``destination``.

    The handler's parameters: one body parameter whose annotation chooses the decoding
    (``bytes``, ``str``, ``dict``/``list`` for JSON, a pydantic model), optionally one parameter
    annotated ``Context``, one annotated SQLAlchemy's ``AsyncSession`` (with ``exactly_once``),
    and any dependencies marked with dependency-injector's ``Provide``.

    Every keyword but ``name`` is an option declared, with its bounds, default and meaning, in
    ``mdb.listeners.options.ListenerOptions`` (listed in docs/configuration.md). An option left
    ``None`` is not given: the settings' ``defaults`` or else its declared default apply.
    """
    given = _given(locals())  # first: locals() are still just the parameters
    try:
        dest = Destination.parse(destination)
    except ConfigurationError as exc:
        raise ListenerDefinitionError(f"@listener: {exc}") from None
    try:
        options = ListenerOptions.model_validate(given)
    except ValidationError as exc:
        raise ListenerDefinitionError(_describe(exc, "@listener option ")) from None
    try:
        _check_combination(dest, options, "@listener")
    except ConfigurationError as exc:
        raise ListenerDefinitionError(str(exc)) from None

    def decorate(func: F) -> F:
        refused = _not_a_handler(func)
        if refused:
            raise ListenerDefinitionError(f"@listener({destination!r}): {refused}")
        listener_name = name or func.__name__
        if not listener_name.isidentifier():
            raise ListenerDefinitionError(
                f"@listener option 'name': {listener_name!r} must be a Python identifier "
                "(it is a key in settings and environment variables)"
            )
        body_parameter, body_type, context_parameter, session_parameter = _inspect_handler(
            func, listener_name)
        setattr(func, SPEC_ATTRIBUTE, ListenerSpec(
            name=listener_name, destination=dest, options=options, handler=func,
            body_type=body_type, body_parameter=body_parameter,
            context_parameter=context_parameter, session_parameter=session_parameter,
        ))
        return func

    return decorate


def _given(arguments: Mapping[str, object]) -> dict[str, object]:
    """The options among ``listener``'s ``arguments`` that were given. Its keyword parameters
    are the fields of ``ListenerOptions`` (tests/unit/test_options.py keeps them so), so they
    are read by those names rather than listed once more."""
    return {key: value for key, value in arguments.items()
            if key in ListenerOptions.model_fields and value is not None}


def spec_of(obj: object) -> ListenerSpec | None:
    """The spec recorded by ``@listener`` on ``obj``, if any."""
    spec = getattr(obj, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, ListenerSpec) else None


def _check_combination(dest: Destination, options: ListenerOptions, where: str) -> None:
    if dest.kind is Kind.QUEUE and options.distribution is Distribution.ONE_COPY_PER_SERVER:
        raise ConfigurationError(
            f"{where}: distribution 'one-copy-per-server' applies to topics; a queue delivers "
            f"each message once ({dest}): use a topic or drop the option"
        )
    if dest.kind is Kind.QUEUE and options.subscription is not None:
        raise ConfigurationError(
            f"{where}: option 'subscription' names a topic subscription; {dest} is a queue"
        )
    if options.durable_subscription_deletion and (
        dest.kind is Kind.QUEUE or options.distribution is Distribution.ONE_COPY_PER_APP
    ):
        raise ConfigurationError(
            f"{where}: option 'durable_subscription_deletion' deletes this process's own topic "
            f"subscriptions when it stops; {dest} with {options.distribution} has none (a "
            "shared subscription would be deleted under the app's other processes): use "
            "one-copy-per-server or drop the option"
        )
    if not options.transacted and options.max_messages_per_transaction > 1:
        raise ConfigurationError(
            f"{where}: option 'max_messages_per_transaction' groups messages in a transaction; "
            f"a listener with transacted=False has none: drop one of the two options"
        )


_PLAIN = "a handler is a plain function (def or async def)"


def _not_a_handler(obj: object) -> str | None:
    """Why ``obj`` cannot be a handler, or None when it is a function (``def``, ``async def``
    or a lambda). Only functions are supported: the spec is recorded on the handler itself and
    the container finds it among its module's attributes, which rules out methods (they take
    no attribute), callable instances, partials and the like — write a function that calls
    them. A generator's body would never run (calling it only makes the generator), so it is
    refused rather than every message acknowledged unprocessed."""
    if inspect.isasyncgenfunction(obj) or inspect.isgeneratorfunction(obj):
        kind = "an async generator" if inspect.isasyncgenfunction(obj) else "a generator"
        return (f"{obj.__qualname__} is {kind} function: calling it never runs its body, so "
                f"every message would be acknowledged unprocessed; {_PLAIN} that returns, not "
                "yields")
    if inspect.isfunction(obj):
        return None
    if inspect.iscoroutine(obj):
        return (f"got a coroutine object ({obj.__qualname__}(...) was called): decorate the "
                "async def function itself, without calling it")
    kind = (
        "a bound method" if inspect.ismethod(obj)
        else "a functools.partial" if isinstance(obj, functools.partial)
        else f"a {type(obj).__name__} object" if isinstance(obj, staticmethod | classmethod)
        else f"a class ({obj.__qualname__})" if inspect.isclass(obj)
        else "a built-in function" if inspect.isbuiltin(obj)
        else f"an instance of {type(obj).__qualname__}" if callable(obj)
        else f"not callable (a {type(obj).__name__})"
    )
    return f"got {kind}: {_PLAIN}; to use another callable, write a function that calls it"


def _inspect_handler(func: Callable[..., Any], name: str,
                     ) -> tuple[str | None, Any, str | None, str | None]:
    try:
        hints = typing.get_type_hints(func)
    except Exception as exc:  # unresolvable annotations are the user's code: report, don't crash
        raise ListenerDefinitionError(
            f"listener {name!r}: cannot resolve the handler's annotations: {exc}"
        ) from None
    body: str | None = None
    context: str | None = None
    session: str | None = None
    for param in inspect.signature(func).parameters.values():
        annotation = hints.get(param.name, bytes)
        if annotation is Context:
            context = param.name
        elif _is_session(annotation):
            session = param.name
        elif _is_injected(param.default):
            continue
        elif body is None and param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            body = param.name
        elif param.default is param.empty and param.kind not in (param.VAR_POSITIONAL,
                                                                  param.VAR_KEYWORD):
            raise ListenerDefinitionError(
                f"listener {name!r}: parameter {param.name!r} is neither the body, the Context, "
                "an AsyncSession nor a dependency marked Provide[...]: give it a default or "
                "remove it"
            )
    body_type = hints.get(body, bytes) if body else bytes
    return body, body_type, context, session


def _is_session(annotation: object) -> bool:
    """SQLAlchemy's ``AsyncSession`` (or a subclass), told without importing SQLAlchemy."""
    return isinstance(annotation, type) and any(
        f"{k.__module__}.{k.__qualname__}" == "sqlalchemy.ext.asyncio.session.AsyncSession"
        for k in annotation.__mro__)


def _is_injected(default: object) -> bool:
    return type(default).__module__.startswith("dependency_injector")


def _deep_merge(target: dict[str, Any], layer: Mapping[str, Any]) -> None:
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = dict(value) if isinstance(value, Mapping) else value


def _describe(exc: ValidationError, prefix: str) -> str:
    return "; ".join(
        f"{prefix}{'.'.join(str(p) for p in err['loc'])!s}: {err['msg']}"
        + (f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict)
           else "")
        for err in exc.errors()
    )
