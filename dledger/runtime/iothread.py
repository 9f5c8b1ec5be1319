"""The node's single I/O thread: the only writer of the log and the metadata, and a count of its open jobs.

Storage calls that may block (fsync, truncate, unlink, segment roll, compaction, open, close) run here, one at a
time and in submission order, so the log keeps a single writer. ``pending`` counts jobs until they have really
finished (a cancelled waiter does not end the job): the ready loop writes inline only while it is zero.

The hand-off sits on every write the ready loop does not make inline (a leader's fdatasync under ``sync``, a
follower's, large batches), so it is kept to one queue put and one ``call_soon_threadsafe`` (one wake-up of the
loop): 55 against 72 us of CPU a job for a ``ThreadPoolExecutor`` and ``wrap_future`` on this machine
(docs/runtime.md, "The I/O thread").
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class IoThread:
    def __init__(self, name: str):
        self.pending = 0  # jobs submitted and not finished
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # A daemon: a process that exits without closing its node loses what a kill -9 would, no more (nothing
        # is acknowledged before its write finished); Node.close shuts the thread down after the last write.
        self._thread: threading.Thread | None = threading.Thread(
            target=self._work, name=f"{name}-io", daemon=True
        )
        self._thread.start()  # (started here: a job may be queued before the loop runs)

    async def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Run ``fn(*args)`` on the thread and wait for it."""
        if self._thread is None:
            raise RuntimeError("the I/O thread was shut down")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, fut, fn, args))
        self.pending += 1
        return await fut

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, fut, fn, args = job
            try:
                result = fn(*args)
            except BaseException as e:  # handed to the waiter
                outcome: tuple[Any, BaseException | None] = (None, e)
            else:
                outcome = (result, None)
            # (RuntimeError: the loop closed while the job ran, and no one waits for it any more.)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._finished, fut, *outcome)

    def _finished(self, fut: asyncio.Future[Any], result: Any, err: BaseException | None) -> None:
        self.pending -= 1
        if fut.done():  # the waiter was cancelled: the job still ran to its end
            return
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(result)

    def shutdown(self, wait: bool) -> None:
        """No more jobs; the ones queued still run, in order (``wait``: until they have)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._jobs.put(None)
        if wait and thread is not threading.current_thread():
            thread.join()
