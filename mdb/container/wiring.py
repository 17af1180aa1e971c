"""Finding the application: its listener modules, its listeners, and its dependency-injector
container, whose resources live exactly as long as the handlers may run."""

from __future__ import annotations

import importlib
import inspect
import sys
import traceback
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from dependency_injector import containers

from mdb.errors import ConfigurationError
from mdb.listeners.events import ON_EVENT_ATTRIBUTE, Callback
from mdb.listeners.listener import ListenerSpec, spec_of


def import_modules(names: Sequence[str]) -> list[ModuleType]:
    """Import the listener modules, from the current directory too (like ``python -m``)."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            raise ConfigurationError(
                f"cannot import listener module {name!r}: {exc}; give a dotted module name "
                "importable from the current directory, e.g. examples.orders.listeners"
            ) from None
        except Exception as exc:  # the application's code: one line, not a traceback
            raise ConfigurationError(
                f"listener module {name!r} raised at import: {_where(exc)}"
                f"{type(exc).__name__}: {exc}"
            ) from None
    return modules


def _where(exc: BaseException) -> str:
    """``FILE, line N: `` of the application's deepest frame in ``exc``'s traceback (the
    interpreter's and installed libraries' frames are skipped); empty when there is none."""
    library = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(library) and not f.filename.startswith("<frozen")]
    return f"{frames[-1].filename}, line {frames[-1].lineno}: " if frames else ""


def find_listeners(modules: Sequence[ModuleType]) -> list[ListenerSpec]:
    """Every ``@listener`` function defined at the top level of ``modules``, in order, each
    once (a listener a module imports from another is the same spec)."""
    # By identity, in a dict: a search of the list compared each spec with every earlier one.
    found: dict[int, ListenerSpec] = {}
    for module in modules:
        for value in vars(module).values():
            spec = spec_of(value)
            if spec is not None:
                found.setdefault(id(spec), spec)
    if not found:
        raise ConfigurationError(
            f"no @listener functions in {', '.join(m.__name__ for m in modules)}"
        )
    return list(found.values())


def find_event_callbacks(modules: Sequence[ModuleType]) -> list[Callback]:
    """Every ``@on_event`` function defined at the top level of ``modules``, in order."""
    found: list[Callback] = []
    for module in modules:
        for value in vars(module).values():
            if getattr(value, ON_EVENT_ATTRIBUTE, False) and value not in found:
                found.append(value)
    return found


def find_container(
    path: str | None, modules: Sequence[ModuleType]
) -> containers.Container | None:
    """The application's container: ``path`` (``module:Attribute``) when given, else the one
    DeclarativeContainer class or instance the listener modules import, else None."""
    if path is not None:
        module_name, _, attribute = path.partition(":")
        try:
            found: Any = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(
                f"setting container: cannot load {path!r} ({exc}); write it 'module:Attribute'"
            ) from None
        return _instance(found, f"setting container: {path!r}")
    candidates = {
        id(value): value
        for module in modules
        for value in vars(module).values()
        if _is_container(value)
    }
    if len(candidates) > 1:
        raise ConfigurationError(
            "the listener modules import several dependency-injector containers; choose one "
            "with --container module:Attribute"
        )
    return _instance(next(iter(candidates.values())), "container") if candidates else None


@asynccontextmanager
async def wired(
    container: containers.Container | None, modules: Sequence[ModuleType],
    listeners: Sequence[ListenerSpec],
) -> AsyncIterator[list[ListenerSpec]]:
    """Wire ``modules`` and yield the listeners with their injecting handlers; unwire on exit.
    The container's resources are ``resources``'s."""
    if container is None:
        yield list(listeners)
        return
    container.wire(modules=list(modules))
    try:
        yield [_injecting(spec, modules) for spec in listeners]
    finally:
        container.unwire()


@asynccontextmanager
async def resources(container: containers.Container | None) -> AsyncIterator[None]:
    """Initialise the container's resources; shut them down on exit. Enter it once the
    subscriptions exist (``Container.run``'s ``before_handlers``): what a resource sends at
    start-up to a topic its own application listens on is then kept for it."""
    if container is None:
        yield
        return
    await _maybe_await(container.init_resources())
    try:
        yield
    finally:
        await _maybe_await(container.shutdown_resources())


def _injecting(spec: ListenerSpec, modules: Sequence[ModuleType]) -> ListenerSpec:
    # wire() replaces each module attribute using Provide[...] with an injecting wrapper that
    # keeps the original's attributes, our spec included.
    for module in modules:
        replaced = getattr(module, spec.handler.__name__, None)
        if replaced is not None and replaced is not spec.handler and spec_of(replaced) is spec:
            return replace(spec, handler=replaced)
    return spec


def _is_container(value: object) -> bool:
    if inspect.isclass(value):
        return (issubclass(value, containers.DeclarativeContainer)
                and value is not containers.DeclarativeContainer)
    return isinstance(value, containers.Container)


def _instance(value: object, where: str) -> containers.Container:
    if inspect.isclass(value) and issubclass(value, containers.DeclarativeContainer):
        return value()
    if isinstance(value, containers.Container):
        return value
    raise ConfigurationError(f"{where} is not a dependency-injector container")


async def _maybe_await(result: object) -> None:
    if inspect.isawaitable(result):
        await result
