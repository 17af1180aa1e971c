"""The public error tree: every error mdb raises can be caught by importing it from ``mdb``,
and the tree drawn in ``mdb/errors.py`` names every class of it."""

from __future__ import annotations

import inspect

import mdb
from mdb import errors


def _error_classes() -> dict[str, type[BaseException]]:
    return {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, BaseException)
            and cls.__module__ == errors.__name__}


def test_every_error_class_is_exported_from_mdb() -> None:
    missing = sorted(set(_error_classes()) - set(mdb.__all__))
    assert not missing, f"add to mdb.__all__ (mdb/__init__.py): {missing}"
    for name, cls in _error_classes().items():
        assert getattr(mdb, name) is cls


def test_every_error_class_is_under_the_root_and_drawn_in_the_tree() -> None:
    tree = errors.__doc__ or ""
    for name, cls in _error_classes().items():
        assert issubclass(cls, errors.MdbError), name
        assert f" {name} " in tree or f"    {name}\n" in tree, f"{name} is not in the tree"
