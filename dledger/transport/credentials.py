"""Retiring a peer transport's channels after its TLS credentials changed (a certificate reload: SIGHUP or
``dledger cert reload``, dledger/security/rotation.py; docs/security.md, "Rotating certificates").

``GrpcPeerTransport.set_credentials`` (grpc.py) dials every peer anew with the new credentials at once; what was
open on the old channels is handed here. A replication pipe is half-closed, so the peer answers what it already
received and ends the stream; the old channels close once that is done, or after the longest a call may take
(``drain_s``). Kept apart from grpc.py, which moves Raft's messages, because a reload is rare and has its own
order of closing (one module per concept).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

import grpc


class Pipe(Protocol):
    """A replication stream to a peer (grpc.py's ``_Pipe``)."""

    @property
    def call(self) -> grpc.aio.StreamStreamCall[bytes, Any]: ...

    async def wait_ended(self) -> None: ...

    async def close(self) -> None: ...


class Retiring:
    """The pipes and channels replaced by new credentials, closing in tasks of their own (held here: the loop
    keeps only weak references to tasks)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def retire(self, pipes: Sequence[Pipe], channels: Sequence[grpc.aio.Channel], drain_s: float) -> None:
        """Half-close ``pipes``, wait until their peers ended them (at most ``drain_s``), then close them and
        ``channels``."""
        task = asyncio.get_running_loop().create_task(
            _retire(pipes, channels, drain_s), name="retire-peer-channels"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel(self) -> None:
        """The transport closes: stop waiting for the peers (the pipes and channels are closed all the same)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _retire(pipes: Sequence[Pipe], channels: Sequence[grpc.aio.Channel], drain_s: float) -> None:
    try:
        for pipe in pipes:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                await pipe.call.done_writing()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                await asyncio.gather(*(p.wait_ended() for p in pipes))
    finally:
        for pipe in pipes:
            await pipe.close()
        for channel in channels:
            await channel.close()
