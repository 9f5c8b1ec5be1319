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
