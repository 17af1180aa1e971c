"""The identity secret the test process shares with every container process it starts.

They are processes of one application, as a deployment's are: each proves the messages it
sends with the application's secret, so that the others know them by their ``mdb_id``
(docs/exactly-once.md, "Identity"). Without it each process would have a secret of its own
and know the others' messages as a producer's (``<mdb_id>#<digest>``), which is the rule for
processes of different applications, not what these tests are about.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path

from mdb.messages import identity

SECRET = secrets.token_hex(32)
SECRET_FILE = Path(tempfile.mkdtemp(prefix="mdb-secret-")) / "identity_secret"
SECRET_FILE.write_text(SECRET)
SECRET_FILE.chmod(0o400)

ENVIRONMENT = {"MDB_IDENTITY_SECRET_FILE": str(SECRET_FILE)}
"""What a container process's environment gets to read the secret (before a test's own
variables, which may set another)."""


def share_with_this_process() -> None:
    """Prove what this (the test) process sends with the application's secret, as
    ``identity_secret_file`` would: a process given no secret uses ``identity.PROCESS``."""
    identity.PROCESS = identity.Seal(SECRET.encode())
