"""What a driver's error says about the database, dialect by dialect: out of reach (an outage:
``mdb.exactly_once.database.database.translated`` makes it ``DatabaseUnavailable``), or a refusal
of one statement (the handler's failure). Pure functions of the exception.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.exc import DBAPIError, InvalidRequestError, OperationalError

# SQLSTATE classes that say the server cannot take the statement now, not that it is wrong: a
# connection exception (08), the server shutting down, crashed or still starting (57P01 to
# 57P03: asyncpg raises them as plain errors), insufficient resources (53: too many
# connections, a full disk), mdb's login refused (28: a password rotated on the server before
# the settings, a login locked; only a connection is refused so, never a handler's statement).
_UNAVAILABLE_STATES = ("08", "57P0", "53", "28")


def unavailable_state(exc: DBAPIError) -> bool:
    state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return isinstance(state, str) and state.startswith(_UNAVAILABLE_STATES)


# MariaDB's and MySQL's own errors that say the server cannot take the statement now: too many
# connections, shutting down, the connection killed, the statement interrupted by a shutdown,
# mdb's login refused (its password, its account locked).
_MYSQL_UNAVAILABLE = frozenset({1040, 1053, 1927, 1317, 1045, 4151})


def refused_by_mysql(exc: OperationalError) -> bool:
    """Whether ``exc`` is MariaDB's or MySQL's refusal of a statement (a deadlock, a lock
    wait or a statement past its time, an error its driver has no class for), the handler's
    failure as on PostgreSQL: their drivers raise ``OperationalError`` for any server error
    number they do not know. The client's own numbers (2000 to 2999: no connection, the
    connection lost) say the server is out of reach; the server's are the others, from 1000."""
    code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
    return (isinstance(code, int) and code >= 1000 and not 2000 <= code < 3000
            and code not in _MYSQL_UNAVAILABLE and not exc.connection_invalidated)


def checkout_gave_up(exc: InvalidRequestError) -> bool:
    """Whether ``exc`` is the pool giving up a checkout: every connection it made in its
    retries was retired as made before the database's last failure
    (``Database._checked_out``), which other sessions kept meeting as a server restarted.
    SQLAlchemy says so with a plain ``InvalidRequestError``, told from a misuse of a session by
    where it was raised."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    code = None if frame is None else frame.tb_frame.f_code
    return code is not None and code.co_name == "_checkout" and "pool" in code.co_filename


def parameter_bytes(parameters: object) -> int:
    """The bytes of a statement's parameters (several rows' for an ``executemany``), as text
    or bytes."""
    if isinstance(parameters, str):
        return len(parameters.encode(errors="replace"))
    if isinstance(parameters, bytes | bytearray | memoryview):
        return len(parameters)
    if isinstance(parameters, Mapping):
        return sum(parameter_bytes(value) for value in parameters.values())
    if isinstance(parameters, list | tuple):
        return sum(parameter_bytes(value) for value in parameters)
    return 0


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__
