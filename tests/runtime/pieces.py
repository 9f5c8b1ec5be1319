"""Helpers to drive one runtime piece without a node: a hand-built core, recording stores and peers.

Everything runs on one event loop with memory stores, so a test sees exactly the order in which the piece
persisted and sent."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
from pathlib import Path

from dledger.core.config import RaftConfig
from dledger.core.raft import RaftCore
from dledger.metrics import NodeMetrics
from dledger.nodeconfig import NodeConfig
from dledger.runtime.datadir import DataDir
from dledger.runtime.iothread import IoThread
from dledger.runtime.proposals import Proposals
from dledger.runtime.ready_loop import ReadyLoop
from storage import codec
from storage.errors import DiskFullError
from storage.memory import MemoryLogStore, MemoryMetaStore

RAFT = RaftConfig(pre_vote=False, check_quorum=False)


def frames(first: int, term: int, bodies: list[bytes], pos: int = 0, chain: int = 0) -> bytes:
    out = bytearray()
    for k, b in enumerate(bodies):
        pos = codec.place(pos, codec.HEADER_SIZE + len(b), 1 << 30)
        chain = codec.encode_into(out, first + k, term, pos, b, chain)
        pos += codec.HEADER_SIZE + len(b)
    return bytes(out)


class RecordingLog(MemoryLogStore):
    """Records each append in ``events``; ``full`` refuses appends like a full disk; ``gate`` (a threading
    event), when set up, holds the next append until released; ``sync_gate`` the next sync."""

    def __init__(self, events: list):
        super().__init__()
        self.events = events
        self.full = False
        self.gate: threading.Event | None = None
        self.sync_gate: threading.Event | None = None  # likewise for the next sync
        self.appended: list[int] = []  # entries per append

    def sync(self):
        if self.sync_gate is not None:
            gate, self.sync_gate = self.sync_gate, None
            self.events.append(("sync-blocked",))
            assert gate.wait(10), "the test never released the sync"
        super().sync()
        self.events.append(("sync",))

    def append(self, data):
        if self.gate is not None:
            gate, self.gate = self.gate, None
            assert gate.wait(10), "the test never released the append"
        if self.full:
            raise DiskFullError("no space left on device (simulated)")
        result = super().append(data)
        self.appended.append(len(result))
        self.events.append(("append", len(result)))
        return result


class RecordingMeta(MemoryMetaStore):
    def __init__(self, events: list):
        super().__init__()
        self.events = events

    def put(self, key, value, sync=False):
        self.events.append(("meta_put", key))
        super().put(key, value, sync)

    def save_hard_state(self, hs):
        super().save_hard_state(hs)
        self.events.append(("hard_state", hs.term, hs.vote))


class RecordingPeers:
    """Stands in for ``dledger.runtime.peers.Peers``: records what the ready loop sends, answers waiters."""

    def __init__(self, events: list):
        self.events = events
        self.reply_waiters = []

    def take_waiters(self):
        waiters, self.reply_waiters = self.reply_waiters, []
        return waiters

    def dispatch(self, messages, waiters):
        for m in messages:
            self.events.append(("send", type(m).__name__, m.dst))

        for w in waiters:
            if not w.future.done():
                w.future.set_result(list(messages))

    def send_heartbeats(self, messages):
        """Heartbeats sent while a write is in progress (the ticker, decision 0031)."""
        for m in messages:
            self.events.append(("send-early", type(m).__name__, m.dst, m))


class Harness:
    """A ready loop around a real core of ``node_id`` among ``voters``, with recording stores and peers and a
    real ``Proposals``."""

    def __init__(self, tmp: Path, node_id: str = "n0", voters=("n0", "n1", "n2"), **config):
        self.events: list = []
        self.log = RecordingLog(self.events)
        self.meta = RecordingMeta(self.events)
        peers = {v: f"127.0.0.1:{7000 + i}" for i, v in enumerate(voters)}
        self.config = NodeConfig(node_id, peers, tmp / node_id, raft=RAFT, **config)
        self.data = DataDir(self.config, self.log, self.meta)
        self.io = IoThread(node_id)
        self.wake = asyncio.Event()
        self.stats = collections.Counter()
        self.metrics = NodeMetrics()
        self.core = self.new_core()
        self.peers = RecordingPeers(self.events)
        self.commits: list[int] = []
        self.roles: list[tuple] = []
        self.calls_waiting = 0  # clients' calls waiting on this node for the leader (``Node.serving``)
        self.proposals = Proposals(
            node_id,
            self.config,
            core=lambda: self.core,
            wake=self.wake,
            not_leader=lambda: RuntimeError("not leader"),
            refusal=lambda: self.ready.refusal(),
            stats=self.stats,
            metrics=self.metrics,
        )
        self.proposals.log = self.log
        self.ready = ReadyLoop(
            node_id,
            self.config,
            self.data,
            self.io,
            self.core,
            wake=self.wake,
            proposals=self.proposals,
            peers=self.peers,
            committed=self._committed,
            read_states=lambda states: None,
            watch_role=self._watch_role,
            rebuild_core=self._rebuild,
            stats=self.stats,
            metrics=self.metrics,
            calls_waiting=lambda: self.calls_waiting,
        )

    def new_core(self, applied: int = -1) -> RaftCore:
        cfg = self.config
        return RaftCore(
            cfg.node_id,
            list(cfg.peers),
            self.log,
            self.meta.load_hard_state(),
            cfg.raft,
            random.Random(1),
            applied=applied,
            log_event=lambda s: None,
        )

    def _rebuild(self, applied: int) -> RaftCore:
        self.core = self.new_core(applied)
        self.events.append(("rebuilt",))
        return self.core

    def _committed(self, index: int) -> None:
        self.commits.append(index)
        self.proposals.committed(index)

    def _watch_role(self) -> None:
        self.proposals.on_role(self.core, self.ready.commit_index)
        self.roles.append((self.core.role, self.core.term))

    async def __aenter__(self):
        self.task = asyncio.create_task(self.ready.run())
        return self

    async def __aexit__(self, *exc):
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.ready.shutdown()
        self.io.shutdown(wait=True)

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Let the loop (and the I/O thread) finish what it was woken for: idle at two checks in a row."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        quiet = 0
        while quiet < 2:
            assert asyncio.get_running_loop().time() < deadline, "the ready loop did not settle"
            await asyncio.sleep(0.001)
            idle = not self.wake.is_set() and self.io.pending == 0 and not self.core.has_ready()
            quiet = quiet + 1 if idle else 0

    def step(self, msg) -> asyncio.Future:
        """Step ``msg`` as an inbound call does and return the future of its answer."""
        from dledger.runtime.peers import RESPONSE_TO, ReplyWaiter

        self.core.step(msg)
        fut = asyncio.get_running_loop().create_future()
        self.peers.reply_waiters.append(ReplyWaiter(msg.src, RESPONSE_TO[type(msg)], fut))
        self.wake.set()
        return fut

    async def elect(self) -> None:
        """Make this node the leader of a three-node group by hand (votes from n1)."""
        from dledger.core.messages import RequestVoteResponse, Role

        while self.core.role is not Role.CANDIDATE:
            self.core.tick()
        self.wake.set()
        await self.settle()
        self.core.step(RequestVoteResponse(self.core.term, "n1", self.config.node_id, True))
        self.wake.set()
        await self.settle()
        assert self.core.role is Role.LEADER
