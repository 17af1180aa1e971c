"""mdb's two tables in a listener's database: made by ``mdb db upgrade``, never silently.

``mdb_inbox``: one row per message an exactly-once listener processed, keyed by the listener,
its subscription and the message's identity; written in the handler's own transaction.
``mdb_outbox``: the messages handlers (and producers given a session) sent, written in the
same transaction as the writes they stand for, until a process dispatched them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import CreateColumn

from mdb.errors import ConfigurationError

metadata = MetaData()

inbox = Table(
    "mdb_inbox", metadata,
    Column("listener", String(200), primary_key=True),
    Column("subscription", String(400), primary_key=True),
    Column("message_id", String(200), primary_key=True),
    # A digest of the message's body: a message with another's id is not its copy. NULL in a
    # row written before mdb kept it.
    Column("digest", String(64), nullable=True),
    Column("processed_at", Float, nullable=False),
    Index("mdb_inbox_processed_at", "processed_at"),
)

outbox = Table(
    "mdb_outbox", metadata,
    # The order rows were written in: dispatched in that order, per key.
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("message_id", String(200), nullable=False),
    # The inbox key (listener, subscription, message id) of the delivery whose handler sent
    # it; NULL for a producer's send.
    Column("source", String(900), nullable=True),
    Column("destination", String(1000), nullable=True),
    Column("reply_broker", String(200), nullable=True),
    Column("reply_address", String(1000), nullable=True),
    Column("member_key", String(400), nullable=True),
    Column("body", LargeBinary, nullable=False),
    Column("headers", Text, nullable=False),
    Column("reply_to", String(1000), nullable=True),
    Column("correlation_id", String(400), nullable=True),
    Column("error_destination", String(1000), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("owner", String(200), nullable=True),
    Column("lease_until", Float, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_error", Text, nullable=True),
    Index("mdb_outbox_lease", "lease_until"),
    Index("mdb_outbox_source", "source"),
)

TABLES = (inbox, outbox)


async def upgrade(engine: AsyncEngine) -> list[str]:
    """Create the tables and indexes that are missing, and the columns a table made by an
    earlier mdb lacks (each may be NULL, so a row written before needs no value); return the
    names of what was created (``table`` or ``table.column``)."""
    async with engine.begin() as connection:
        missing = await connection.run_sync(_missing)
        await connection.run_sync(metadata.create_all)
        for column in (m for m in missing if isinstance(m, Column)):
            ddl = CreateColumn(column).compile(dialect=connection.dialect)
            await connection.execute(text(f"ALTER TABLE {column.table.name} ADD COLUMN {ddl}"))
    return [_name(m) for m in missing]


async def check(engine: AsyncEngine, database: str) -> None:
    """``ConfigurationError`` naming the tables and columns ``mdb db upgrade`` must make
    first."""
    async with engine.connect() as connection:
        missing = [_name(m) for m in await connection.run_sync(_missing)]
    if missing:
        raise ConfigurationError(
            f"database {database}: {', '.join(missing)} missing; create "
            f"{'them' if len(missing) > 1 else 'it'} with `mdb db upgrade --config FILE` (mdb "
            "never changes tables on its own)")


def _missing(connection: Connection) -> list[Table | Column[object]]:
    """mdb's tables the database lacks, and the columns its tables lack."""
    inspector = inspect(connection)
    missing: list[Table | Column[object]] = []
    for table in TABLES:
        if not inspector.has_table(table.name):
            missing.append(table)
            continue
        present = {c["name"] for c in inspector.get_columns(table.name)}
        missing.extend(c for c in table.columns if c.name not in present)
    return missing


def _name(created: Table | Column[object]) -> str:
    return created.name if isinstance(created, Table) else f"{created.table.name}.{created.name}"
