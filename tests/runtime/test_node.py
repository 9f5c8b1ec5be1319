"""The node runtime in one process (real gRPC, memory stores): group commit, persist-before-send, errors."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dledger.client import AsyncDLedgerClient
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    RequestVote,
    RequestVoteResponse,
    Role,
)
from dledger.errors import InvalidRequestError, NotFoundError, NotLeaderError
from storage import codec
from storage.errors import StorageError
from storage.memory import MemoryLogStore, MemoryMetaStore
from tests.runtime.cluster import LocalGroup

pytestmark = pytest.mark.timeout(60)


def test_group_commit_replicates_identical_frames(tmp_path):
    async def run():
        async with LocalGroup(tmp_path) as g:
            leader = await g.leader()
            inline_before = leader.stats["persists_inline"]
            async with AsyncDLedgerClient(g.addresses) as c:
                results = await asyncio.gather(*(c.append(b"%05d" % i + b"x" * 1000) for i in range(400)))
                idx = sorted(r.index for r in results)
                assert idx == list(range(idx[0], idx[0] + 400)), "appends got dense, distinct indexes"
                # Group commit: 400 concurrent appends became far fewer proposals (one write + fsync each).
                assert leader.stats["proposed_entries"] >= 400
                assert leader.stats["proposals"] < 100
                last = idx[-1]
                # The core may learn the commit index before its entries reach storage: wait for the node's view.
                await g.until(
                    lambda: all(n.metadata().commit_index >= last for n in g.nodes.values()), what="commit"
                )
                # Small appends are written on the nodes' loops (memory stores: fast, idle I/O thread); the
                # leader's large group-commit batches went to its I/O thread.
                assert all(n.stats["persists_inline"] > 0 for n in g.nodes.values() if n is not leader)
                for _ in range(5):
                    await c.append(b"small")
                assert leader.stats["persists_inline"] > inline_before
                raws = {pid: n.log_store.raw(0, last + 1) for pid, n in g.nodes.items()}
                assert len(set(raws.values())) == 1, "every node holds byte-identical frames"
                for r in results[:20]:
                    got = await c.get(r.index)
                    assert got.pos == r.pos and got.term == r.term
                    # One segment (1 GiB) holds the whole log, so a position is an offset into the raw frames.
                    assert codec.decode(raws["n0"], r.pos).index == r.index

    asyncio.run(run())


def test_bad_appends_are_refused_before_proposing(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, max_pending_entries=5, max_body_bytes=2048) as g:
            leader = await g.leader()
            follower = next(n for n in g.nodes.values() if n is not leader)
            with pytest.raises(InvalidRequestError, match="empty batch"):
                await leader.append([])
            with pytest.raises(InvalidRequestError, match="limit is 2048"):
                await leader.append([b"x" * 2049])
            with pytest.raises(InvalidRequestError, match="max_pending_entries"):
                await leader.append([b"x"] * 6)
            await g.until(lambda: follower.core.leader_id == leader.id, what="follower knows the leader")
            with pytest.raises(NotLeaderError) as ei:
                await follower.append([b"x"])
            assert leader.id in str(ei.value) and leader.config.address in str(ei.value)
            assert follower.leader_address() == leader.config.address
            with pytest.raises(NotFoundError, match="not committed"):
                follower.get(10_000)
            with pytest.raises(InvalidRequestError):
                follower.get(-1)
            assert leader.stats["proposed_entries"] == 0

    asyncio.run(run())


# -- persist before send -------------------------------------------------------------------------------------------


class Trace:
    """Events from every node, in the order they happened (appends are atomic under the GIL)."""

    def __init__(self):
        self.events: list[tuple] = []
        self.lock = threading.Lock()

    def add(self, *event) -> None:
        with self.lock:
            self.events.append(event)


class SlowRecordingLog(MemoryLogStore):
    """A log that takes a while to persist and records when each write finished."""

    def __init__(self, node: str, trace: Trace):
        super().__init__()
        self._node, self._trace = node, trace

    def append(self, frames):
        time.sleep(
            0.003
        )  # fault injection: a slow disk widens any window where a message could overtake a write
        positions = super().append(frames)
        self._trace.add("append", self._node, self.last_index)
        return positions

    def truncate_suffix(self, index):
        super().truncate_suffix(index)
        self._trace.add("append", self._node, self.last_index)


class SlowRecordingMeta(MemoryMetaStore):
    def __init__(self, node: str, trace: Trace):
        super().__init__()
        self._node, self._trace = node, trace

    def save_hard_state(self, hs):
        time.sleep(0.003)
        super().save_hard_state(hs)
        self._trace.add("hs", self._node, hs.term, hs.vote)


def violations(events: list[tuple]) -> list[str]:
    """Every message must follow the writes it depends on, on the node that sent it."""
    hs: dict[str, list[tuple[int, str | None]]] = {}
    last: dict[str, int] = {}
    bad = []
    for ev in events:
        if ev[0] == "hs":
            hs.setdefault(ev[1], []).append((ev[2], ev[3]))
        elif ev[0] == "append":
            last[ev[1]] = ev[2]
        elif ev[0] == "send":
            node, m = ev[1], ev[2]
            saved = hs.get(node, [])
            if isinstance(m, RequestVoteResponse) and m.granted and not m.pre_vote:
                if (m.term, m.dst) not in saved:
                    bad.append(f"{node} granted its vote to {m.dst} at term {m.term} before persisting it")
            elif isinstance(m, RequestVote) and not m.pre_vote:
                if (m.term, node) not in saved:
                    bad.append(f"{node} asked for votes at term {m.term} before persisting its own vote")
            elif isinstance(m, AppendEntriesResponse) and m.success:
                if last.get(node, -1) < m.match_index:
                    bad.append(f"{node} acknowledged index {m.match_index} holding only {last.get(node, -1)}")
            elif isinstance(m, AppendEntries) and last.get(node, -1) < m.leader_commit:
                # A leader may send entries while it writes them itself (Raft thesis 10.2.1), but it never
                # announces a commit index beyond what it holds.
                bad.append(f"{node} announced commit {m.leader_commit} holding only {last.get(node, -1)}")
    return bad


def test_violation_checker_catches_an_early_message():
    early_commit = AppendEntries(1, "n0", "n1", 4, 1, leader_commit=5)
    assert violations([("append", "n0", 4), ("send", "n0", early_commit)])
    assert not violations([("append", "n0", 5), ("send", "n0", early_commit)])
    ack = AppendEntriesResponse(1, "n1", "n0", True, match_index=5)
    assert violations([("append", "n1", 4), ("send", "n1", ack)])
    assert not violations([("append", "n1", 5), ("send", "n1", ack)])
    vote = RequestVoteResponse(2, "n1", "n0", True)
    assert violations([("send", "n1", vote), ("hs", "n1", 2, "n0")])
    assert not violations([("hs", "n1", 2, "n0"), ("send", "n1", vote)])


def test_persist_before_send(tmp_path):
    trace = Trace()

    async def run():
        g = LocalGroup(
            tmp_path, stores=lambda pid: (SlowRecordingLog(pid, trace), SlowRecordingMeta(pid, trace))
        )
        for pid, node in g.nodes.items():
            # Answers leave a node when its servicer gets them back: record them there. The servicer looks
            # these methods up per call, so instance attributes intercept them.
            one, many = node.handle_message, node.handle_batch

            async def answered(msg, _inner=one, _pid=pid):
                replies = await _inner(msg)
                for r in replies:
                    trace.add("send", _pid, r)
                return replies

            async def answered_batch(msgs, _inner=many, _pid=pid):
                replies = await _inner(msgs)
                for r in replies:
                    trace.add("send", _pid, r)
                return replies

            node.handle_message = answered
            node.handle_batch = answered_batch
        await g.start()
        try:
            for pid, node in g.nodes.items():
                transport = node.transport
                call, deliver = transport.call, transport.deliver

                async def sent(msg, _call=call, _pid=pid):
                    trace.add("send", _pid, msg)
                    return await _call(msg)

                async def piped(dst, msgs, _deliver=deliver, _pid=pid):
                    for m in msgs:
                        trace.add("send", _pid, m)
                    return await _deliver(dst, msgs)

                transport.call = sent
                transport.deliver = piped
            await g.leader()
            async with AsyncDLedgerClient(g.addresses) as c:
                await asyncio.gather(*(c.append(b"y" * 200) for _ in range(300)))
            # Force a new election so that votes are exercised with the tracing in place too.
            leader = await g.leader()
            other = next(p for p in g.nodes if p != leader.id)
            async with AsyncDLedgerClient(g.addresses) as c:
                await c.transfer_leadership(other)
                await c.append(b"after transfer")
        finally:
            await g.stop()

    asyncio.run(run())
    sends = [e for e in trace.events if e[0] == "send"]
    assert any(isinstance(e[2], AppendEntriesResponse) and e[2].success for e in sends)
    assert any(isinstance(e[2], RequestVoteResponse) and e[2].granted and not e[2].pre_vote for e in sends)
    assert violations(trace.events) == []


class AdjustableSlowLog(MemoryLogStore):
    """A log whose writes take ``delay`` seconds (a disk stalling under load)."""

    delay = 0.0

    def append(self, frames):
        if self.delay:
            time.sleep(self.delay)
        return super().append(frames)


def test_a_follower_busy_writing_does_not_start_an_election(tmp_path):
    """Writes longer than the whole election timeout run off the loop, so the follower keeps stepping the
    leader's messages (each one proof of life) and never campaigns; the group keeps committing."""
    logs: dict[str, AdjustableSlowLog] = {}

    def stores(pid):
        logs[pid] = AdjustableSlowLog()
        return logs[pid], MemoryMetaStore()

    async def run():
        async with LocalGroup(tmp_path, stores=stores) as g:
            leader = await g.leader()
            term = leader.core.term
            slow = next(p for p in g.nodes if p != leader.id)
            logs[slow].delay = 0.4  # above election_timeout_max_ms (300 ms)
            async with AsyncDLedgerClient(g.addresses) as c:
                for _ in range(10):
                    await asyncio.gather(*(c.append(b"z" * 100) for _ in range(20)))
                top = (await c.append(b"last")).index
            await g.until(lambda: g.nodes[slow].core.commit_index >= top, timeout_s=30, what="slow follower")
            assert all(n.core.term == term for n in g.nodes.values()), "nobody started an election"
            assert g.nodes[slow].stats["persists"] >= 2

    asyncio.run(run())


class BreakableLog(MemoryLogStore):
    broken = False

    def append(self, frames):
        if self.broken:
            raise StorageError("injected: the disk went away")
        return super().append(frames)


def test_a_node_whose_storage_fails_stops_and_says_why(tmp_path):
    logs: dict[str, BreakableLog] = {}

    def stores(pid):
        logs[pid] = BreakableLog()
        return logs[pid], MemoryMetaStore()

    async def run():
        async with LocalGroup(tmp_path, stores=stores) as g:
            leader = await g.leader()
            victim = next(n for n in g.nodes.values() if n is not leader)
            logs[victim.id].broken = True
            # Through the healthy nodes only: an append sent to the victim as it stops is, rightly, of unknown
            # outcome (its stream breaks), which is not what this test is about.
            healthy = [a for pid, a in g.peers.items() if pid != victim.id]
            async with AsyncDLedgerClient(healthy) as c:
                r = await c.append(b"committed by the two healthy nodes")
                await asyncio.wait_for(victim.wait_stopped(), 10)
                assert isinstance(victim.failure, StorageError)
                assert (await c.get(r.index)).body == b"committed by the two healthy nodes"

    asyncio.run(run())


def test_a_second_node_on_the_same_data_directory_refuses_to_start(tmp_path):
    """Two processes writing one log would corrupt it: the data directory is locked while a node has it open."""
    from dledger.errors import UnavailableError
    from dledger.group import free_ports
    from dledger.nodeconfig import NodeConfig
    from dledger.runtime.node import Node

    async def run():
        (port,) = free_ports(1)
        config = NodeConfig("n0", {"n0": f"127.0.0.1:{port}"}, tmp_path / "n0")
        first = Node(config)
        await first.start()
        try:
            second = Node(NodeConfig("n0", {"n0": "127.0.0.1:1"}, tmp_path / "n0"), serve=False)
            with pytest.raises(UnavailableError, match=r"in use by another node process \(pid \d+\)"):
                await second.start()
            assert first.failure is None
            for _ in range(1000):  # a group of one elects itself
                if first.core.role is Role.LEADER:
                    break
                await asyncio.sleep(0.01)
            await first.append([b"still the only writer"])
        finally:
            await first.stop()
        again = Node(config)
        await again.start()  # the lock went with the node that held it
        try:
            assert again.log_store.last_index >= 1
        finally:
            await again.stop()

    asyncio.run(run())
