"""``mdb migrate weblogic INPUT... [--out DIR] [--module NAME] [--app NAME]``: read, map,
check, then write the three files at once.

Nothing is written until everything was read and mapped, the settings written load as
``mdb run`` would load them (``mdb.load_settings``), each listener is one the ``@listener``
decorator takes with its settings. The files are written beside
their final names and linked into place, none over an existing file; if one cannot be,
those already in place are removed again: nothing is written half.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from mdb import ConfigurationError, Settings, listener, load_settings
from mdb.commands.migrate import reading
from mdb.commands.migrate.descriptors import inputs
from mdb.commands.migrate.mapping.bean_mapping import MigratedListener
from mdb.commands.migrate.mapping.listeners import map_beans
from mdb.commands.migrate.mapping.migrated_topology import build
from mdb.commands.migrate.mapping.weblogic_names import snake
from mdb.commands.migrate.writers import module_writer, report_writer, toml_writer
from mdb.observability.redaction import printable

CONFIG = "mdb.toml"
REPORT = "migration-report.md"


async def weblogic(args: argparse.Namespace, settings: Settings) -> int:
    """The command: 0 once the files are written; ConfigurationError (exit 2) otherwise."""
    print(migrate(args.inputs, args.out, module=args.module, app=args.app))
    return 0


def migrate(paths: Sequence[Path], out: Path, *, module: str = "listeners",
            app: str | None = None) -> str:
    """Read ``paths``, write the settings, the module ``module`` and the report in ``out``;
    what was written, in a line. ConfigurationError, with nothing written, for input that
    cannot be migrated (one line naming the file, the element and the fix)."""
    source = f"{module}.py"
    if not out.is_dir():
        raise ConfigurationError(f"--out {printable(str(out))}: no such folder; create it")
    names = [CONFIG, source, REPORT]
    present = [name for name in names if (out / name).exists()]
    if present:
        raise ConfigurationError(
            f"{printable(str(out))} already has {', '.join(present)}: mdb migrate writes over "
            "nothing (a ported handler would be lost); move it away, or give another --out")
    read = reading.read(inputs.read(paths))
    topology = build(read)
    made = map_beans(read, topology)
    if read.report.unsettled:
        first = read.report.unsettled[0]
        raise ConfigurationError(printable(
            f"{first.file}: <{first.element}> was read and given no outcome: a fault of mdb "
            "migrate, please report it with the element"))
    shown = ", ".join(printable(str(p)) for p in paths)
    texts = {
        CONFIG: toml_writer.render(app or snake(Path(paths[0]).stem, "app"), shown, topology,
                                   made, REPORT),
        source: module_writer.render(shown, made, CONFIG),
        REPORT: report_writer.render(read.read, read.report, made, topology, names, source,
                                     CONFIG),
    }
    _write_checked(out, texts, made)
    became, none = read.report.counts()
    return (f"mdb migrate: wrote {', '.join(names)} in {printable(str(out))}: {len(made)} "
            f"listener{'s' * (len(made) != 1)} on {len(topology.brokers)} "
            f"broker{'s' * (len(topology.brokers) != 1)}; of the elements and properties read, "
            f"{became} became mdb settings, {none} have no equivalent (each with why, in "
            f"{REPORT}). Next: set the brokers' url in {CONFIG}, port the handlers, check the "
            f"plan with `mdb subscriptions {module} --config {CONFIG} --server NAME`")


def _probe(body: bytes) -> None:
    """What each migrated listener's options are tried on: the decorator checks them."""


def _write_checked(out: Path, texts: Mapping[str, str], made: list[MigratedListener]) -> None:
    with tempfile.TemporaryDirectory(prefix=".mdb-migrate-", dir=out) as scratch:
        for name, text in texts.items():
            (Path(scratch) / name).write_text(text, encoding="utf-8")
        _check(Path(scratch) / CONFIG, made)
        linked: list[Path] = []
        try:
            for name in texts:
                os.link(Path(scratch) / name, out / name)
                linked.append(out / name)
        except OSError as exc:
            for path in linked:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise ConfigurationError(f"{printable(str(out))}: cannot write "
                                     f"{printable(exc.filename or '')} "
                                     f"({exc.strerror or exc}); nothing was written") from None


def _check(config: Path, made: list[MigratedListener]) -> None:
    """What was made is what mdb takes: the settings load, and each listener's options pass
    the decorator."""
    try:
        settings = load_settings(config)
        for item in made:
            override = settings.listeners.get(item.name)
            options = {} if override is None else override.model_dump(exclude_unset=True)
            listener(item.destination, name=item.name, **options)(_probe)
    except ConfigurationError as exc:
        raise ConfigurationError(f"the settings mdb migrate made do not load ({exc}): a fault "
                                 "of mdb migrate, please report it; nothing was written") from None
