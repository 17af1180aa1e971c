"""The end of the pipeline: an mdb listener printing the totals Spark publishes.

A replayed Spark batch re-sends its totals under the same ``mdb_id``; the listener skips ids
it has seen (a real application would keep them in its database, with the effect).
"""

from __future__ import annotations

from mdb import Context, listener

_seen: set[str] = set()


@listener("queue:region_totals")
async def on_region_total(total: dict[str, object], ctx: Context) -> None:
    if ctx.id in _seen:
        print(f"totals: {ctx.id} is a replay, skipped", flush=True)
        return
    _seen.add(ctx.id)
    print(f"totals: {total['region']:<5} window {total['start']} .. {total['end']}: "
          f"{total['orders']} orders, {float(str(total['amount'])):.2f}  ({ctx.id})", flush=True)
