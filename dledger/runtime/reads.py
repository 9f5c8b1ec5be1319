"""Linearizable reads (Raft thesis 6.4): read-index requests waiting for a quorum's confirmation, then for the
state machine to apply up to the read point.

The core answers a ``read_index(context)`` with a read state in a later ``Ready``; the ready loop hands those
on (``read_states_ready``). A read is only valid in the leader's term it was asked in, so a role change fails
the waiting reads (``on_role``, a role listener). Applied-index waiters are resolved as the apply loop reports
progress (``resolve_applied``) or a snapshot install jumps ahead.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable

from dledger.core.messages import Role
from dledger.core.raft import RaftCore
from dledger.errors import DLedgerError, InvalidRequestError, UnavailableError
from dledger.runtime.futures import fail


class Reads:
    """``core()`` is the current core; ``applied()`` the applied index (the commit index without a state
    machine); ``has_state_machine()`` whether there is anything to wait for."""

    def __init__(
        self,
        node_id: str,
        *,
        core: Callable[[], RaftCore | None],
        wake: asyncio.Event,
        not_leader: Callable[[], DLedgerError],
        applied: Callable[[], int],
        has_state_machine: Callable[[], bool],
    ):
        self.id = node_id
        self._core = core
        self._wake = wake
        self._not_leader = not_leader
        self._applied = applied
        self._has_state_machine = has_state_machine
        self._seq = 0
        self._read_waiters: dict[
            int, asyncio.Future[int]
        ] = {}  # read-index context -> future of the read index
        self._applied_waiters: list[tuple[int, int, asyncio.Future[int]]] = []  # heap of (index, seq, future)

    async def read_index(self, timeout_s: float) -> int:
        """Confirm leadership with a quorum, then wait until the state machine has applied the commit index
        the leader had when asked; return that index."""
        core = self._core()
        if core is None or core.role is not Role.LEADER:
            raise self._not_leader()
        loop = asyncio.get_running_loop()
        self._seq += 1
        context = self._seq
        fut: asyncio.Future[int] = loop.create_future()
        self._read_waiters[context] = fut
        try:
            core.read_index(context)
            self._wake.set()
            async with asyncio.timeout(timeout_s):
                index = await fut
                await self.wait_applied(index)
        except TimeoutError:
            raise UnavailableError(
                f"node {self.id} could not confirm its leadership with a quorum within {timeout_s:.2f} s; retry"
            ) from None
        finally:
            self._read_waiters.pop(context, None)
        return index

    def read_states_ready(self, read_states: tuple[tuple[int, int], ...]) -> None:
        for context, index in read_states:
            fut = self._read_waiters.get(context)
            if fut is not None and not fut.done():
                fut.set_result(index)

    def on_role(self, role: Role | None, term: int) -> None:
        """Role listener: a read index is only valid in the leader's term it was asked in (``role`` None: the
        node is shutting down)."""
        if not self._read_waiters:
            return
        err = self._not_leader() if role is not None else UnavailableError(f"node {self.id} is shutting down")
        if role is Role.LEADER:
            err = UnavailableError(f"node {self.id} changed term during the read; retry")
        for fut in self._read_waiters.values():
            fail(fut, err)

    async def wait_applied(self, index: int) -> None:
        if self._applied() >= index:
            return
        if not self._has_state_machine():
            raise InvalidRequestError(f"node {self.id} runs no state machine to wait for")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._applied_waiters, (index, self._seq, fut))
        await fut

    def resolve_applied(self, applied_index: int) -> None:
        waiters = self._applied_waiters
        while waiters and waiters[0][0] <= applied_index:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(applied_index)
