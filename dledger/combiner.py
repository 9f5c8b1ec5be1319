"""Concurrent callers of one client share calls: what they submit while a call is in flight goes out together in
the next one (group commit on the client side).

A node's cost is per call far more than per entry (Python gRPC spends about a millisecond of CPU on each), so
64 threads each making their own call cap a small machine at a few thousand calls a second, while the same
work packed into a few calls costs a few. No extra thread or event loop: the first callers to arrive (up to
``max_inflight`` at a time) make the calls for everyone queued, and when one finishes it hands its turn to
the oldest waiter (a blocked thread costs one wake-up, the least a blocking call can cost). A call first gathers
the callers the last call answered, for a bounded moment, since threads come back one wake-up at a time
(``Combiner._serve``). Each caller still gets only its own results, or the error of the call that carried them;
a call refused for a reason one caller's items may have caused (not retriable) is re-made per caller, so one
bad request never fails its neighbours.
"""

from __future__ import annotations

import _thread
import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from dledger.errors import DLedgerError, OutcomeUnknownError

T = TypeVar("T")
R = TypeVar("R")


def _alone(err: BaseException) -> bool:
    """Should a refused combined call be re-made per caller? Only when one caller's items may be the cause."""
    return isinstance(err, DLedgerError) and not err.retriable and not isinstance(err, OutcomeUnknownError)


class _Waiter(Generic[T, R]):
    """One blocked caller. It waits on a bare lock (the cheapest thing a thread can block on), released
    exactly once: when its results are in, or when it is promoted to make the next call itself."""

    __slots__ = ("error", "items", "lock", "promoted", "results")

    def __init__(self, items: list[T]):
        self.items = items
        self.results: list[R] | None = None
        self.error: BaseException | None = None
        self.promoted = False
        self.lock = _thread.allocate_lock()
        self.lock.acquire()

    def outcome(self) -> list[R]:
        if self.error is not None:
            raise self.error
        assert self.results is not None
        return self.results


class Combiner(Generic[T, R]):
    """Thread-safe. ``call(items)`` makes one call for a list of items and returns one result per item."""

    def __init__(
        self,
        call: Callable[[list[T]], Sequence[R]],
        *,
        max_inflight: int = 1,
        max_items: int = 1000,
        max_gather_s: float = 0.002,
    ):
        self._call = call
        self._max_inflight = max_inflight
        self._max_items = max_items
        self._max_gather_s = max_gather_s
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)  # notified as callers join the queue
        self._queue: list[_Waiter[T, R]] = []
        self._inflight = 0
        self._last_batch = 1  # callers the last call carried
        self._last_call_s = 0.0

    def submit(self, items: Sequence[T]) -> list[R]:
        w: _Waiter[T, R] = _Waiter(list(items))
        with self._lock:
            lead = self._inflight < self._max_inflight
            if lead:
                self._inflight += 1
            else:
                self._queue.append(w)
                self._queued.notify()
        if not lead:
            w.lock.acquire()
            if not w.promoted:
                return w.outcome()
        self._serve(w)
        return w.outcome()

    def _serve(self, own: _Waiter[T, R]) -> None:
        """Make one call for ``own`` and the queue's head; as soon as it returns, hand this turn to the oldest
        waiter (so the next call starts before this one's callers are woken), then wake them.

        Threads, unlike asyncio tasks, come back one wake-up at a time: the callers a call has just answered are
        still being woken when the next call starts, so it would carry a few of them and leave the rest for the
        call after (many small calls: the node's cost is per call). So a call first waits for as many callers as
        the last one carried, for at most a quarter of the last call's duration (and ``max_gather_s``): a lone
        sequential caller never waits, and callers that do not come back cost that bound once."""
        with self._lock:
            want = min(self._last_batch, self._max_items) - 1
            if len(self._queue) < want:
                deadline = time.monotonic() + min(self._max_gather_s, self._last_call_s / 4)
                while len(self._queue) < want:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._queued.wait(left):
                        break
            batch = [own, *_take(self._queue, self._max_items - len(own.items))]
            self._last_batch = len(batch)
        started = time.monotonic()

        def done() -> None:
            self._last_call_s = time.monotonic() - started
            self._pass_turn()

        _deliver(batch, self._call, own, done)

    def _pass_turn(self) -> None:
        with self._lock:
            if self._queue:
                nxt = self._queue.pop(0)
                nxt.promoted = True
                nxt.lock.release()
            else:
                self._inflight -= 1


class AsyncCombiner(Generic[T, R]):
    """The asyncio form: callers arriving while ``max_inflight`` calls are in flight are packed together."""

    def __init__(
        self,
        call: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_inflight: int = 1,
        max_items: int = 1000,
    ):
        self._call = call
        self._max_inflight = max_inflight
        self._max_items = max_items
        self._queue: list[tuple[list[T], asyncio.Future]] = []
        self._inflight = 0
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, items: Sequence[T]) -> list[R]:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((list(items), fut))
        if self._inflight < self._max_inflight:
            # A task of its own drains the queue, so no caller is kept serving others after its own answer.
            self._inflight += 1
            task = asyncio.ensure_future(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                await self._serve(_take(self._queue, self._max_items) or [self._queue.pop(0)])
        finally:
            self._inflight -= 1

    async def _serve(self, batch: list[tuple[list[T], asyncio.Future]]) -> None:
        flat = [x for items, _ in batch for x in items]
        try:
            results = list(await self._call(flat))
        except BaseException as e:
            if len(batch) > 1 and _alone(e):
                for one in batch:
                    await self._serve([one])
                return
            for _, f in batch:
                if not f.done():
                    f.set_exception(e)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        i = 0
        for items, f in batch:
            if not f.done():
                f.set_result(results[i : i + len(items)])
            i += len(items)


def _take(queue: list, budget: int) -> list:
    """The queue's head: callers in arrival order while their items fit in ``budget``."""
    n = count = 0
    for entry in queue:
        size = len(entry.items) if isinstance(entry, _Waiter) else len(entry[0])
        if n + size > budget:
            break
        n += size
        count += 1
    batch = queue[:count]
    del queue[:count]
    return batch


def _deliver(
    batch: list[_Waiter], call: Callable[[list], Sequence], own: _Waiter, done: Callable[[], None]
) -> None:
    """Make the call, call ``done`` (exactly once), then hand each waiter its results (waking all but ``own``)."""
    flat = [x for w in batch for x in w.items]
    try:
        results = list(call(flat))
    except BaseException as e:
        if len(batch) > 1 and _alone(e):
            for i, w in enumerate(batch):
                _deliver([w], call, own, done if i == len(batch) - 1 else _nothing)
            return
        done()
        for w in batch:
            w.error = e
            if w is not own:
                w.lock.release()
        if not isinstance(e, Exception):
            raise
        return
    done()
    i = 0
    for w in batch:
        w.results = results[i : i + len(w.items)]
        i += len(w.items)
        if w is not own:
            w.lock.release()


def _nothing() -> None:
    pass
