"""Broker-level group commit (``broker_adapter.core.group_commit``): concurrent broker calls share one proposal, each
keeps its own validation, dedup, order and errors. Driven by ``test_broker``'s in-memory node double, which
records every proposal it is handed."""

from __future__ import annotations

import asyncio

import pytest

from broker_adapter.core.invisibility import Handled, Outcome
from broker_adapter.core.model import UnknownQueueError
from dledger.errors import InvalidRequestError, NotLeaderError
from tests.broker.test_broker import made, out, receive, run, topic

__all__ = ["made"]  # the fixture, imported for pytest


async def turns(n: int = 5) -> None:
    """Let the loop run a few turns (no timers: nothing here waits for time to pass)."""
    for _ in range(n):
        await asyncio.sleep(0)


@run
async def test_concurrent_sends_are_one_proposal(made):
    broker, node = made
    await topic(broker)
    node.proposals.clear()
    sent = await asyncio.gather(*(broker.send("T", [out(i % 2, bytes([i]))]) for i in range(20)))
    assert node.proposals == [("append", 20)]
    # each call its own answer, in call order: queue offsets follow the order the calls arrived in
    assert [(r.queue_id, r.queue_offset) for (r,) in sent] == [(i % 2, i // 2) for i in range(20)]
    pulled = await broker.pull("T", 0, 0, 100)
    assert [m.body for m in pulled.messages] == [bytes([i]) for i in range(0, 20, 2)]


@run
async def test_calls_gather_while_a_proposal_is_in_flight(made):
    broker, node = made
    await topic(broker)
    node.proposals.clear()
    node.gate = asyncio.Event()
    first = asyncio.create_task(broker.send("T", [out(0, b"first")]))
    await turns()
    assert node.proposals == [("append", 1)]  # proposed at once: nothing else was in flight
    later = [asyncio.create_task(broker.send("T", [out(0, b"x"), out(1, b"y")])) for _ in range(5)]
    await turns()
    assert node.proposals == [("append", 1)]  # gathered behind the one in flight
    node.gate.set()
    await asyncio.gather(first, *later)
    assert node.proposals == [("append", 1), ("append", 10)]
    assert broker.sm.next_offset("T", 0) == 6 and broker.sm.next_offset("T", 1) == 5


@run
async def test_a_sequential_send_is_proposed_without_waiting(made):
    broker, node = made
    await topic(broker)
    node.proposals.clear()
    for i in range(3):
        node.gate = asyncio.Event()
        t = asyncio.create_task(broker.send("T", [out(0, bytes([i]))]))
        await turns()
        assert len(node.proposals) == i + 1  # it reached the node within a few loop turns, alone
        node.gate.set()
        (r,) = await t
        assert r.queue_offset == i
    assert node.proposals == [("append", 1)] * 3


async def _round_then_waiting(broker, node, callers: int) -> asyncio.Task:
    """A proposal of ``callers`` concurrent sends, one more send arriving while it is in flight; returns once
    that proposal finished, with the later send's task."""
    node.proposals.clear()
    node.gate = asyncio.Event()
    first = [asyncio.create_task(broker.send("T", [out(0, bytes([i]))])) for i in range(callers)]
    await turns()
    assert node.proposals == [("append", callers)]  # concurrent: one proposal of them all
    waiting = asyncio.create_task(broker.send("T", [out(1, b"w")]))
    await turns()
    node.gate.set()
    await asyncio.gather(*first)
    await turns()
    return waiting


@run
async def test_under_concurrent_load_waiting_calls_linger_for_others_to_join(made):
    broker, node = made
    await topic(broker)
    waiting = await _round_then_waiting(broker, node, 3)
    assert node.proposals == [("append", 3)]  # the waiting call lingers: three callers were under way
    joined = [asyncio.create_task(broker.send("T", [out(1, b"j")])) for _ in range(2)]
    await turns()
    # the latecomers joined it, and with that the next round is as full as the last: proposed without waiting
    assert node.proposals == [("append", 3), ("append", 3)]
    assert [r.queue_offset for (r,) in await asyncio.gather(waiting, *joined)] == [0, 1, 2]


@run
async def test_a_linger_ends_at_its_time_when_too_few_calls_come(made):
    broker, node = made
    await topic(broker)
    waiting = await _round_then_waiting(broker, node, 4)
    assert node.proposals == [("append", 4)]  # one waits for three more
    await asyncio.sleep(0.2)  # well past [broker] group_commit_linger_ms (4 by default)
    assert node.proposals == [("append", 4), ("append", 1)]
    await waiting


@run
async def test_no_linger_after_one_or_two_callers_or_when_turned_off(made):
    """A lone caller, and a producer session (its batches come one or two to a round), are never held."""
    broker, node = made
    await topic(broker)
    for callers, linger_on in ((1, True), (2, True), (3, False)):
        if not linger_on:
            broker.group_commit._linger_s = 0.0  # [broker] group_commit_linger_ms = 0
        waiting = await _round_then_waiting(broker, node, callers)
        assert node.proposals == [("append", callers), ("append", 1)]  # flushed as the round ended
        await waiting


@run
async def test_a_failing_call_does_not_fail_its_neighbours(made):
    broker, node = made
    node.config.max_body_bytes = 4096
    await topic(broker)
    await broker.send("T", [out(1, b"m")])
    (_, popped, _) = await receive(broker, first=1)
    (d,) = popped.deliveries
    node.proposals.clear()
    node.gate = asyncio.Event()
    blocker = asyncio.create_task(broker.send("T", [out(0, b"a")]))
    await turns()
    good = asyncio.create_task(broker.send("T", [out(0, b"b")]))
    bad_queue = asyncio.create_task(broker.send("T", [out(0, b"c"), out(7, b"d")]))
    too_big = asyncio.create_task(broker.send("T", [out(0, b"z" * 5000)]))
    acks = asyncio.create_task(broker.pops.ack("G", "T", [(1, 0, d.epoch), (1, 0, d.epoch + 99)]))
    good2 = asyncio.create_task(broker.send("T", [out(0, b"e")]))
    await turns()
    node.gate.set()
    with pytest.raises(UnknownQueueError):
        await bad_queue
    with pytest.raises(InvalidRequestError):
        await too_big
    done = await acks
    assert isinstance(done[0], Handled) and done[0].outcome is Outcome.DONE
    assert not (isinstance(done[1], Handled) and done[1].outcome is Outcome.DONE)
    (b,) = await good
    (e,) = await good2
    await blocker
    assert (b.queue_offset, e.queue_offset) == (1, 2)  # nothing of the refused calls was written
    # the good sends and the acks went out together: one submit (it carries commands)
    assert node.proposals == [("append", 1), ("submit", 4)]
    pulled = await broker.pull("T", 0, 0, 10)
    assert [m.body for m in pulled.messages] == [b"a", b"b", b"e"]


@run
async def test_a_refused_proposal_fails_every_call_in_it(made):
    broker, node = made
    await topic(broker)
    node.proposals.clear()
    node.gate = asyncio.Event()
    blocker = asyncio.create_task(broker.send("T", [out(0, b"a")]))
    await turns()
    calls = [
        asyncio.create_task(broker.send("T", [out(0, b"b", producer_id="p", sequence=1)])),
        asyncio.create_task(broker.send("T", [out(1, b"c")])),
        asyncio.create_task(broker.commit_offset("G", "T", 0, 0)),
    ]
    await turns()
    node.leader_id = "n1"  # leadership moves while the calls wait: the node refuses both proposals
    node.gate.set()
    for c in (blocker, *calls):
        with pytest.raises(NotLeaderError):
            await c
    assert node.proposals == [("append", 1), ("submit", 3)]
    node.leader_id = "n0"
    (r,) = await broker.send("T", [out(0, b"b", producer_id="p", sequence=1)])
    assert not r.duplicate and r.queue_offset == 0  # nothing of the refused attempts is remembered


@run
async def test_a_call_cancelled_before_its_proposal_writes_nothing(made):
    broker, node = made
    await topic(broker)
    node.proposals.clear()
    node.gate = asyncio.Event()
    blocker = asyncio.create_task(broker.send("T", [out(0, b"a")]))
    await turns()
    gone = asyncio.create_task(broker.send("T", [out(0, b"gone", producer_id="p", sequence=1)]))
    kept = asyncio.create_task(broker.send("T", [out(0, b"kept")]))
    await turns()
    gone.cancel()
    await turns()
    node.gate.set()
    await blocker
    (k,) = await kept
    assert gone.cancelled() and k.queue_offset == 1
    assert node.proposals == [("append", 1), ("append", 1)]
    (r,) = await broker.send("T", [out(0, b"gone", producer_id="p", sequence=1)])
    assert not r.duplicate  # the cancelled attempt left no in-flight claim behind
