"""The client reports outcomes honestly: backpressure is retried then reported, an append stranded on a leader
that stopped is "outcome unknown" (never success or failure), and retries stay within the deadline."""

from __future__ import annotations

import asyncio

import pytest

from dledger.client import AsyncDLedgerClient
from dledger.core.config import RaftConfig
from dledger.errors import BackpressureError, InvalidRequestError, OutcomeUnknownError, UnavailableError
from tests.runtime.cluster import LocalGroup

pytestmark = pytest.mark.timeout(60)

# Without check-quorum a leader whose followers are gone keeps leading: the tests control when it stops.
NO_STEP_DOWN = RaftConfig(check_quorum=False)


async def isolated_leader(g: LocalGroup):
    leader = await g.leader()
    await asyncio.gather(*(n.stop() for n in g.nodes.values() if n is not leader))
    return leader


def test_backpressure_then_honest_give_up(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, raft=NO_STEP_DOWN, max_pending_entries=5) as g:
            leader = await isolated_leader(g)
            stranded = [asyncio.create_task(leader.append([b"w"])) for _ in range(5)]
            await g.until(lambda: leader.stats["proposed_entries"] == 5, what="5 appends pending")
            with pytest.raises(BackpressureError, match="back off"):
                await leader.append([b"one too many"])
            async with AsyncDLedgerClient([leader.config.address], timeout_s=0.5) as c:
                with pytest.raises(UnavailableError, match="back off"):
                    await c.append(b"retried until the deadline")
                assert c.stats["retries"] >= 2
            await leader.stop()
            for t in stranded:
                with pytest.raises(OutcomeUnknownError):
                    await t

    asyncio.run(run())


def test_append_stranded_on_a_stopping_leader_is_outcome_unknown(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, raft=NO_STEP_DOWN) as g:
            leader = await isolated_leader(g)
            async with AsyncDLedgerClient([leader.config.address], timeout_s=5) as c:
                pending = asyncio.create_task(c.append(b"no quorum"))
                await g.until(lambda: leader.stats["proposed_entries"] >= 1, what="the append is proposed")
                await leader.stop()
                with pytest.raises(OutcomeUnknownError):
                    await pending

    asyncio.run(run())


def test_invalid_requests_are_not_retried(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, max_body_bytes=10) as g:
            await g.leader()
            async with AsyncDLedgerClient(g.addresses, timeout_s=5) as c:
                with pytest.raises(InvalidRequestError, match="max_body_bytes"):
                    await c.append(b"x" * 11)
                assert c.stats["retries"] == 0

    asyncio.run(run())


def test_unreachable_group_fails_within_the_deadline(tmp_path):
    async def run():
        import socket

        # Hold the port (bound, not listening: connections are refused) so no other test's node can take it.
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        try:
            await _expect_unavailable(port)
        finally:
            holder.close()

    async def _expect_unavailable(port):
        async with AsyncDLedgerClient([f"127.0.0.1:{port}"], timeout_s=0.5) as c:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(UnavailableError):
                await c.append(b"nobody home")
            assert loop.time() - t0 < 5  # bounded by the deadline (generous: not a timing assertion on speed)

    asyncio.run(run())


def test_no_leader_known_is_unavailable_and_retried(tmp_path):
    async def run():
        async with LocalGroup(tmp_path) as g:
            leader = await g.leader()
            survivor = next(n for n in g.nodes.values() if n is not leader)
            await asyncio.gather(*(n.stop() for n in g.nodes.values() if n is not survivor))
            await g.until(lambda: survivor.core.leader_id is None, what="the survivor forgets the leader")
            with pytest.raises(UnavailableError, match="no leader is known"):
                await survivor.append([b"x"])
            async with AsyncDLedgerClient([survivor.config.address], timeout_s=2.0, use_stream=False) as c:
                with pytest.raises(UnavailableError, match="no leader is known"):
                    await c.append(b"refused, so retried, never 'outcome unknown'")
                assert c.stats["retries"] >= 1

    asyncio.run(run())
