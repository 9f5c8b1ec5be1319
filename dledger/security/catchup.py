"""Read-your-writes for user changes on every node (docs/security.md, "Users in the log").

Users live in the log, so a node knows a change only once it has applied the entry. Two halves close the window
between the leader's acknowledgement and a lagging node:

- Before a node refuses a call (unknown access key, a signature that does not match, a missing permission), it
  catches up (``CatchUp.refresh``): it learns a linearizable read point, its own read index when it leads, else
  the leader's, asked over ``Security/ReadIndex`` (as etcd forwards a follower's read index to the leader), waits
  until it has applied that index, and the guard checks once more. Every change acknowledged before the call
  arrived is then applied here. Concurrent refusals share one question (at most one in flight and one queued,
  each asked after its callers arrived), so a flood of unknown keys costs one read index per round trip, not one
  per call. An accepted call waits for nothing.
- The leader answers a user command only once every other member of the configuration reports it has applied the
  entry (``Security/WaitApplied``), or the bound passed: members that did not report (down, partitioned, slow)
  are named in the answer (``unconfirmed``) and logged. So after an acknowledged remove or revoke, every node
  that confirmed refuses the old credentials; writes through any node are checked by the leader anyway (a
  follower redirects our clients and forwards RocketMQ calls with the client's signature).

Node-to-node calls go to the members' client port, TLS against the group's CA, signed as the bootstrap admin
(every node holds its key). Both waits are bounded by ``bound_s``; a catch-up that times out refuses as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import grpc

from dledger.connections import AsyncChannels
from dledger.errors import DLedgerError
from dledger.plugins import NodeHandle
from dledger.security.config import ClientSecurity
from dledger.security.rotation import close_later
from dledger.security.service import SERVICE_NAME
from dledger.security.tls import client_channel_credentials

log = logging.getLogger("dledger.security")

_RETRIABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION})


def default_bound_s(election_timeout_max_ms: int) -> float:
    """How long a catch-up or a confirmation may take: twice the maximum election timeout, at least 1 s (a
    leader change during the wait still fits)."""
    return max(1.0, 2 * election_timeout_max_ms / 1000)


def _retrieve(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled():
        fut.exception()


class CatchUp:
    def __init__(self, node: NodeHandle, ca_file: Path, access_key: str, secret_key: str, bound_s: float):
        self._node = node
        self._security = ClientSecurity(ca_file, access_key, secret_key)
        self._channels = AsyncChannels(client_channel_credentials(self._security))
        self.bound_s = bound_s
        self._tick_s = max(0.005, node.config.raft.tick_ms / 1000)
        self._queued: asyncio.Future[int] | None = None  # the next question (a read point), not asked yet
        self._worker: asyncio.Task[None] | None = None
        self.stats = {"catch_ups": 0, "questions": 0, "timeouts": 0}

    # -- refusal direction -----------------------------------------------------------------------------------

    async def refresh(self) -> bool:
        """Wait until this node has applied everything the leader had committed when this was called: True, or
        False when that did not happen within ``bound_s`` (no leader, no quorum, a partitioned node)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.bound_s
        self.stats["catch_ups"] += 1
        if self._queued is None:
            self._queued = loop.create_future()
            self._queued.add_done_callback(_retrieve)
            if self._worker is None or self._worker.done():
                self._worker = loop.create_task(self._work(), name=f"{self._node.id}-security-catch-up")
        question = self._queued
        try:
            async with asyncio.timeout_at(deadline):
                index = await asyncio.shield(question)
                await self._node.wait_applied(index)
        except (TimeoutError, DLedgerError, grpc.aio.AioRpcError, ValueError, KeyError) as e:
            self.stats["timeouts"] += 1
            log.debug("%s: catch-up before a refusal did not complete: %r", self._node.id, e)
            return False
        return True

    async def _work(self) -> None:
        """Ask the queued questions one at a time; each is asked after every caller that joined it arrived."""
        loop = asyncio.get_running_loop()
        while self._queued is not None:
            question, self._queued = self._queued, None
            self.stats["questions"] += 1
            try:
                index = await self._read_point(loop.time() + self.bound_s)
            except Exception as e:  # handed to the callers, who refuse as before
                if not question.done():
                    question.set_exception(e)
            else:
                if not question.done():
                    question.set_result(index)

    async def _read_point(self, deadline: float) -> int:
        """A linearizable read point: this node's read index when it leads, else the leader's."""
        loop = asyncio.get_running_loop()
        node = self._node
        last: BaseException | None = None
        while (remaining := deadline - loop.time()) > 0:
            try:
                if node.is_leader():
                    return await node.read_index(remaining)
                leader = node.leader_id
                address = node.address_of(leader) if leader else None
                if address is not None:
                    return int((await self._call(address, "ReadIndex", {}, remaining))["index"])
            except DLedgerError as e:  # this node lost leadership under the read: ask again
                last = e
            except grpc.aio.AioRpcError as e:
                if e.code() not in _RETRIABLE:
                    raise
                last = e
            await asyncio.sleep(self._tick_s)
        raise TimeoutError(f"no read point from a leader within {self.bound_s:.2f} s: {last!r}")

    # -- acknowledgement direction ---------------------------------------------------------------------------

    async def confirm(self, index: int) -> list[str]:
        """Wait until every other member of the configuration reports it has applied ``index``, at most
        ``bound_s``; the members that did not (sorted)."""
        node = self._node
        info = node.metadata()
        members = sorted({*info.voters, *info.learners} - {node.id})

        async def one(member: str) -> str | None:
            address = node.address_of(member)
            if address is None:
                return member
            try:
                answer = await self._call(address, "WaitApplied", {"index": index}, self.bound_s)
            except (grpc.aio.AioRpcError, ValueError, KeyError) as e:
                log.debug("%s: %s did not confirm index %d: %r", node.id, member, index, e)
                return member
            return None if answer.get("applied") is True else member

        missing = [m for m in await asyncio.gather(*(one(m) for m in members)) if m is not None]
        if missing:
            log.warning(
                "%s: user command at index %d answered before %s confirmed applying it (within %.2f s); until "
                "they apply it they may still accept what it removed (docs/security.md)",
                node.id,
                index,
                ", ".join(missing),
                self.bound_s,
            )
        return missing

    async def wait_applied(self, index: int) -> bool:
        """On a member the leader asks (``Security/WaitApplied``): True once ``index`` is applied here, False
        when that takes longer than ``bound_s``."""
        try:
            async with asyncio.timeout(self.bound_s):
                await self._node.wait_applied(index)
        except TimeoutError:
            return False
        return True

    # -- plumbing --------------------------------------------------------------------------------------------

    async def _call(self, address: str, method: str, request: dict[str, Any], timeout_s: float) -> Any:
        send: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channels.channel(address).unary_unary(
            f"/{SERVICE_NAME}/{method}"
        )
        raw = await send(json.dumps(request).encode(), timeout=max(0.05, timeout_s))
        return json.loads(raw)

    def redial(self) -> None:
        """The CA bundle changed (a reload): dial with what the file holds now; the old channels close once the
        questions on them had time to end (``rotation.close_later``)."""
        old, self._channels = self._channels, AsyncChannels(client_channel_credentials(self._security))
        close_later(old.close)

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        await self._channels.close()
