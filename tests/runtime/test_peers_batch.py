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

    def step(self, m):
        self.stepped.append(m)

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
