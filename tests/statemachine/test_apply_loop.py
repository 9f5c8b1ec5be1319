"""The apply loop: in order, exactly once, only normal entries, futures resolved with results or clear errors."""

import asyncio

import pytest

from dledger.errors import OutcomeUnknownError
from statemachine.apply_loop import ApplyLoop, EntryReplacedError
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


def test_futures_resolve_with_results_or_errors():
    async def scenario():
        log = MemoryLogStore()
        _append(log, [encode_add(5), encode_add(7), b"bad"], term=2)
        loop = ApplyLoop(Counter(), log, applied_index=-1)
        task = asyncio.create_task(loop.run())
        ok = loop.register(0, 2)
        replaced = loop.register(1, 1)  # proposed in term 1, but term 2's entry sits at index 1
        bad = loop.register(2, 2)
        lost = loop.register(9, 2)
        loop.commit_advanced(2)
        assert (await ok).result == 5
        with pytest.raises(EntryReplacedError, match="replaced"):
            await replaced
        with pytest.raises(ValueError, match="8 bytes"):
            await bad
        assert loop.fail_pending("leader stepped down") == 1
        with pytest.raises(OutcomeUnknownError, match="stepped down"):
            await lost
        task.cancel()

    asyncio.run(scenario())
