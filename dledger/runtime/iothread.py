"""The node's single I/O thread: the only writer of the log and the metadata, and a count of its open jobs.

Storage calls that may block (fsync, truncate, unlink, segment roll, compaction, open, close) run here, one at a
time and in submission order, so the log keeps a single writer. ``pending`` counts jobs until they have really
finished (a cancelled waiter does not end the job): the ready loop writes inline only while it is zero.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class IoThread:
    def __init__(self, name: str):
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-io")
        self.pending = 0  # jobs submitted and not finished

    async def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Run ``fn(*args)`` on the thread and wait for it."""
        loop = asyncio.get_running_loop()
        job = self.executor.submit(fn, *args)
        self.pending += 1
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._finished))
        return await asyncio.wrap_future(job)

    def _finished(self) -> None:
        self.pending -= 1

    def shutdown(self, wait: bool) -> None:
        self.executor.shutdown(wait=wait)
