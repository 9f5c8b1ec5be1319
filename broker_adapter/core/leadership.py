"""Whether this node may write for the broker, and when a new leader may answer from its dispatched state.

Writes go through the log on the leader; a follower refuses them with ``NotLeaderError`` naming the leader. A new
leader answers from its dispatched state only once it has applied everything up to its own first entry of the term
(its read barrier), so nothing committed by earlier leaders is missing from its answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dledger.core.messages import Role
from dledger.errors import NotLeaderError, UnavailableError
from dledger.plugins import NodeHandle


class Leadership:
    def __init__(self, node: NodeHandle):
        self._node = node
        self._barrier: tuple[int, int] = (-1, -1)  # (term, index of the leader's first entry in that term)
        self._barrier_passed_term = -1
        # Called with the term whenever ``leader_state`` finds the barrier passed for the first time in a term (the
        # broker starts its delivery loop there: a role change may come before the event loop runs).
        self.on_ready: Callable[[int], None] | None = None

    def role_changed(self, role: Role, term: int) -> None:
        if role is Role.LEADER:
            self._barrier = (term, self._node.log_store.last_index)

    async def leader_state(self, timeout_s: float = 5.0) -> int:
        """The leader's term once its dispatched state includes everything earlier leaders committed."""
        term = self.require_leader()
        if self._barrier_passed_term == term:
            return term
        node = self._node
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            barrier_term, index = self._barrier
            if barrier_term == term and node.metadata().applied_index >= index:
                self._barrier_passed_term = term
                if self.on_ready is not None:
                    self.on_ready(term)
                return term
            if loop.time() >= deadline:
                raise UnavailableError(
                    f"node {node.id} became the leader but has not applied its log up to index {index} yet; "
                    "retry shortly"
                )
            await asyncio.sleep(0.005)
            term = self.require_leader()  # leadership may have moved meanwhile

    def require_leader(self) -> int:
        """The leader's term, or the error a follower answers with."""
        node = self._node
        if node.is_leader():
            return node.term
        leader = node.leader_id
        if leader and leader != node.id:
            raise NotLeaderError(
                leader,
                f"node {node.id} is not the leader; the leader is {leader} at {node.address_of(leader) or '?'}",
            )
        raise UnavailableError(f"node {node.id} is not the leader and no leader is known; retry shortly")
