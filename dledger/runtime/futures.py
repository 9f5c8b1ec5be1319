"""Two helpers for the futures the runtime hands out: fail one unless it is settled, and mark one retrieved."""

from __future__ import annotations

import asyncio


def fail(fut: asyncio.Future, err: BaseException) -> None:
    """Fail ``fut`` unless it already has an outcome (a waiter may have been answered meanwhile)."""
    if not fut.done():
        fut.set_exception(err)


def retrieve(fut: asyncio.Future) -> None:
    """Done callback: read the exception of a future nobody awaits any more, so asyncio does not warn."""
    if not fut.cancelled():
        fut.exception()
