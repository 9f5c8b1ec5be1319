"""The node's I/O thread (dledger/runtime/iothread.py): one writer, jobs in order, outcomes back on the loop,
``pending`` counting a job until it has really finished."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import pytest

from dledger.runtime.iothread import IoThread


@contextlib.contextmanager
def running() -> Iterator[IoThread]:
    io = IoThread("t")
    try:
        yield io
    finally:
        io.shutdown(wait=True)


def test_jobs_run_one_at_a_time_in_order_off_the_loop() -> None:
    async def run() -> None:
        main = threading.get_ident()
        seen: list[tuple[int, int]] = []

        def job(k: int) -> int:
            seen.append((k, threading.get_ident()))
            return k * k

        with running() as io:
            results = await asyncio.gather(*(io.run(job, k) for k in range(50)))
            assert results == [k * k for k in range(50)]
            assert [k for k, _ in seen] == list(range(50)), "in submission order"
            assert len({t for _, t in seen}) == 1 and seen[0][1] != main, "one thread, not the loop's"
            assert io.pending == 0

    asyncio.run(run())


def test_an_exception_reaches_the_waiter_and_the_thread_goes_on() -> None:
    async def run() -> None:
        def fail() -> None:
            raise OSError(28, "No space left on device")

        with running() as io:
            with pytest.raises(OSError, match="No space left"):
                await io.run(fail)
            assert await io.run(int, "7") == 7 and io.pending == 0

    asyncio.run(run())


def test_a_cancelled_waiter_leaves_the_job_pending_until_it_ends() -> None:
    """The ready loop writes inline only while ``pending`` is 0: a write whose waiter gave up is still being
    made, and the log must keep a single writer."""

    async def run() -> None:
        gate = threading.Event()
        with running() as io:
            waiter = asyncio.ensure_future(io.run(gate.wait, 5))
            await asyncio.sleep(0.01)
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            assert io.pending == 1, "still running"
            gate.set()
            for _ in range(500):
                if io.pending == 0:
                    break
                await asyncio.sleep(0.01)
            assert io.pending == 0

    asyncio.run(run())


def test_shutdown_finishes_what_was_queued_and_refuses_more() -> None:
    async def run() -> None:
        io = IoThread("t")
        done: list[int] = []
        futures = [asyncio.ensure_future(io.run(done.append, k)) for k in range(3)]
        await asyncio.sleep(0)  # the jobs are queued
        io.shutdown(wait=True)
        assert done == [0, 1, 2]
        await asyncio.gather(*futures)
        with pytest.raises(RuntimeError, match="shut down"):
            await io.run(int)

    asyncio.run(run())
