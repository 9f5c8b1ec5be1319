"""Concurrent callers of one client share calls: what they submit while a call is in flight goes out together in
the next one (group commit on the client side).

A node's cost is per call far more than per entry (Python gRPC spends about a millisecond of CPU on each), so
64 threads each making their own call cap a small machine at a few thousand calls a second, while the same
work packed into a few calls costs a few. No extra thread or event loop: the first callers to arrive (up to
``max_inflight`` at a time) make the calls for everyone queued, and when one finishes it hands its turn to
the oldest waiter. Each caller still gets only its own results, or the error of the call that carried them;
a call refused for a reason one caller's items may have caused (not retriable) is re-made per caller, so one
bad request never fails its neighbours.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from dledger.errors import DLedgerError, OutcomeUnknownError

T = TypeVar("T")
R = TypeVar("R")


def _alone(err: BaseException) -> bool:
    """Should a refused combined call be re-made per caller? Only when one caller's items may be the cause."""
    return isinstance(err, DLedgerError) and not err.retriable and not isinstance(err, OutcomeUnknownError)


class _Waiter(Generic[T, R]):
    __slots__ = ("done", "error", "event", "items", "lead", "results")

    def __init__(self, items: list[T]):
        self.items = items
        self.results: list[R] | None = None
        self.error: BaseException | None = None
        self.done = False
        self.lead = False
        self.event = threading.Event()

    def resolve(self, results: list[R] | None, error: BaseException | None) -> None:
        self.results, self.error = results, error
        self.done = True
        self.event.set()

    def outcome(self) -> list[R]:
        if self.error is not None:
            raise self.error
        assert self.results is not None
        return self.results


class Combiner(Generic[T, R]):
    """Thread-safe. ``call(items)`` makes one call for a list of items and returns one result per item."""

    def __init__(
        self, call: Callable[[list[T]], Sequence[R]], *, max_inflight: int = 4, max_items: int = 1000
    ):
        self._call = call
        self._max_inflight = max_inflight
        self._max_items = max_items
        self._lock = threading.Lock()
        self._queue: list[_Waiter[T, R]] = []
        self._inflight = 0

    def submit(self, items: Sequence[T]) -> list[R]:
        w: _Waiter[T, R] = _Waiter(list(items))
        with self._lock:
            self._queue.append(w)
            if self._inflight < self._max_inflight:
                self._inflight += 1
                w.lead = True
        while True:
            if w.lead:
                w.lead = False
                self._serve()
            if w.done:
                return w.outcome()
            w.event.wait()
            w.event.clear()

    def _serve(self) -> None:
        """Make one call for the queue's head, then hand this turn to the oldest waiter (or give it back)."""
        with self._lock:
            batch = _take(self._queue, self._max_items)
            if not batch:
                self._inflight -= 1
                return
        try:
            _deliver(batch, self._call)
        finally:
            with self._lock:
                if self._queue:
                    nxt = self._queue[0]
                    nxt.lead = True
                    nxt.event.set()
                else:
                    self._inflight -= 1


class AsyncCombiner(Generic[T, R]):
    """The asyncio form: callers arriving while ``max_inflight`` calls are in flight are packed together."""

    def __init__(
        self,
        call: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_inflight: int = 4,
        max_items: int = 1000,
    ):
        self._call = call
        self._max_inflight = max_inflight
        self._max_items = max_items
        self._queue: list[tuple[list[T], asyncio.Future]] = []
        self._inflight = 0

    async def submit(self, items: Sequence[T]) -> list[R]:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((list(items), fut))
        if self._inflight < self._max_inflight:
            self._inflight += 1
            try:
                while self._queue:
                    await self._serve(_take(self._queue, self._max_items))
            finally:
                self._inflight -= 1
        return await fut

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


def _take(queue: list, max_items: int) -> list:
    """The queue's head: callers in arrival order up to ``max_items`` items (always at least one caller)."""
    n = count = 0
    for entry in queue:
        size = len(entry.items) if isinstance(entry, _Waiter) else len(entry[0])
        if count and n + size > max_items:
            break
        n += size
        count += 1
    batch = queue[:count]
    del queue[:count]
    return batch


def _deliver(batch: list[_Waiter], call: Callable[[list], Sequence]) -> None:
    flat = [x for w in batch for x in w.items]
    try:
        results = list(call(flat))
    except BaseException as e:
        if len(batch) > 1 and _alone(e):
            for w in batch:
                _deliver([w], call)
            return
        for w in batch:
            w.resolve(None, e)
        if not isinstance(e, Exception):
            raise
        return
    i = 0
    for w in batch:
        w.resolve(results[i : i + len(w.items)], None)
        i += len(w.items)
