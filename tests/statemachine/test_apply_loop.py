"""The apply loop: in order, exactly once, only normal entries, each chunk reported with its results."""

import asyncio

from statemachine.apply_loop import ApplyLoop
from statemachine.counter import Counter, encode_add
from storage import codec
from storage.memory import MemoryLogStore


def _append(log, bodies, term=1, magic=codec.MAGIC_NORMAL):
    tail = log.tail()
    buf = bytearray()
    chain, pos, index = tail.chain_crc, tail.end_pos, tail.last_index
    for b in bodies:
        index += 1
        pos = codec.place(pos, codec.HEADER_SIZE + len(b), log.segment_size)
        chain = codec.encode_into(buf, index, term, pos, b, chain, magic)
        pos += codec.HEADER_SIZE + len(b)
    log.append(bytes(buf))


def test_applies_in_order_in_bounded_chunks_and_skips_noops():
    log = MemoryLogStore()
    _append(log, [b""], magic=codec.MAGIC_NOOP)
    _append(log, [encode_add(1)] * 10)
    sm = Counter()
    loop = ApplyLoop(sm, log, applied_index=-1, max_batch_entries=4)
    loop.commit_advanced(6)
    assert loop.lag == 7
    first = loop.apply_available()
    assert [a.index for a in first] == [0, 1, 2, 3] and first[0].result is None and first[1].result == 1
    while loop.apply_available():
        pass
    assert loop.applied_index == 6 and sm.value == 6 and loop.lag == 0
    assert loop.apply_available() == []  # nothing past the commit index is applied
    loop.commit_advanced(3)  # a stale commit report never moves anything back
    assert loop.commit_index == 6


def test_restart_resumes_after_applied_index_without_double_apply():
    log = MemoryLogStore()
    _append(log, [encode_add(1)] * 8)
    sm = Counter()
    sm.value, sm.applied_count = 4, 4  # as loaded from a snapshot taken at index 3
    loop = ApplyLoop(sm, log, applied_index=3)
    loop.commit_advanced(7)
    while loop.apply_available():
        pass
    assert (sm.value, sm.applied_count) == (8, 8)


def test_each_chunk_is_reported_with_its_results_once_applied():
    """The runtime resolves proposers from this report: every entry, no-ops included, with the state machine's
    result or the error it returned, after ``applied_index`` covers the chunk."""
    log = MemoryLogStore()
    _append(log, [b""], magic=codec.MAGIC_NOOP)
    _append(log, [encode_add(5), b"bad", encode_add(7)], term=2)
    reports = []

    def on_applied(chunk):
        reports.append((loop.applied_index, [(a.index, a.term, a.result) for a in chunk]))

    loop = ApplyLoop(Counter(), log, applied_index=-1, max_batch_entries=2, on_applied=on_applied)
    loop.commit_advanced(3)
    while loop.apply_available():
        pass
    assert [(applied, [(i, t) for i, t, _ in chunk]) for applied, chunk in reports] == [
        (1, [(0, 1), (1, 2)]),
        (3, [(2, 2), (3, 2)]),
    ]
    results = [r for _, chunk in reports for _, _, r in chunk]
    assert results[0] is None and results[1] == 5 and results[3] == 12
    assert isinstance(results[2], ValueError) and "8 bytes" in str(results[2])


def test_reset_to_snapshot_moves_applied_and_commit_forward_only():
    log = MemoryLogStore()
    loop = ApplyLoop(Counter(), log, applied_index=4)
    loop.reset_to_snapshot(9)
    assert (loop.applied_index, loop.commit_index) == (9, 9)
    loop.reset_to_snapshot(3)
    assert (loop.applied_index, loop.commit_index) == (9, 9)


def test_run_applies_as_commits_arrive():
    async def scenario():
        log = MemoryLogStore()
        _append(log, [encode_add(2)] * 3)
        sm = Counter()
        loop = ApplyLoop(sm, log, applied_index=-1)
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0)
        loop.commit_advanced(2)
        for _ in range(10):
            await asyncio.sleep(0)
        task.cancel()
        assert loop.applied_index == 2 and sm.value == 6

    asyncio.run(scenario())
