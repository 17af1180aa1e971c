"""``mdb.testing``: test an application's listeners, and an adapter's broker seam.

For an application (docs/testing.md): the pytest fixture ``mdb_runner`` (this package is a
pytest plugin, registered when mdb is installed) gives a ``SyncRunner``: ``async with
mdb_runner.run("myapp.listeners") as app`` in an ``async def`` test, ``app =
mdb_runner.start("myapp.listeners")`` in a plain one. Then ``app.send``, ``app.settled``,
``app.idle`` (fail fast: a handler's exception is raised in the test), ``app.take`` (what
handlers sent, an error destination's copies with their ``failure``) and
``mdb_runner.clock`` (a ``ManualClock``: redelivery delays pass at once). On the memory
broker by default; on a real one when ``MDB_TEST_BROKER_URL`` names it.

For an adapter: ``mdb.testing.seam``, the broker seam's contract as a test module to run
against your broker (docs/testing.md, "For adapter authors").

Parts: ``runner`` (running and waiting) → ``loading`` (the listeners and overrides a run
takes), ``progress`` (where each message is), ``tracker`` (following messages through spans),
``clock``, ``received``, ``environment`` (the broker and the tables a test runs on); ``sync``
(plain ``def`` tests); ``plugin`` (the fixtures).
"""

from mdb.testing.environment import BROKER_URL_VARIABLE, broker_url
from mdb.testing.manual_clock import ManualClock
from mdb.testing.received import Failure, Received
from mdb.testing.runner import WAIT, HandlerFailed, NotSettled, Runner, RunningApp
from mdb.testing.sync import SyncApp, SyncRunner
from mdb.testing.tracker import Attempt

__all__ = [
    "BROKER_URL_VARIABLE", "WAIT", "Attempt", "Failure", "HandlerFailed", "ManualClock",
    "NotSettled", "Received", "Runner", "RunningApp", "SyncApp", "SyncRunner", "broker_url",
]
