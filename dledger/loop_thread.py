"""An asyncio event loop on a thread of its own, for a blocking client whose calls ride asyncio streams (a
broker producer's session): any thread hands it a coroutine and blocks on the result.

One hand-off costs two thread wake-ups; a blocking client makes it once per packed call (``dledger.combiner``),
not once per item.

The loop is uvloop's, as a node's is (``dledger/runtime/process.py``): the thread's work is event-loop plumbing
around grpc.aio, which uvloop does in C. Measured with one 3-node group, a ``Producer`` on each kind of loop side
by side (docs/benchmarks.md, 2026-11-29): a sequential send 1.33 against 1.36-1.38 ms p50, 64 threads sharing one
``Producer`` 10,482-11,200 against 8,937-11,530 msg/s (medians 10,891 and 10,126).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")

DRAIN_S = 5.0  # how long ``close`` waits for the loop's pending tasks to finish, then for the loop to stop


class LoopThread:
    """Started at construction; ``close()`` stops the loop and joins the thread (idempotent, bounded: a loop
    stuck in a blocking call is left running on its daemon thread rather than hanging the caller)."""

    def __init__(self, name: str):
        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (its exception is raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._drain(), self.loop).result(DRAIN_S)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(DRAIN_S)
            if self._thread.is_alive():  # the loop is stuck in a blocking call: leave it (a daemon thread)
                return
        # The loop stopped: tasks it left (a drain that came too late to run) are cancelled and finished here, so
        # no coroutine is closed unawaited.
        left = asyncio.all_tasks(self.loop)
        for t in left:
            t.cancel()
        if left:
            self.loop.run_until_complete(asyncio.wait(left, timeout=DRAIN_S))
        self.loop.close()

    async def _drain(self) -> None:
        """What ``asyncio.run`` does before it closes its loop: the tasks still pending are cancelled and waited
        for (gRPC's own, finishing the calls a closed channel cancelled), and async generators closed; a loop
        stopped under them printed "Task was destroyed but it is pending!" as a client closed."""
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not me]
        for t in pending:
            t.cancel()
        if pending:  # bounded: a task that ignores its cancellation does not hold the close
            await asyncio.wait(pending, timeout=DRAIN_S)
        await self.loop.shutdown_asyncgens()
