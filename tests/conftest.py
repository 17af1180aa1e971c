"""Fixtures shared by every test: the anyio backend, the real brokers, PostgreSQL and MariaDB.

Broker (and database server) tests may skip when one is absent on a developer's machine, never in CI
(``CI=true``): there the missing broker is a failure (``tests.harness.servers.brokers``).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.harness.processes.application_secret import share_with_this_process
from tests.harness.servers.brokers import missing, private_brokers
from tests.harness.servers.process import BrokerProcess

# Before any test module takes ``identity.PROCESS``: the container processes the tests start
# read the same secret.
share_with_this_process()

# A suite started in the background of a script (``tests/run``'s fault stage, any ``cmd &``)
# inherits SIGINT ignored, and so would every process a test starts: a test's Ctrl-C would then
# be ignored and its process waited for until the test's timeout.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

if TYPE_CHECKING:
    from tests.harness.servers.activemq import ActiveMQ
    from tests.harness.servers.certificates import Certificates
    from tests.harness.servers.mariadb import MariaDB
    from tests.harness.servers.postgresql import PostgreSQL
    from tests.harness.servers.rabbitmq import RabbitMQ


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def activemq() -> Iterator[BrokerProcess]:
    with private_brokers("activemq") as [broker]:
        yield broker


@pytest.fixture(scope="session")
def activemq_trio() -> Iterator[list[BrokerProcess]]:
    """Three ActiveMQ brokers, started together: one per member of a partitioned topic."""
    with private_brokers("activemq", 3) as brokers:
        yield brokers


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[BrokerProcess]:
    with private_brokers("rabbitmq") as [broker]:
        yield broker


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgreSQL]:
    """A private PostgreSQL server (``tests.harness.servers.postgresql``): a test makes a database
    of its own on it (``create_database``)."""
    from tests.harness.servers.postgresql import PostgreSQL, postgresql_available

    if not postgresql_available():
        missing("PostgreSQL")
    with PostgreSQL() as server:
        yield server


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDB]:
    """A private MariaDB server (``tests.harness.servers.mariadb``): a test makes a database of its
    own on it (``create_database``)."""
    from tests.harness.servers.mariadb import MariaDB, mariadb_available

    if not mariadb_available():
        missing("MariaDB")
    with MariaDB() as server:
        yield server


@pytest.fixture(
    params=[
        "memory",
        pytest.param("activemq", marks=pytest.mark.activemq),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def broker_url(request: pytest.FixtureRequest) -> str:
    """The contract suite runs once per broker."""
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex[:8]}"
    return str(request.getfixturevalue(request.param).url)


@pytest.fixture(params=["memory", pytest.param("activemq_trio", marks=pytest.mark.activemq)])
def member_urls(request: pytest.FixtureRequest) -> list[str]:
    """Three brokers, one per member of a partitioned topic: in memory, then real ones."""
    if request.param == "memory":
        return [f"memory://{uuid.uuid4().hex[:8]}" for _ in range(3)]
    return [str(broker.url) for broker in request.getfixturevalue(request.param)]


@pytest.fixture(scope="session")
def tls_certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A test CA and the certificates signed by it (``tests.harness.servers.certificates``)."""
    from tests.harness.servers.certificates import Certificates, tools_available

    if not tools_available():
        missing("openssl and keytool (from the JDK)")
    return Certificates.make(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="session")
def activemq_tls(tls_certificates: Certificates) -> Iterator[ActiveMQ]:
    """An ActiveMQ broker with a ``stomp+ssl`` connector wanting a client certificate, and a
    user ``outsider`` (password ``outsider-pw``) who may connect and do nothing else."""
    from tests.harness.servers.activemq import ActiveMQ, activemq_available

    if not activemq_available():
        missing("ActiveMQ Classic")
    with ActiveMQ(tls=tls_certificates, outsiders={"outsider": "outsider-pw"}) as broker:
        yield broker


@pytest.fixture(scope="session")
def rabbitmq_tls(tls_certificates: Certificates) -> Iterator[RabbitMQ]:
    """A RabbitMQ node with a STOMP TLS listener (server certificate only); the transport
    tests also make their vhosts and users on it."""
    from tests.harness.servers.rabbitmq import RabbitMQ, rabbitmq_available

    if not rabbitmq_available():
        missing("RabbitMQ with the STOMP plugin")
    with RabbitMQ(tls=tls_certificates) as broker:
        yield broker
