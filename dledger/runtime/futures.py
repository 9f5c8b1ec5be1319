"""Two helpers for the futures the runtime hands out: fail one unless it is settled, and mark one retrieved."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Settable(Protocol):
    """What ``fail`` needs of a future: an ``asyncio.Future`` or something that quacks like one."""

    def done(self) -> bool: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


def fail(fut: Settable, err: BaseException) -> None:
    """Fail ``fut`` unless it already has an outcome (a waiter may have been answered meanwhile)."""
    if not fut.done():
        fut.set_exception(err)


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Done callback: read the exception of a future nobody awaits any more, so asyncio does not warn."""
    if not fut.cancelled():
        fut.exception()
