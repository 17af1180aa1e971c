"""mdb's two tables in a listener's database: made by ``mdb db upgrade``, never silently.

``mdb_inbox``: one row per message an exactly-once listener processed, keyed by the listener,
its subscription and the message's identity; written in the handler's own transaction.
``mdb_outbox``: the messages handlers (and producers given a session) sent, written in the
same transaction as the writes they stand for, until a process dispatched them.
``mdb_secret``: the application's identity secret (``mdb.messages.identity.Seal``), made once.

On MariaDB/MySQL some columns take another type (``with_variant``): the key columns are
``VARBINARY`` holding UTF-8 (``_Utf8``), times are ``DOUBLE`` (its ``FLOAT`` is single
precision: seconds since 1970 to the nearest two minutes), bodies ``LONGBLOB`` and headers
``MEDIUMTEXT`` (``BLOB`` and ``TEXT`` stop at 64 KiB); the tables are InnoDB (whose row
locks make a second claim wait, ``mdb.exactly_once.inbox``) in ``utf8mb4``, whatever the
server's defaults.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

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
    TypeDecorator,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects.mysql import DOUBLE, LONGBLOB, MEDIUMTEXT, VARBINARY
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.schema import CreateColumn

from mdb.errors import ConfigurationError
from mdb.exactly_once import sqlite
from mdb.messages.identity import digest
from mdb.messages.message import MAX_BODY_BYTES

_MYSQL = ("mysql", "mariadb")  # SQLAlchemy's names of the dialect: the server's, its driver's


class _Utf8(TypeDecorator[str]):
    """Text kept as its UTF-8 bytes (``VARBINARY(size)``) on MariaDB/MySQL: compared byte for
    byte, as PostgreSQL and SQLite compare it (the server's usual collations ignore case and
    trailing spaces, so that two message ids would be one), and bounded in bytes, which is
    what InnoDB bounds a key in (3072 bytes: a primary key of three ``VARCHAR`` columns in
    ``utf8mb4`` would pass it). A value longer than ``characters`` (as PostgreSQL refuses
    it) or ``size`` bytes is refused before it reaches the server."""

    impl = VARBINARY
    cache_ok = True

    def __init__(self, characters: int, size: int) -> None:
        super().__init__(size)
        self.characters = characters
        self.size = size

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        if value is None:
            return None
        data = value.encode()
        if len(value) > self.characters or len(data) > self.size:
            raise ValueError(f"{len(value)} characters, {len(data)} bytes in UTF-8: more than "
                             f"the {self.characters} characters or {self.size} bytes this "
                             "column keeps on MariaDB/MySQL")
        return data

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else bytes(value).decode()


def _key(characters: int, size: int) -> String:
    """A key column: ``characters`` long, ``size`` bytes of UTF-8 on MariaDB/MySQL."""
    return String(characters).with_variant(_Utf8(characters, size), *_MYSQL)


# The inbox's key columns: (characters, bytes of UTF-8 on MariaDB/MySQL). 800 + 1470 + 800
# bytes: within InnoDB's 3072 for a key.
LISTENER = (200, 800)
SUBSCRIPTION = (400, 1470)
MESSAGE_ID = (200, 800)
OWNER = (200, 800)  # not a key: (characters, the bytes ``fitted`` keeps it to) of mdb_outbox.owner


def fitted(value: str, limits: tuple[int, int]) -> str:
    """``value`` as a column of ``limits`` (``LISTENER``, ``SUBSCRIPTION``, ``OWNER``) keeps
    it: as it is, or, longer than its characters or bytes, as its digest (``sha256:...``, 71
    characters): a listener's, a queue's or an application's name may be longer than a
    database keeps in a key, and a key needs only to tell them apart."""
    characters, size = limits
    if len(value) <= characters and len(value.encode()) <= size:
        return value
    return digest(value.encode())


_TIME = Float().with_variant(DOUBLE(asdecimal=False), *_MYSQL)
# InnoDB and utf8mb4 whatever the server's defaults; ignored by the other databases.
_MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4",
                                "mysql_collate": "utf8mb4_bin"}

# The largest statement mdb may send MariaDB/MySQL: an outbox row with the largest body mdb
# sends, each of its bytes perhaps escaped to two, and headers of up to MEDIUMTEXT's 16 MiB.
MYSQL_PACKET = 2 * MAX_BODY_BYTES + (16 << 20)

metadata = MetaData()

inbox = Table(
    "mdb_inbox", metadata,
    # Longer names are kept as their digests (``fitted``); an identity always fits
    # (``mdb.messages.identity.MAX_ID``).
    Column("listener", _key(*LISTENER), primary_key=True),
    Column("subscription", _key(*SUBSCRIPTION), primary_key=True),
    Column("message_id", _key(*MESSAGE_ID), primary_key=True),
    # A digest of the message's body: a message with another's id is not its copy. NULL in a
    # row written before mdb kept it.
    Column("digest", String(64), nullable=True),
    Column("processed_at", _TIME, nullable=False),
    Index("mdb_inbox_processed_at", "processed_at"),
    **_MYSQL_TABLE,
)

outbox = Table(
    "mdb_outbox", metadata,
    # The order rows were written in: dispatched in that order, per key.
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("message_id", String(200), nullable=False),
    # The inbox key (listener, subscription, message id, as the inbox keeps them) of the
    # delivery whose handler sent it; NULL for a producer's send.
    Column("source", _key(900, 3072), nullable=True),  # indexed: 3072 bytes at most
    Column("destination", String(1000), nullable=True),
    Column("reply_broker", String(200), nullable=True),
    Column("reply_address", String(1000), nullable=True),
    Column("member_key", String(400), nullable=True),
    Column("body", LargeBinary().with_variant(LONGBLOB(), *_MYSQL), nullable=False),
    Column("headers", Text().with_variant(MEDIUMTEXT(), *_MYSQL), nullable=False),
    Column("reply_to", String(1000), nullable=True),
    Column("correlation_id", String(400), nullable=True),
    Column("error_destination", String(1000), nullable=False),
    Column("created_at", _TIME, nullable=False),
    Column("owner", String(OWNER[0]), nullable=True),
    Column("lease_until", _TIME, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_error", Text, nullable=True),
    Index("mdb_outbox_lease", "lease_until"),
    Index("mdb_outbox_source", "source"),
    **_MYSQL_TABLE,
)

# The application's secret (``mdb.messages.identity.Seal``), made by ``mdb db upgrade``: one row.
secret = Table(
    "mdb_secret", metadata,
    Column("name", String(100), primary_key=True),
    Column("value", String(200), nullable=False),
    **_MYSQL_TABLE,
)
IDENTITY = "identity"  # the row of the identity secret

TABLES = (inbox, outbox, secret)


async def upgrade(engine: AsyncEngine) -> list[str]:
    """Create the tables and indexes that are missing, the columns a table made by an earlier
    mdb lacks (each may be NULL, so a row written before needs no value) and the identity
    secret; return the names of what was created (``table``, ``table.column`` or ``the identity
    secret``).

    Upgrades of one database run one at a time, whichever processes make them (the init
    containers of a rollout start together): each waits for the one before it to end, then
    finds what that one made (its secret too). Checked, then created, side by side they failed,
    one creating what the other had just made."""
    if engine.dialect.name == "sqlite":
        engine = engine.execution_options(**sqlite.WRITES)  # the write lock from the start
    async with engine.begin() as connection, _one_at_a_time(connection):
        missing = await connection.run_sync(_missing)
        await connection.run_sync(metadata.create_all)
        for column in (m for m in missing if isinstance(m, Column)):
            ddl = CreateColumn(column).compile(dialect=connection.dialect)
            await connection.execute(text(f"ALTER TABLE {column.table.name} ADD COLUMN {ddl}"))
        created = [_name(m) for m in missing]
        if await _secret_of(connection) is None:
            await connection.execute(secret.insert().values(name=IDENTITY,
                                                            value=secrets.token_hex(32)))
            created.append("the identity secret")
    return created


async def identity_secret(engine: AsyncEngine) -> bytes | None:
    """The application's identity secret ``upgrade`` made (None: none yet)."""
    async with engine.connect() as connection:
        return await _secret_of(connection)


async def _secret_of(connection: AsyncConnection) -> bytes | None:
    found = (await connection.execute(
        select(secret.c.value).where(secret.c.name == IDENTITY))).scalar()
    return None if found is None else str(found).encode()


# The key of the lock an upgrade holds on PostgreSQL: advisory locks are the database's own,
# so upgrades of two databases on one server do not wait for each other.
_UPGRADE_LOCK = 0x6D64625F75706772  # "mdb_upgr"
_MYSQL_LOCK = "CONCAT('mdb_upgrade.', DATABASE())"


@asynccontextmanager
async def _one_at_a_time(connection: AsyncConnection) -> AsyncIterator[None]:
    """Hold the lock of upgrades of ``connection``'s database: on PostgreSQL until its
    transaction ends; on MariaDB/MySQL, whose DDL commits as it goes, a lock of its session
    until the block ends. SQLite's is its write lock, taken as the transaction began."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        await connection.execute(text(f"SELECT pg_advisory_xact_lock({_UPGRADE_LOCK})"))
    if dialect not in _MYSQL:
        yield
        return
    # An hour: mdb's timeout (and MariaDB's max_statement_time) end the wait long before.
    taken = await connection.scalar(text(f"SELECT GET_LOCK({_MYSQL_LOCK}, 3600)"))
    if taken != 1:  # NULL: the server refused the call, with a warning, not an error
        raise ConfigurationError("the server refused GET_LOCK, which keeps two upgrades of a "
                                 "database from running at once")
    try:
        yield
    finally:
        await connection.execute(text(f"SELECT RELEASE_LOCK({_MYSQL_LOCK})"))


async def check(engine: AsyncEngine, database: str) -> None:
    """``ConfigurationError`` naming the tables and columns ``mdb db upgrade`` must make
    first (and the identity secret), or (MariaDB/MySQL) the server setting too small for an
    outbox row."""
    packet = None
    async with engine.connect() as connection:
        missing = [_name(m) for m in await connection.run_sync(_missing)]
        if connection.dialect.name in _MYSQL:
            packet = (await connection.execute(text("SELECT @@max_allowed_packet"))).scalar()
    if not missing and await identity_secret(engine) is None:
        missing = ["its identity secret"]
    if missing:
        raise ConfigurationError(
            f"database {database}: {', '.join(missing)} missing; create "
            f"{'them' if len(missing) > 1 else 'it'} with `mdb db upgrade --config FILE` (mdb "
            "never changes tables on its own)")
    if packet is not None and int(packet) < MYSQL_PACKET:
        # A larger statement is not refused: the server drops the connection, an outage
        # that every run of the message would meet again.
        raise ConfigurationError(
            f"database {database}: the server's max_allowed_packet is {int(packet) >> 20} "
            f"MiB, less than the {MYSQL_PACKET >> 20} MiB an outbox row of the largest body "
            f"mdb sends ({MAX_BODY_BYTES >> 20} MiB) may take; set max_allowed_packet = 256M "
            "in the server's configuration (docs/exactly-once.md)")


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
