"""``dledger.loop_thread.LoopThread``: a blocking client's event loop on its own thread, closed the way
``asyncio.run`` closes its loop."""

from __future__ import annotations

import asyncio
import gc
import threading

from dledger.loop_thread import LoopThread


def test_close_cancels_and_waits_for_the_tasks_left_pending(capsys):
    """A task still pending when the client closes (gRPC's own, finishing a call its channel cancelled) is
    cancelled and runs its cleanup, instead of being destroyed pending with a warning on stderr."""
    lt = LoopThread("test-loop")
    cleaned = threading.Event()
    started = threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    async def spawn() -> asyncio.Task[None]:
        return asyncio.ensure_future(forever())

    task = lt.run(spawn())
    assert started.wait(5)
    lt.close()
    assert cleaned.is_set() and task.cancelled()
    assert lt.loop.is_closed()
    lt.close()  # idempotent
    del task
    gc.collect()
    assert "Task was destroyed" not in capsys.readouterr().err


def test_close_does_not_hang_on_a_loop_stuck_in_a_blocking_call(monkeypatch):
    """A loop blocked by a synchronous call never runs the drain nor the stop: ``close`` gives up after its bound
    and leaves the daemon thread, instead of hanging its caller (a test's teardown, a client's ``with``)."""
    import dledger.loop_thread as loop_thread

    monkeypatch.setattr(loop_thread, "DRAIN_S", 0.2)
    lt = LoopThread("stuck-loop")
    release = threading.Event()
    blocked = threading.Event()

    def block() -> None:
        blocked.set()
        release.wait(30)

    lt.loop.call_soon_threadsafe(block)
    assert blocked.wait(5)
    lt.close()  # returns after its two bounded waits
    assert lt._thread.is_alive() and not lt.loop.is_closed()
    release.set()
    lt._thread.join(5)  # the stop queued by close runs once the call returns
    assert not lt._thread.is_alive()
    lt.close()  # and closing again now closes the loop
    assert lt.loop.is_closed()


def test_the_loop_is_uvloop_and_runs_grpc_aio_calls():
    """The thread's loop is uvloop's (as a node's), and a grpc.aio channel works on it from another thread."""
    import grpc
    import uvloop

    lt = LoopThread("uv-loop")
    try:
        assert isinstance(lt.loop, uvloop.Loop)

        async def call() -> str:
            async with grpc.aio.insecure_channel("127.0.0.1:1") as ch:  # nothing listens: a real call fails
                try:
                    await ch.unary_unary("/x.Y/Z")(b"", timeout=2)
                except grpc.aio.AioRpcError as e:
                    return e.code().name
            return "answered"

        assert lt.run(call()) in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    finally:
        lt.close()
    assert lt.loop.is_closed()
