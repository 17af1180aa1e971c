"""The failed-message workflow on every broker (``mdb.failed``, docs/failed-messages.md): poison
messages reach the error destination, a listing shows them with their failure and leaves them,
a replay once the handler is fixed has each processed once, a replay cut short and run again
loses and doubles nothing, and a purge takes what it selected and nothing else."""

from __future__ import annotations

import pytest

from mdb import Redelivery, listener
from mdb.failed import Selection
from mdb.testing import SyncRunner

pytestmark = pytest.mark.anyio

fixed = {"on": False}
processed: list[str] = []


@pytest.fixture
def mdb_broker_url(broker_url: str) -> str:
    return broker_url


@pytest.fixture(autouse=True)
def fresh() -> None:
    fixed["on"] = False
    processed.clear()


class Poison(Exception):
    pass


POISON = f"{__name__}.Poison"  # a failure type as mdb names it: builtins by their name alone


@listener("queue:failed_orders", redelivery=Redelivery(limit=1))
async def on_order(body: str) -> None:
    if not fixed["on"] and body.startswith("poison"):
        raise Poison(f"cannot take {body}")
    if body.startswith("fatal"):
        raise KeyError(body)
    processed.append(body)


class Cut(Exception):
    """A replay cut short (a process killed) after some messages."""


async def test_poison_listed_then_replayed_once_cut_short_and_again_then_purged(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        poison = [await app.send("queue:failed_orders", f"poison {i}") for i in range(4)]
        fatal = await app.send("queue:failed_orders", "fatal 1")
        await app.idle(fail_fast=False)
        errors = app.error_destination("queue:failed_orders.DLQ")

        listed = [f async for f in errors.list()]
        assert [f.id for f in listed] == [*poison, fatal]
        assert {f.error_type for f in listed} == {POISON, "KeyError"}
        assert listed[0].error_message == "cannot take poison 0"
        assert listed[0].original_destination == "queue:failed_orders"
        assert [f.id async for f in errors.list()] == [*poison, fatal]  # left where they were

        fixed["on"] = True
        only_poison = Selection(error_type=POISON)

        def cut_after_two(done: int, total: int) -> None:
            if done == 2:
                raise Cut

        with pytest.raises(Cut):
            await errors.replay(only_poison, progress=cut_after_two)
        assert (await errors.replay(only_poison)).taken == 2  # the rest, and only the rest
        for sent in poison:
            await app.settled(sent)
        await app.idle(fail_fast=False)
        assert sorted(processed) == [f"poison {i}" for i in range(4)]  # each once

        [left] = [f async for f in errors.list()]
        assert left.id == fatal
        assert (await errors.purge(only_poison)).taken == 0
        assert (await errors.purge(Selection(ids=frozenset({fatal})))).taken == 1
        assert [f async for f in errors.list()] == []
