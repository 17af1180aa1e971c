"""A user's code that uses mdb type-checks under ``mypy --strict``: mdb is a typed package
(``py.typed``), ``@listener`` keeps the handler's own type, and the settings models can be made
with their defaults left out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_MODULE = '''\
from mdb import Context, Redelivery, Settings, listener
from mdb.config.broker_settings import BrokerSettings

# Settings and options made in code, defaults left out (pydantic models: without pydantic's
# mypy plugin, as a user runs mypy, each default must be seen as one).
SETTINGS = Settings(app="shop", brokers={"main": BrokerSettings(url="memory://shop")})


@listener("queue:orders", pool=2, redelivery=Redelivery(limit=2, delay=1.0))
async def on_order(body: dict[str, int], ctx: Context) -> None:
    await ctx.send("queue:invoices", body)


@listener("queue:audit")
def on_audit(body: str) -> None:
    print(body)


async def call() -> None:
    on_audit("plain call")
    # The decorated handler keeps its signature: a wrong argument is an error (and an unused
    # ignore would be one too).
    await on_order({"a": 1}, ctx="not a context")  # type: ignore[arg-type]
'''


def test_a_users_listener_module_passes_mypy_strict(tmp_path: Path) -> None:
    (tmp_path / "user_listeners.py").write_text(USER_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                        str(ROOT / "adapters" / "brokers"),
                                                        str(ROOT / "adapters" / "integrations")])}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"),
         "user_listeners.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
