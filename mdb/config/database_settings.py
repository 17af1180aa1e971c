"""``[databases.NAME]``: a database of exactly-once listeners (docs/exactly-once.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from mdb.config.broker_settings import one_password

HOUR = 3_600.0
DAY = 24 * HOUR
URL_EXAMPLES = ("'sqlite+aiosqlite:///mdb.sqlite3', 'postgresql+asyncpg://host:5432/db' or "
                "'mysql+asyncmy://host:3306/db'")


class DatabaseSettings(BaseModel):
    """One database an exactly-once listener keeps its inbox and outbox in, beside its own
    tables. No number may be inf or nan: an endless timeout hangs a pool slot."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    url: str = Field("sqlite+aiosqlite:///mdb.sqlite3", description=(
        "SQLAlchemy async URL: `sqlite+aiosqlite:///PATH` (embedded, the default), "
        "`postgresql+asyncpg://HOST:PORT/DB` or `mysql+asyncmy://HOST:PORT/DB` (MariaDB or "
        "MySQL); a password is better given in `password` or `password_file`"))
    username: str | None = Field(None, description="login, if the database wants one")
    password: SecretStr | None = Field(None, description="never printed or logged")
    password_file: Path | None = Field(
        None, description="read the password from this file at startup (a container secret)")
    pool_size: Annotated[int, Field(ge=1, le=200)] = Field(
        5, description="connections kept open once made (PostgreSQL, MariaDB/MySQL), at "
                       "least: a pool slot of an exactly-once listener holds one while its "
                       "handler runs, and a container keeps up to one for each of its slots on "
                       "the database and one for the outbox, if that is more, each made when "
                       "first needed (docs/deployment.md)")
    timeout: Annotated[float, Field(gt=0, le=DAY)] = Field(
        10.0, description="seconds mdb's own statements (the inbox claim, the commit, the "
                          "outbox dispatch) may take before the database counts as "
                          "unavailable: the delivery is held until it answers. On SQLite a "
                          "wait for the write lock another transaction holds is not counted "
                          "(docs/exactly-once.md)")
    inbox_retention: Annotated[float, Field(ge=HOUR, le=3650 * DAY)] = Field(
        7 * DAY, description="seconds an inbox row is kept: a copy redelivered later than "
                             "this would run again (NServiceBus and MassTransit keep 7 days)")
    outbox_lease: Annotated[float, Field(ge=1.0, le=DAY)] = Field(
        30.0, description="seconds a process owns the outbox rows it is dispatching, renewed "
                          "while it sends them; rows whose lease ran out (their process "
                          "died) are dispatched by another process of the app")

    @model_validator(mode="after")
    def _one_password(self) -> DatabaseSettings:
        # SQLAlchemy is imported here, by a configured database, not by every `mdb run`:
        # a container without one never needs it (docs/architecture.md, "Layers").
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        self.password = one_password(self.password, self.password_file)
        try:
            url = make_url(self.url)
        except ArgumentError:
            raise ValueError(f"not a SQLAlchemy URL: write e.g. {URL_EXAMPLES}") from None
        if url.get_backend_name() == "sqlite" and (self.username or self.password):
            raise ValueError("SQLite takes no username or password: leave username, password "
                             "and password_file out")
        return self
