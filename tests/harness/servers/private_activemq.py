"""``python -m tests.harness.servers.private_activemq COMMAND...``: run COMMAND with ``--broker
URL`` of a private ActiveMQ (a free port, a temporary directory), then stop the broker and delete
its directory; exit with COMMAND's status. A checkout's example scripts use it
(examples/spark_orders/run); outside a checkout, give the example a broker of your own."""

from __future__ import annotations

import subprocess
import sys

from tests.harness.servers.activemq import ActiveMQ


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("starting a private ActiveMQ...", flush=True)
    with ActiveMQ() as broker:
        status = subprocess.call([*sys.argv[1:], "--broker", broker.url])
    sys.exit(status)


if __name__ == "__main__":
    main()
