"""``mdb migrate weblogic``: an application's message-driven beans as mdb listeners.

It reads an application's descriptors (an ``.ear`` or ``.jar``, a folder, or the files:
``ejb-jar.xml``, ``weblogic-ejb-jar.xml``), the ``@MessageDriven`` annotations of its Java
sources, its WebLogic JMS modules (``*-jms.xml``) and its domain's ``config.xml``, and writes
the mdb settings (``mdb.toml``: brokers, destinations and their members, one
``[listeners.NAME]`` table per bean), a Python module of ``@listener`` stubs, and a report of
every element and property read: the setting it became, or why there is none and what to do
instead. Standard Jakarta EE descriptors alone (another server's application) are read the
same way. The mapping, element by element: docs/migrating-from-weblogic.md.

The modules, by concern: at the top, what is read (``model``, ``bean``, ``application``,
``reading``) and the command (``command``); ``descriptors``: the inputs (archives, folders,
files), safe XML and the walk of a descriptor against its table, and one reader per format;
``mapping``: names, the topology and the listeners; ``writers``: the settings, the module
of stubs, the report and the docs' mapping table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mdb.config.settings import Settings


def _module_name(text: str) -> str:
    if not text.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python module name")
    return text


async def _weblogic(args: argparse.Namespace, settings: Settings) -> int:
    """``mdb migrate weblogic``, whose readers of archives, descriptors and Java are
    imported by it alone: every other command starts without them."""
    from mdb.commands.migrate.command import weblogic

    return await weblogic(args, settings)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``migrate`` to the ``mdb`` command's subparsers ``sub``."""
    migrate = sub.add_parser("migrate", help="turn an application's message-driven beans into "
                                             "mdb listeners")
    kinds = migrate.add_subparsers(required=True, metavar="FROM")
    p = kinds.add_parser(
        "weblogic", help="from WebLogic (or Jakarta EE) descriptors and annotations",
        epilog="Writes mdb.toml, MODULE.py and migration-report.md in DIR, over nothing; "
               "the mapping: docs/migrating-from-weblogic.md.")
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT",
                   help="an .ear, .jar or .war, a folder (exploded archive, sources, the "
                        "domain), or a descriptor (ejb-jar.xml, weblogic-ejb-jar.xml, "
                        "*-jms.xml, config.xml) or Java source")
    p.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                   help="where to write (default: the current folder)")
    p.add_argument("--module", type=_module_name, default="listeners", metavar="NAME",
                   help="the Python module of the listeners' stubs (default: listeners)")
    p.add_argument("--app", help="the app's name, setting app (default: the first input's "
                                 "name in snake case)")
    p.set_defaults(command=_weblogic, config=None, server=None)
