"""RaftLog: the store prefix plus the in-memory tail, across ready/stable and conflicts."""

from __future__ import annotations

import pytest

from dledger.core.membership import Configuration
from dledger.core.messages import SnapshotMeta
from dledger.core.raft_log import LogConflictError, RaftLog
from storage import codec
from storage.errors import Compacted, IndexOutOfRange
from storage.memory import MemoryLogStore


def frames(first: int, terms: list[int], pos: int = 0, chain: int = 0, body: bytes = b"x") -> bytes:
    out = bytearray()
    for k, t in enumerate(terms):
        pos = codec.place(pos, codec.HEADER_SIZE + len(body), 1 << 30)
        chain = codec.encode_into(out, first + k, t, pos, body, chain)
        pos += codec.HEADER_SIZE + len(body)
    return bytes(out)


def persist(log: RaftLog, store: MemoryLogStore) -> None:
    snap, trunc, data = log.take_unstable()
    if snap is not None:
        store.reset_to_snapshot(snap.index, snap.term, snap.chain_crc, snap.end_pos)
    if trunc is not None:
        store.truncate_suffix(trunc)
    if data:
        store.append(data)
    log.stable()


def test_leader_entries_are_encoded_like_the_codec_and_accepted_by_the_store() -> None:
    store = MemoryLogStore(segment_size=4096)
    log = RaftLog(store, 4096)
    first, positions = log.append_new([b"a" * 3000, b"b" * 3000, b""], term=3, magic=codec.MAGIC_NORMAL)
    assert first == 0 and positions == [0, 4096, 4096 + 3048]
    assert log.term(2) == 3 and log.last_index == 2
    persist(log, store)
    t = store.tail()
    assert (t.last_index, t.end_pos, t.chain_crc) == (2, log.end_pos, log.chain_at(2))


def test_reads_come_from_memory_until_stable_and_from_the_store_after() -> None:
    store = MemoryLogStore()
    log = RaftLog(store, 1 << 30, cache_bytes=0)
    log.append_new([b"a", b"b"], 1, codec.MAGIC_NORMAL)
    assert store.last_index == -1 and log.term(1) == 1
    persist(log, store)
    assert log.memory_entries() == 0 and log.term(1) == 1  # now from the store
    data, last = log.frames_from(0, 1 << 20)
    assert last == 1 and data == store.raw(0, 2)


def test_frames_from_respects_max_bytes_but_sends_at_least_one_entry() -> None:
    log = RaftLog(MemoryLogStore(), 1 << 30)
    log.append_new([b"x" * 100] * 10, 1, codec.MAGIC_NORMAL)
    data, last = log.frames_from(2, 300)
    assert last == 3 and len(data) == 2 * 148
    data, last = log.frames_from(2, 10)
    assert last == 2 and len(data) == 148
    assert log.frames_from(10, 10) == (b"", 9)


def test_follower_append_conflict_and_truncation_inside_a_handed_ready() -> None:
    store = MemoryLogStore()
    log = RaftLog(store, 1 << 30)
    f = frames(0, [1, 1, 1])
    assert log.maybe_append(-1, 0, f) == 2
    _snap, trunc, data = log.take_unstable()  # handed to the runtime, not yet stable
    assert data == f and trunc is None
    store.append(data)
    # A new leader overwrites index 1..: the store must drop what the runtime is writing.
    g = frames(1, [2, 2], pos=len(f) // 3, chain=codec.decode_header(f).chain_crc)
    assert log.maybe_append(0, 1, g) == 2
    log.stable()
    _snap, trunc, data = log.take_unstable()
    assert trunc == 1 and data == g
    store.truncate_suffix(trunc)
    store.append(data)
    log.stable()
    assert [store.term(i) for i in range(3)] == [1, 2, 2]


def test_duplicate_or_old_appends_change_nothing() -> None:
    store = MemoryLogStore()
    log = RaftLog(store, 1 << 30)
    f = frames(0, [1, 1, 1])
    log.maybe_append(-1, 0, f)
    persist(log, store)
    assert log.maybe_append(-1, 0, f[: len(f) // 3]) == 0
    assert not log.has_unstable and log.last_index == 2


def test_mismatched_prev_is_refused_and_committed_entries_are_never_truncated() -> None:
    store = MemoryLogStore()
    log = RaftLog(store, 1 << 30)
    log.maybe_append(-1, 0, frames(0, [1, 1]))
    assert log.maybe_append(1, 2, b"") is None
    assert log.maybe_append(5, 1, b"") is None
    log.commit_to(1)
    with pytest.raises(LogConflictError):
        log.maybe_append(0, 1, frames(1, [2]))


def test_malformed_frames_are_refused() -> None:
    log = RaftLog(MemoryLogStore(), 1 << 30)
    f = frames(0, [1, 1])
    with pytest.raises(codec.FrameError):
        log.maybe_append(-1, 0, f[:-3])
    assert log.maybe_append(-1, 0, f) == 1
    with pytest.raises(codec.FrameError):
        log.maybe_append(1, 1, f)  # frames numbered from 0 where 2 is expected


def test_restore_to_a_snapshot_and_compaction_reads() -> None:
    store = MemoryLogStore()
    log = RaftLog(store, 1 << 30)
    log.maybe_append(-1, 0, frames(0, [1, 1]))
    persist(log, store)
    meta = SnapshotMeta(
        index=10, term=3, chain_crc=77, end_pos=5000, conf=Configuration(("a", "b", "c"), ("d",))
    )
    log.restore(meta)
    assert log.configuration == meta.conf and log.conf_index == 10
    assert log.term(10) == 3 and log.last_index == 10 and log.committed == 10
    with pytest.raises(Compacted):
        log.term(5)
    persist(log, store)
    assert store.first_index == 11 and log.term(10) == 3
    assert log.snapshot_meta() == meta
    with pytest.raises(IndexOutOfRange):
        log.term(11)


def test_leader_cache_is_bounded() -> None:
    store = MemoryLogStore()
    log = RaftLog(store, 1 << 30, cache_bytes=1000)
    for _ in range(20):
        log.append_new([b"y" * 200], 1, codec.MAGIC_NORMAL)
        persist(log, store)
        assert log.memory_entries() * 248 <= 1000 + 248
    assert log.term(0) == 1 and log.frames_from(0, 1 << 20)[1] == log.frames_from(0, 1 << 20)[1]


def test_first_index_of_term_and_last_index_with_term_at_most() -> None:
    log = RaftLog(MemoryLogStore(), 1 << 30)
    log.maybe_append(-1, 0, frames(0, [1, 1, 2, 2, 2, 5]))
    assert log.first_index_of_term(2, 0, 4) == 2
    assert log.last_index_with_term_at_most(2, 5) == 4
    assert log.last_index_with_term_at_most(4, 5) == 4
    assert log.last_index_with_term_at_most(0, 5) == -1
