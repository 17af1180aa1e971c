"""``mdb deploy-files DIR MODULE [--app NAME] [--force]``: the deployment files of an
application, written for it into ``DIR`` (docs/deployment.md).

The files beside this module are their templates, shipped in mdb's wheel so that a user of a
``pip install`` has them: an image of the application (``Dockerfile``) and two deployments of
it, each a settings file, a compose file and Kubernetes manifests: ``rabbitmq/`` (at least
once) and ``exactly-once/`` (ActiveMQ with the reference config, ``activemq.xml`` of
``mdb_stomp``, and MariaDB). A template names what it is written for as ``{{app}}``
(the settings' ``app``), ``{{name}}`` (the app as Kubernetes and compose names take it),
``{{module}}`` and ``{{package}}`` (what ``mdb run`` runs, and what the image holds of the
project), ``{{version}}`` (mdb's, which the image installs), ``{{dockerfile}}`` and
``{{context}}`` (the image's file from the project's root, and that root from a compose
file's folder) and ``{{settings}}`` (a ConfigMap's copy of its ``mdb.toml``). The project's
root is the folder the command runs in, where ``mdb run MODULE`` finds the module.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import importlib.util
import os
import re
from collections.abc import Iterator
from importlib.resources.abc import Traversable
from pathlib import Path

from mdb.config.settings import Settings
from mdb.errors import ConfigurationError

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_KUBERNETES_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CONFIG_MAP = "kubernetes/configmap.yaml"


async def command(args: argparse.Namespace, settings: Settings) -> None:
    """``mdb deploy-files``: write the files, one line each."""
    for path in write(Path(args.directory), args.module, app=args.app, force=args.force):
        print(f"wrote {path}")


def write(directory: Path, module: str, *, app: str | None = None,
          force: bool = False) -> list[Path]:
    """Write the deployment files of ``module`` (run from the current folder) into
    ``directory``; return their paths. ``ConfigurationError``, and nothing written, for a
    module the current folder lacks, an app that makes no Kubernetes name, or a file that
    exists already unless ``force``."""
    package = module.split(".")[0]
    # Found as `mdb run` would import it, without importing it: its package's code is not run.
    place = Path(*module.split("."))
    if not (place.is_dir() or place.with_name(f"{place.name}.py").is_file()):
        raise ConfigurationError(
            f"mdb deploy-files: module {module}: no {place}/ or {place}.py in "
            f"{Path.cwd()}; run it from the project's root, where `mdb run {module}` finds it")
    app = app or package
    name = app.lower().replace("_", "-")
    if not _KUBERNETES_NAME.fullmatch(name):
        raise ConfigurationError(f"mdb deploy-files: app {app!r} makes no Kubernetes name "
                                 f"({name!r}); give --app a name of letters and digits")
    templates = list(_templates(importlib.resources.files(__name__), Path()))
    targets = [directory / relative for relative, _ in templates] + [_reference_config(directory)]
    existing = [path for path in targets if path.exists()]
    if existing and not force:
        raise ConfigurationError(
            f"mdb deploy-files: {existing[0]} exists"
            f"{f' (and {len(existing) - 1} more of its files)' if len(existing) > 1 else ''}; "
            "give --force to write over them")
    values = {"app": app, "name": name, "module": module,
              "package": package if Path(package).is_dir() else f"{package}.py",
              "version": importlib.metadata.version("mdb"),
              "dockerfile": os.path.relpath(directory / "Dockerfile")}
    rendered = {relative: _render(template.read_text(), values, relative, directory)
                for relative, template in templates}
    for relative, text in rendered.items():
        if relative.name == Path(_CONFIG_MAP).name:  # the settings of its deployment
            settings = rendered[relative.parent.parent / "mdb.toml"]
            rendered[relative] = text.replace("{{settings}}", _indented(settings))
    for relative, text in rendered.items():
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        (directory / relative).write_text(text)
    reference = _reference_config(directory)
    reference.write_bytes(_stomp_file("activemq.xml").read_bytes())
    return targets


def _templates(folder: Traversable, relative: Path) -> Iterator[tuple[Path, Traversable]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            if entry.name != "__pycache__":
                yield from _templates(entry, relative / entry.name)
        elif not entry.name.endswith((".py", ".pyc")):
            yield relative / entry.name, entry


def _render(text: str, values: dict[str, str], relative: Path, directory: Path) -> str:
    # A compose file builds the image from the project's root, its context.
    values = {**values, "context": os.path.relpath(Path.cwd(), directory / relative.parent)}
    return _PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), text)


def _indented(text: str) -> str:
    return "\n".join(f"    {line}" if line else "" for line in text.splitlines())


def _reference_config(directory: Path) -> Path:
    """Where the exactly-once deployment's broker image takes the reference config from."""
    return directory / "exactly-once" / "activemq.xml"


def _stomp_file(name: str) -> Path:
    """A file of the STOMP adapter's package, found without importing it (which needs
    stomp.py, ``mdb[stomp]``)."""
    spec = importlib.util.find_spec("mdb_stomp")
    assert spec is not None and spec.origin is not None  # it is installed with mdb
    return Path(spec.origin).with_name(name)
