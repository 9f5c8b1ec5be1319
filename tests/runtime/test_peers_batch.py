"""Peers.handle_batch alone: a batch is stepped at once and answered through one future that the ready
loop's dispatch resolves itself (no task, no gather), in the batch's order."""

from __future__ import annotations

import asyncio
import collections

from dledger.core.messages import AppendEntries, AppendEntriesResponse, Heartbeat, HeartbeatResponse
from dledger.errors import UnavailableError
from dledger.nodeconfig import NodeConfig
from dledger.runtime.peers import Peers


class StubCore:
    def __init__(self):
        self.stepped = []
        self.writing = False  # a Ready taken and not yet advanced (RaftCore.writing)
        self.heartbeats = []  # what take_heartbeats hands out

    def step(self, m):
        self.stepped.append(m)

    def take_heartbeats(self):
        out, self.heartbeats = self.heartbeats, []
        return out

    def has_ready(self):
        return False


def make(tmp_path):
    core = StubCore()
    cfg = NodeConfig("n0", {"n0": "a:1", "n1": "a:2", "n2": "a:3"}, tmp_path / "n0")
    peers = Peers(
        "n0",
        cfg,
        core=lambda: core,
        wake=asyncio.Event(),
        snapshots=None,
        stats=collections.Counter(),
        on_failure=lambda e: None,
    )
    return peers, core


def test_a_batch_is_stepped_at_once_and_answered_in_order_when_dispatched(tmp_path):
    async def run():
        peers, core = make(tmp_path)
        batch = [AppendEntries(1, "n1", "n0", -1, 0, -1), Heartbeat(1, "n1", "n0", -1)]
        answer = peers.handle_batch(batch)
        assert isinstance(answer, asyncio.Future) and core.stepped == batch, "stepped before any await"
        assert not answer.done()
        ae = AppendEntriesResponse(1, "n0", "n1", True, -1)
        hb = HeartbeatResponse(1, "n0", "n1")
        peers.dispatch((hb, ae), peers.take_waiters())
        assert answer.done(), "resolved by dispatch itself, no extra loop turn"
        assert await answer == [ae, hb], "answers in the order of the batch"
        # One message: its waiter resolves the batch's future directly.
        one = peers.handle_batch([Heartbeat(1, "n1", "n0", -1)])
        peers.dispatch((hb,), peers.take_waiters())
        assert one.done() and await one == [hb]

    asyncio.run(run())


def test_a_failed_part_fails_the_batch(tmp_path):
    async def run():
        peers, _ = make(tmp_path)
        answer = peers.handle_batch([AppendEntries(1, "n1", "n0", -1, 0, -1), Heartbeat(1, "n1", "n0", -1)])
        peers.fail_waiters(UnavailableError("stopping"))
        try:
            await answer
        except UnavailableError:
            pass
        else:
            raise AssertionError("the batch's answer should have failed")

    asyncio.run(run())


def test_a_heartbeat_while_the_node_writes_is_answered_at_once(tmp_path):
    """A follower whose write is in progress (a stalled fdatasync) answers its leader's heartbeat without waiting
    for the next Ready (decision 0031); other answers taken with it go to their peers' senders."""

    async def run():
        peers, core = make(tmp_path)
        core.writing = True
        mine, other = HeartbeatResponse(1, "n0", "n1", 5), HeartbeatResponse(1, "n0", "n2")
        core.heartbeats = [other, mine]
        answer = peers.handle_batch([Heartbeat(1, "n1", "n0", -1, context=5)])
        assert answer.done() and await answer == [mine]
        assert not peers.take_waiters(), "no waiter left for the Ready"
        assert peers.queues["n2"].get_nowait() == other and peers.queues["n1"].empty()
        # A batch of more than a heartbeat: its answer goes through the sender, the batch waits for its Ready.
        beat = HeartbeatResponse(1, "n0", "n1", 6)
        core.heartbeats = [beat]
        both = peers.handle_batch(
            [AppendEntries(1, "n1", "n0", -1, 0, -1), Heartbeat(1, "n1", "n0", -1, context=6)]
        )
        assert not both.done() and peers.queues["n1"].get_nowait() == beat
        peers.take_waiters()
        # Not writing: the answer waits for the Ready that persists what it depends on, as before.
        core.writing = False
        later = peers.handle_batch([Heartbeat(1, "n1", "n0", -1)])
        assert not later.done() and len(peers.reply_waiters) == 1

    asyncio.run(run())
