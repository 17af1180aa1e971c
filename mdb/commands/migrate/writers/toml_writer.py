"""The mdb settings file a migration writes: brokers, destinations and one
``[listeners.NAME]`` table per bean, each value with a comment saying what it came from.
Values are written by ``toml_values``; comments are made printable, so no input can end a
line of the file.
"""

from __future__ import annotations

from collections.abc import Sequence

from mdb.commands.migrate.mapping.bean_mapping import MigratedListener
from mdb.commands.migrate.mapping.migrated_topology import MigratedTopology
from mdb.commands.migrate.writers.toml_values import string, value
from mdb.observability.redaction import printable


def _comment(text: str) -> str:
    return "# " + printable(text)


def _line(key: str, item: object, origin: str | None) -> str:
    written = f"{key} = {value(item)}"
    return f"{written}  {_comment(origin)}" if origin else written


def render(app: str, inputs: str, topology: MigratedTopology, listeners: Sequence[MigratedListener],
           report_file: str) -> str:
    lines = [_comment(f"mdb settings written by `mdb migrate weblogic` from {inputs}."),
             _comment(f"What each came from, and what has no equivalent: {report_file}."),
             _comment("Every setting: docs/configuration.md; the mapping: "
                      "docs/migrating-from-weblogic.md."),
             f"app = {string(app)}", ""]
    for broker in topology.brokers.values():
        lines += [f"[brokers.{broker.name}]", _comment(broker.about),
                  f"url = {string(broker.url)}",
                  _comment("the broker's login: username = \"...\" and password_file = "
                           "\"/run/secrets/...\" (docs/activemq.md)")]
        lines += [_line(k, v, broker.origins.get(k)) for k, v in broker.values.items()]
        lines.append("")
    for place in sorted(topology.places.values(), key=lambda p: p.key):
        lines += [f"[destinations.{string(place.key)}]", _comment(place.about)]
        if len(place.members) == 1 and place.members[0][1] is None:
            lines.append(f"broker = {string(place.members[0][0])}")
        else:
            lines.append("members = " + value([
                {"broker": broker, **({"name": name} if name else {})}
                for broker, name in place.members]))
        lines.append("")
    for listener in listeners:
        lines += [f"[listeners.{listener.name}]", _comment(listener.about)]
        nested = {k: v for k, v in listener.values.items() if isinstance(v, dict)}
        lines += [_line(k, v, listener.origins.get(k))
                  for k, v in listener.values.items() if k not in nested]
        for key, table in nested.items():
            lines.append(f"[listeners.{listener.name}.{key}]")
            lines += [_line(k, v, listener.origins.get(f"{key}.{k}")) for k, v in table.items()]
        lines.append("")
    return "\n".join(lines)
