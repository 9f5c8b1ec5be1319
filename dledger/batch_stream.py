"""One bidirectional stream to one node, shared by concurrent callers: the client side (``BatchStream``) and the
server side (``answer_each``) of the log's ``AppendStream`` and of a plugin's streams built the same way (a
broker's producer session).

A writer task packs every call waiting in the queue (up to ``max_pack`` items) into one stream message, numbered;
the node answers each message once, as one batch, and the reader hands each caller its slice of the answer, or
the batch's error. One gRPC call per item would cap a small machine at a few thousand calls a second; this way
many concurrent callers cost about one message per round trip. If the stream breaks, calls already written have
an unknown outcome (``OutcomeUnknownError``) and calls not yet written fail as never sent (safe to retry), or all
as never sent when gRPC could not reach the node at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Sequence,
)
from typing import Any, Final, Generic, Protocol, TypeVar

import grpc

from dledger import timeline
from dledger.errors import DLedgerError, OutcomeUnknownError, UnavailableError
from dledger.transport import convert

T = TypeVar("T")
R = TypeVar("R")


class StreamCall(Protocol):
    """What this needs of a ``grpc.aio`` stream-stream call."""

    async def write(self, request: Any) -> None: ...

    def __aiter__(self) -> Any: ...

    async def code(self) -> grpc.StatusCode: ...

    async def details(self) -> str: ...

    def cancel(self) -> bool: ...


# Statuses that end a stream before any of its requests ran: a refusal, not a broken connection.
_REFUSED: Final = frozenset(
    {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED}
)

SWEEP_S: Final = 0.05  # how often a stream fails the calls past their deadline

# (request id, the batch's error or None, one result per item of the batch)
Answer = tuple[int, DLedgerError | None, Sequence[R]]


class BatchStream(Generic[T, R]):
    """``call`` opens the stream; ``request(id, items)`` builds one stream message; ``answer(response)`` reads
    one back. ``submit(items)`` returns the callers' own results, in order."""

    def __init__(
        self,
        call: StreamCall,
        address: str,
        max_pack: int,
        request: Callable[[int, list[T]], Any],
        answer: Callable[[Any], Answer[R]],
    ):
        self.address = address
        self._call = call
        self._request = request
        self._answer = answer
        self._queue: list[tuple[list[T], asyncio.Future[Sequence[R]]]] = []
        self._has_work = asyncio.Event()
        self._inflight: dict[int, list[tuple[int, asyncio.Future[Sequence[R]]]]] = {}
        self._ids = itertools.count(1)
        self._max_pack = max_pack
        self.broken: BaseException | None = None
        # (deadline, future) of the calls given a time limit, swept by one task (``_sweep``): a timer per call
        # (``asyncio.timeout``) cost the caller's process more than packing and answering the call.
        self._deadlines: list[tuple[float, asyncio.Future[Sequence[R]]]] = []
        self._sweeper: asyncio.Task[None] | None = None
        self._writer = asyncio.create_task(self._write_loop())
        self._reader = asyncio.create_task(self._read_loop())

    async def submit(self, items: list[T], within_s: float | None = None) -> Sequence[R]:
        """The items' results, in order. With ``within_s``, no answer by then raises ``TimeoutError`` (within
        about ``SWEEP_S`` more): the items may still be written and carried out."""
        if self.broken is not None:
            raise UnavailableError(f"{self.address}: stream closed") from self.broken
        timeline.mark("client.submit")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Sequence[R]] = loop.create_future()
        self._queue.append((items, fut))
        self._has_work.set()
        if within_s is not None:
            self._deadlines.append((loop.time() + within_s, fut))
            if self._sweeper is None:
                self._sweeper = asyncio.create_task(self._sweep())
        results = await fut
        timeline.mark("client.done")
        return results

    async def _sweep(self) -> None:
        """Fail the calls past their deadline, every ``SWEEP_S`` while any call has one."""
        loop = asyncio.get_running_loop()
        try:
            while self._deadlines:
                await asyncio.sleep(SWEEP_S)
                now = loop.time()
                keep = []
                for deadline, fut in self._deadlines:
                    if fut.done():
                        continue
                    if deadline <= now:
                        fut.set_exception(TimeoutError())
                    else:
                        keep.append((deadline, fut))
                self._deadlines = keep
        finally:
            self._sweeper = None

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._has_work.wait()
                self._has_work.clear()
                while self._queue:
                    batch, n = [], 0
                    while self._queue and (n == 0 or n + len(self._queue[0][0]) <= self._max_pack):
                        item = self._queue.pop(0)
                        batch.append(item)
                        n += len(item[0])
                    rid = next(self._ids)
                    self._inflight[rid] = [(len(b), f) for b, f in batch]
                    await self._call.write(self._request(rid, [x for b, _ in batch for x in b]))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            await self._break_from_call()
        except asyncio.CancelledError:
            self._break(UnavailableError("client closed"))
            raise

    async def _read_loop(self) -> None:
        try:
            async for resp in self._call:
                timeline.mark("client.answer")
                rid, err, results = self._answer(resp)
                waiting = self._inflight.pop(rid, None)
                if waiting is None:
                    continue
                i = 0
                for n, f in waiting:
                    if not f.done():
                        if err is not None:
                            f.set_exception(err)
                        else:
                            f.set_result(results[i : i + n])
                    i += n
            await self._break_from_call()
        except grpc.aio.AioRpcError:
            await self._break_from_call()
        except asyncio.CancelledError:
            self._break(UnavailableError("client closed"))
            raise

    async def _break_from_call(self) -> None:
        """The stream ended: learn why from the call's final status, then fail what waits accordingly."""
        code = await self._call.code()
        details = await self._call.details()
        if code in _REFUSED:  # the node refused the stream itself (its guard, or no such method): nothing ran
            self._break(convert.error_from_status(code, details), refused=True)
            return
        never = code is grpc.StatusCode.UNAVAILABLE and convert.never_sent(details)
        self._break(UnavailableError(f"{self.address}: stream ended with {code.name}: {details}"), never)

    def _break(self, cause: BaseException, never_sent: bool = False, refused: bool = False) -> None:
        if self.broken is None:
            self.broken = cause
        for waiting in self._inflight.values():
            for _, f in waiting:
                if f.done():
                    continue
                if refused:
                    f.set_exception(cause)
                elif never_sent:
                    f.set_exception(UnavailableError(f"{self.address} is unreachable; the call was not sent"))
                else:
                    f.set_exception(
                        OutcomeUnknownError(
                            f"connection to {self.address} broke after the call was sent: it may or may not "
                            f"have been carried out ({cause})"
                        )
                    )
        self._inflight.clear()
        for _, f in self._queue:
            if not f.done():
                f.set_exception(
                    cause
                    if refused
                    else UnavailableError(f"{self.address}: stream broke before the call was sent")
                )
        self._queue.clear()

    async def close(self) -> None:
        tasks = [self._writer, self._reader, *([self._sweeper] if self._sweeper is not None else [])]
        for t in tasks:
            t.cancel()
        self._call.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


Q = TypeVar("Q")
A = TypeVar("A")


class Cancellable(Protocol):
    """What a stream's reader leaves in flight: tasks, or futures of answers."""

    def cancel(self) -> object: ...


async def _await_reader(reader: asyncio.Task[None]) -> None:
    await reader  # surfaces a reader failure (e.g. a broken stream) instead of hiding it


async def queued_answers(
    reader: Coroutine[Any, Any, None],
    out: asyncio.Queue[A | None],
    in_flight: Collection[Cancellable],
    end: Callable[[asyncio.Task[None]], Awaitable[None]] = _await_reader,
) -> AsyncGenerator[A, None]:
    """The server side of a stream whose ``reader`` handles the requests and queues answers on ``out`` (None:
    no more), in order; then ``end(reader task)``. However the call ends, the reader and the work it left
    ``in_flight`` are cancelled. Iterate it under ``contextlib.aclosing`` so that happens when the call does."""
    reader_task = asyncio.create_task(reader)
    try:
        while True:
            item = await out.get()
            if item is None:
                break
            timeline.mark("stream.answer")
            yield item
        await end(reader_task)
    finally:
        reader_task.cancel()
        for f in list(in_flight):
            f.cancel()


async def answer_each(
    requests: AsyncIterator[Q], handle: Callable[[Q], Awaitable[A]]
) -> AsyncGenerator[A, None]:
    """``queued_answers`` for a stream of independent requests: each is handled as it arrives (so concurrent
    ones share what the node batches, its group commit), and each answer is sent as it is ready. ``handle``
    answers a refused request with its error rather than raising; what it raises ends the stream. When the
    client closes its side, the answers still due are sent before the stream ends. Iterate it under
    ``contextlib.aclosing``."""
    out: asyncio.Queue[A | None] = asyncio.Queue()
    pending: set[asyncio.Task[None]] = set()

    async def one(request: Q) -> None:
        out.put_nowait(await handle(request))

    async def reader() -> None:
        try:
            async for request in requests:
                timeline.mark("stream.request")
                t = asyncio.create_task(one(request))
                pending.add(t)
                t.add_done_callback(pending.discard)
            while pending:
                await asyncio.gather(*list(pending))
        finally:
            out.put_nowait(None)

    async with contextlib.aclosing(queued_answers(reader(), out, pending)) as answers:
        async for answer in answers:
            yield answer
