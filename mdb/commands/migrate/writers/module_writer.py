"""The Python module a migration writes: one ``@listener`` stub per bean, named after it,
on its destination, with the class whose ``onMessage`` to port in a comment above it.

A stub raises until it is ported, so a message that reaches it is redelivered and then moved
to the error destination, never acknowledged unprocessed. Its options live in the settings
file's ``[listeners.NAME]`` table, where WebLogic kept them in a descriptor. Whatever came
from the input is written into comments made printable, or as Python literals (``repr``), so
no input can become code.
"""

from __future__ import annotations

from collections.abc import Sequence

from mdb.commands.migrate.mapping.bean_mapping import MigratedListener
from mdb.observability.redaction import printable

_HEAD = '''"""Listeners migrated from WebLogic message-driven beans by `mdb migrate weblogic`.

Each handler is a stub: port the onMessage of the bean named above it. Until then it raises,
so a message reaching it is redelivered and then moved to its error destination, never
acknowledged unprocessed. The body is the message's text (a TextMessage's); annotate it
`bytes` for a BytesMessage, or with a pydantic model for JSON (docs/concepts.md). Each
listener's options (pool, distribution, redelivery, ...) are in the settings file, under
[listeners.NAME] (docs/configuration.md); what each came from is in the migration report.
"""

from __future__ import annotations

from mdb import Context, listener
'''


def render(inputs: str, listeners: Sequence[MigratedListener], config: str) -> str:
    parts = [_HEAD, f"\n# Migrated from {printable(inputs)}; run with `mdb run "
                                 f"MODULE --config {printable(config)}`."]
    for item in listeners:
        what = item.ejb_class or f"bean {item.bean}"
        sends = ("ctx.send(...) joins the transaction: sent only if the handler returns"
                 if item.transacted else "ctx.send(...) sends at once (transacted = false)")
        parts.append(
            f"\n\n# {printable(item.about)}\n"
            f"# {sends}.\n"
            f"@listener({item.destination!r})\n"
            f"async def {item.name}(body: str, ctx: Context) -> None:\n"
            f"    raise NotImplementedError({f'port the onMessage of {what}'!r})\n")
    return "".join(parts)
