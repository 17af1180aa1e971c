"""What a test runs: the listeners given to ``Runner.run`` and the overrides of the
application's dependency-injector container."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import ModuleType
from typing import Any

from dependency_injector import containers, providers

from mdb.container.wiring import find_listeners, import_modules
from mdb.errors import ConfigurationError
from mdb.listeners.listener import ListenerSpec, spec_of

Listeners = str | ModuleType | Callable[..., Any] | Sequence["Listeners"]
"""What ``Runner.run`` takes: module names, modules, ``@listener`` functions, lists of them."""


def listeners_of(given: Iterable[Listeners]) -> tuple[list[ModuleType], list[ListenerSpec]]:
    """The modules (to wire, and where the application's container is found) and the
    listeners of ``given``: module names, modules, @listener functions, lists of them."""
    modules: list[ModuleType] = []
    specs: dict[int, ListenerSpec] = {}  # by identity, as find_listeners

    def add_module(module: ModuleType, with_listeners: bool) -> None:
        if module not in modules:
            modules.append(module)
        if with_listeners:
            for spec in find_listeners([module]):
                specs.setdefault(id(spec), spec)

    def add(item: Listeners) -> None:
        if isinstance(item, str):
            add_module(import_modules([item])[0], True)
        elif isinstance(item, ModuleType):
            add_module(item, True)
        elif callable(item):
            spec = spec_of(item)
            if spec is None:
                raise ConfigurationError(f"{item!r} is not a @listener function")
            add_module(sys.modules[item.__module__], False)
            specs.setdefault(id(spec), spec)
        else:
            for each in item:
                add(each)

    for item in given:
        add(item)
    if not specs:
        raise ConfigurationError("run: no listeners given")
    return modules, list(specs.values())


def override(di: containers.Container | None, overrides: Mapping[str, object],
             stack: AsyncExitStack) -> None:
    """Replace ``di``'s providers named in ``overrides`` (by a value, or a provider) until
    ``stack`` closes; ``ConfigurationError`` for no container or an unknown name."""
    if di is None:
        raise ConfigurationError("overrides given, but the application has no "
                                 "dependency-injector container (pass services=...)")
    for name, value in overrides.items():
        provider = getattr(di, name, None)
        if not isinstance(provider, providers.Provider):
            raise ConfigurationError(f"overrides: the container has no provider {name!r}")
        replacement = value if isinstance(value, providers.Provider) else providers.Object(value)
        provider.override(replacement)
        stack.callback(provider.reset_last_overriding)
