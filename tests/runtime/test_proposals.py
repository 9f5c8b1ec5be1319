"""Proposals alone (real core and ready loop, memory stores): group commit, resolving appends at commit,
failing them when leadership is lost, and the proposers' apply futures."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dledger.core.messages import AppendEntries, AppendEntriesResponse
from dledger.errors import EntryReplacedError, OutcomeUnknownError
from dledger.runtime import ready_loop
from dledger.runtime.proposals import ApplyWaiters
from statemachine.apply_loop import ApplyLoop
from statemachine.counter import Counter, encode_add
from storage.memory import MemoryLogStore
from tests.runtime.pieces import Harness
from tests.statemachine.test_apply_loop import _append

pytestmark = pytest.mark.timeout(30)


def _ack(h: Harness, peer: str = "n1") -> None:
    """``peer`` holds everything the leader has: its acknowledgement commits the leader's log."""
    last = h.log.last_index
    h.core.step(AppendEntriesResponse(h.core.term, peer, h.config.node_id, True, match_index=last))
    h.wake.set()


def test_appends_queued_while_a_write_is_in_flight_go_out_as_one_proposal(tmp_path, monkeypatch):
    monkeypatch.setattr(ready_loop, "INLINE_MAX_PERSIST_S", 0.0)  # every write on the I/O thread

    async def run():
        async with Harness(tmp_path) as h:
            await h.elect()
            h.log.gate = gate = threading.Event()
            first = h.proposals.enqueue([b"first"], None, False)
            while h.io.pending == 0:  # the first proposal's write is on the I/O thread, held there
                await asyncio.sleep(0.001)
            proposals_before = h.stats["proposals"]
            many = [h.proposals.enqueue([b"m%d" % i, b"n%d" % i], None, False) for i in range(30)]
            await asyncio.sleep(0.01)
            assert h.stats["proposals"] == proposals_before, "nothing proposed while the write is in flight"
            gate.set()
            await h.settle()
            assert h.stats["proposals"] == proposals_before + 1, "30 queued appends became one proposal"
            assert h.log.appended[-1] == 60, "one write for all of them"
            _ack(h)
            await h.settle()
            runs = [await asyncio.wait_for(p.future, 5) for p in [first, *many]]
            indexes = [i for r in runs for i in range(r.first_index, r.first_index + len(r.positions))]
            assert indexes == list(range(indexes[0], indexes[0] + 61)), "dense, in the order they were queued"
            for p, r in zip([first, *many], runs, strict=True):
                for k, pos in enumerate(r.positions):
                    assert bytes(h.log.entry(r.first_index + k).body) == p.bodies[k]
                    assert h.log.entry(r.first_index + k).pos == pos

    asyncio.run(run())


def test_combined_prepare_gives_each_body_its_own_append_s_prepare(tmp_path):
    async def run():
        async with Harness(tmp_path) as h:
            await h.elect()
            before = h.stats["proposals"]
            # No await in between: the loop has not run, so both appends land in one proposal.
            stamp = lambda i, pos, body: body[:1] + b"%07d" % i  # noqa: E731 (same length, as prepare must)
            a = h.proposals.enqueue([b"a" + bytes(7), b"b" + bytes(7)], stamp, False)
            c = b"c" + bytes(7)
            b = h.proposals.enqueue([c], None, False)
            await h.settle()
            assert h.stats["proposals"] == before + 1
            _ack(h)
            await h.settle()
            ra, rb = await asyncio.wait_for(a.future, 5), await asyncio.wait_for(b.future, 5)
            assert rb.first_index == ra.first_index + 2
            assert bytes(h.log.entry(ra.first_index).body) == b"a%07d" % ra.first_index
            assert bytes(h.log.entry(ra.first_index + 1).body) == b"b%07d" % (ra.first_index + 1)
            assert bytes(h.log.entry(rb.first_index).body) == c, "an append without prepare is left alone"

    asyncio.run(run())


def test_losing_leadership_fails_proposed_as_unknown_and_queued_as_not_leader(tmp_path):
    async def run():
        async with Harness(tmp_path) as h:
            await h.elect()
            proposed = h.proposals.enqueue([b"p"], None, False)
            await h.settle()  # proposed and written, never acknowledged
            term = h.core.term + 1
            late = h.proposals.enqueue([b"q"], None, False)
            h.core.step(AppendEntries(term, "n2", "n0", -1, 0, -1))  # a newer leader: this node steps down
            h.wake.set()
            await h.settle()
            with pytest.raises(OutcomeUnknownError, match="lost leadership"):
                await asyncio.wait_for(proposed.future, 5)
            with pytest.raises(RuntimeError, match="not leader"):  # never proposed: nothing happened
                await asyncio.wait_for(late.future, 5)

    asyncio.run(run())


def test_apply_waiters_resolve_with_results_or_errors():
    async def scenario():
        log = MemoryLogStore()
        _append(log, [encode_add(5), encode_add(7), b"bad"], term=2)
        waiters = None
        loop = ApplyLoop(Counter(), log, applied_index=-1, on_applied=lambda chunk: waiters.applied(chunk))
        waiters = ApplyWaiters(loop)
        task = asyncio.create_task(loop.run())
        ok = waiters.register(0, 2)
        replaced = waiters.register(1, 1)  # proposed in term 1, but term 2's entry sits at index 1
        bad = waiters.register(2, 2)
        lost = waiters.register(9, 2)
        loop.commit_advanced(2)
        assert (await ok).result == 5
        with pytest.raises(EntryReplacedError, match="replaced"):
            await replaced
        with pytest.raises(ValueError, match="8 bytes"):
            await bad
        with pytest.raises(OutcomeUnknownError, match="before its waiter registered"):
            await waiters.register(1, 2)
        assert waiters.fail_pending("leader stepped down") == 1
        with pytest.raises(OutcomeUnknownError, match="stepped down"):
            await lost
        covered = waiters.register(12, 2)
        waiters.covered(15)
        with pytest.raises(OutcomeUnknownError, match="installed snapshot"):
            await covered
        task.cancel()

    asyncio.run(scenario())
