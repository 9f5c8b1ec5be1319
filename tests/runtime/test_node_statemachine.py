"""A node hosting a state machine: results reach the proposer, every node applies the same entries in order,
the prepare hook sees each entry's place, and applied lag is reported."""

from __future__ import annotations

import asyncio

import pytest

from dledger.errors import InvalidRequestError
from statemachine import kv
from statemachine.apply_loop import Applied
from statemachine.counter import Counter, encode_add
from tests.runtime.cluster import LocalGroup

pytestmark = pytest.mark.timeout(60)


def test_counter_results_and_identical_state_everywhere(tmp_path):
    counters = {}

    def make(pid):
        counters[pid] = Counter()
        return counters[pid]

    async def run():
        async with LocalGroup(tmp_path, state_machine=make) as g:
            leader = await g.leader()
            batches = await asyncio.gather(
                *(leader.submit([encode_add(1), encode_add(2)]) for _ in range(50))
            )
            results = [a.result for batch in batches for a in batch]
            assert sorted(results) == sorted({*results}), "every increment saw a distinct running total"
            assert max(results) == 150
            last = max(a.index for batch in batches for a in batch)
            await g.until(
                lambda: all(n.metadata().applied_index >= last for n in g.nodes.values()), what="applied"
            )
            assert {(c.value, c.applied_count) for c in counters.values()} == {(150, 100)}
            info = leader.metadata()
            assert info.applied_index <= info.commit_index

    asyncio.run(run())


def test_kv_errors_are_per_entry_and_prepare_sees_positions(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, state_machine=lambda pid: kv.KVStore()) as g:
            leader = await g.leader()
            out = await leader.submit([kv.encode_put(b"k", b"v1"), b"Zbad", kv.encode_put(b"k", b"v2")])
            assert isinstance(out[0], Applied) and out[0].result is None
            assert isinstance(out[1], kv.KVCommandError)
            assert out[2].result == b"v1"

            seen = {}

            def prepare(index, pos, body):
                seen[index] = pos
                return body[:-8] + pos.to_bytes(8, "big")

            run_ = await leader.append([kv.encode_put(b"p", bytes(8))] * 3, prepare=prepare)
            assert {run_.first_index + k: p for k, p in enumerate(run_.positions)} == seen
            for index, pos in seen.items():
                body = bytes(leader.log_store.entry(index).body)
                assert int.from_bytes(body[-8:], "big") == pos

    asyncio.run(run())


def test_submit_without_state_machine_is_refused(tmp_path):
    async def run():
        async with LocalGroup(tmp_path) as g:
            leader = await g.leader()
            with pytest.raises(InvalidRequestError, match="no state machine"):
                await leader.submit([b"x"])

    asyncio.run(run())
