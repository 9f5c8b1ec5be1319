"""The LogStore contract, run against MemoryLogStore and FileLogStore (both flush policies).

Each test states one promise of ``storage.api.LogStore``; the file store must also keep it across reopen.
"""

from __future__ import annotations

import pytest

from storage import codec
from storage.api import LogPosition, LogStore
from storage.errors import Compacted, IndexOutOfRange, StoreClosedError
from tests.storage.conftest import SEGMENT
from tests.storage.helpers import append, body_for, build


def now_and_reopened(factory, store):
    """Yield the store, then the same log reopened (checks run on the live store and after a restart)."""
    yield store
    yield factory.reopen(store)


def bodies(lo: int, hi: int, salt: int = 0) -> list[bytes]:
    return [body_for(i, salt) for i in range(lo, hi)]


def expected_positions(start_end: int, sizes: list[int], seg: int) -> list[int]:
    out, end = [], start_end
    for size in sizes:
        p = codec.place(end, size, seg)
        out.append(p)
        end = p + size
    return out


def test_fresh_log(store):
    assert isinstance(store, LogStore)
    assert store.tail() == LogPosition(-1, 0, 0, 0)
    assert (store.first_index, store.last_index) == (0, -1)
    assert store.term(-1) == 0
    assert store.entries(0, 0) == [] and store.raw(0, 0) == b""
    with pytest.raises(IndexOutOfRange):
        store.entry(0)


def test_append_returns_positions_and_reads_agree(factory, store):
    bs = bodies(0, 40)
    frames = build(store.tail(), bs, 3, SEGMENT)
    pos = store.append(frames)
    assert pos == expected_positions(0, [48 + len(b) for b in bs], SEGMENT)
    assert len({p // SEGMENT for p in pos}) > 2, "the test must cross data files"
    for s in now_and_reopened(factory, store):
        assert s.last_index == 39 and s.term(39) == 3
        assert s.raw(0, 40) == frames
        es = s.entries(0, 40)
        assert [bytes(e.body) for e in es] == bs and [e.pos for e in es] == pos
        assert bytes(s.entry(17).body) == bs[17]
        t = s.tail()
        assert t == LogPosition(39, 3, pos[-1] + 48 + len(bs[-1]), es[-1].header.chain_crc)
        store = s
    store.close()


def test_entry_fields_are_the_entries_as_tuples(factory, store):
    """The apply loop's read: the same entries, cut by ``max_bytes`` the same way, as plain tuples."""
    append(store, bodies(0, 40), term=2)
    t = store.tail()
    noop = bytearray()
    codec.encode_into(
        noop, t.last_index + 1, 2, codec.place(t.end_pos, 48, SEGMENT), b"", t.chain_crc, codec.MAGIC_NOOP
    )
    store.append(noop)
    for s in now_and_reopened(factory, store):
        for lo, hi, max_bytes in ((0, 41, None), (5, 41, 1), (0, 41, 3000), (38, 41, None)):
            want = [
                (e.header.magic, e.index, e.term, e.pos, bytes(e.body)) for e in s.entries(lo, hi, max_bytes)
            ]
            got = [(m, i, t, p, bytes(b)) for m, i, t, p, b in s.entry_fields(lo, hi, max_bytes)]
            assert got == want and got
        assert s.entry_fields(40, 41)[0][0] == codec.MAGIC_NOOP
        store = s
    store.close()


def test_appends_continue_the_chain(factory, store):
    for k in range(10):
        append(store, bodies(k * 5, k * 5 + 5, salt=k), term=k + 1)
    store = factory.reopen(store)
    raw = store.raw(0, 50)
    run = codec.scan_frames(raw, 0, 0, 0, SEGMENT)
    assert run.terms == [i // 5 + 1 for i in range(50)]
    store.close()


def test_max_bytes_cuts_but_returns_at_least_one(store):
    append(store, [b"x" * 100] * 30)  # 148-byte frames
    assert len(store.entries(0, 30, max_bytes=1)) == 1
    assert len(store.entries(0, 30, max_bytes=148 * 4)) == 4
    assert len(store.entries(0, 30, max_bytes=148 * 4 + 147)) == 4
    assert len(store.raw(3, 30, max_bytes=148 * 10)) == 148 * 10
    assert len(store.entries(0, 30, max_bytes=10**9)) == 30


@pytest.mark.parametrize(
    "damage",
    ["body_crc", "chain", "index", "pos", "term_down", "truncated", "garbage", "magic"],
)
def test_bad_frames_write_nothing(factory, store, damage):
    append(store, bodies(0, 5), term=2)
    before = store.tail()
    good = bytearray(build(before, bodies(5, 8), 2, SEGMENT))
    if damage == "body_crc":
        good[-1] ^= 0x40
    elif damage == "chain":
        good = bytearray(
            build(LogPosition(before.last_index, 2, before.end_pos, 12345), bodies(5, 8), 2, SEGMENT)
        )
    elif damage == "index":
        good = bytearray(
            build(
                LogPosition(before.last_index + 1, 2, before.end_pos, before.chain_crc),
                bodies(5, 8),
                2,
                SEGMENT,
            )
        )
    elif damage == "pos":
        good = bytearray(
            build(
                LogPosition(before.last_index, 2, before.end_pos + 1, before.chain_crc),
                bodies(5, 8),
                2,
                SEGMENT,
            )
        )
    elif damage == "term_down":
        good = bytearray(build(before, bodies(5, 8), 1, SEGMENT))
    elif damage == "truncated":
        good = good[:-3]
    elif damage == "garbage":
        good += b"\x00" * 20
    elif damage == "magic":
        good[0:4] = (7).to_bytes(4, "big")
    with pytest.raises(codec.FrameError):
        store.append(bytes(good))
    assert store.tail() == before
    store = factory.reopen(store)
    assert store.tail() == before
    append(store, bodies(5, 8), term=2)
    assert store.last_index == 7
    store.close()


def test_empty_append_is_a_no_op(store):
    assert store.append(b"") == []
    assert store.tail() == LogPosition(-1, 0, 0, 0)


def test_truncate_suffix(factory, store):
    append(store, bodies(0, 30), term=1)
    t10 = LogPosition(10, 1, store.entry(10).header.end, store.entry(10).header.chain_crc)
    store.truncate_suffix(11)
    assert store.tail() == t10
    with pytest.raises(IndexOutOfRange):
        store.entry(11)
    append(store, bodies(11, 20, salt=9), term=2)
    store = factory.reopen(store)
    assert store.last_index == 19 and store.term(11) == 2 and store.term(10) == 1
    assert bytes(store.entry(15).body) == body_for(15, 9)
    store.truncate_suffix(20)  # last + 1: nothing to do
    with pytest.raises(IndexOutOfRange):
        store.truncate_suffix(22)
    store.truncate_suffix(0)
    assert store.tail() == LogPosition(-1, 0, 0, 0)
    append(store, bodies(0, 3, salt=4), term=5)
    assert factory.reopen(store).term(2) == 5


def test_truncate_across_a_file_boundary_reuses_the_room(factory, store):
    append(store, [b"a" * 400, b"b" * 400], term=1)  # second entry would leave < 8 + 448: jumps? check below
    append(store, [b"c" * 400], term=1)
    p = [e.pos for e in store.entries(0, 3)]
    assert p[2] == SEGMENT, "third entry must start the second file"
    store.truncate_suffix(2)
    pos = append(store, [b"d" * 10], term=2)
    assert pos == [p[1] + 448], "a small entry fits where the blank was"
    store = factory.reopen(store)
    assert bytes(store.entry(2).body) == b"d" * 10
    store.close()


def test_compact_prefix(factory, store):
    append(store, bodies(0, 40), term=1)
    append(store, bodies(40, 50), term=2)
    e19 = store.entry(19)
    store.compact_prefix(20)
    for s in now_and_reopened(factory, store):
        assert s.first_index == 20 and s.last_index == 49
        assert s.term(19) == 1 and s.term(45) == 2
        with pytest.raises(Compacted):
            s.entry(19)
        with pytest.raises(Compacted):
            s.entries(10, 30)
        with pytest.raises(Compacted):
            s.truncate_suffix(5)
        assert s.snapshot_point() == LogPosition(19, 1, e19.header.end, e19.header.chain_crc)
        store = s
    store.compact_prefix(10)  # already compacted: nothing to do
    store.compact_prefix(50)  # everything: the log is empty but knows where it ends
    tail = store.tail()
    assert tail.last_index == 49 and tail.last_term == 2
    assert (store.first_index, store.last_index) == (50, 49)
    assert store.term(49) == 2
    with pytest.raises(IndexOutOfRange):
        store.compact_prefix(52)
    store = factory.reopen(store)
    assert store.tail() == tail
    append(store, [b"next"], term=3)
    assert store.entry(50).pos == codec.place(tail.end_pos, 52, SEGMENT)
    store.close()


@pytest.mark.parametrize("end_pos", [0, 5000, 3 * SEGMENT - 20, 4 * SEGMENT])
def test_reset_to_snapshot(factory, store, end_pos):
    append(store, bodies(0, 20), term=1)
    store.reset_to_snapshot(100, 7, 0xDEADBEEF, end_pos)
    for s in now_and_reopened(factory, store):
        assert s.tail() == LogPosition(100, 7, end_pos, 0xDEADBEEF)
        assert (s.first_index, s.last_index) == (101, 100)
        assert s.term(100) == 7
        with pytest.raises(Compacted):
            s.entry(50)
        store = s
    pos = append(store, bodies(101, 110), term=7)
    assert pos[0] == codec.place(end_pos, 48 + len(body_for(101)), SEGMENT)
    store = factory.reopen(store)
    assert [bytes(e.body) for e in store.entries(101, 110)] == bodies(101, 110)
    store.close()


def test_reads_out_of_range(store):
    append(store, bodies(0, 5))
    with pytest.raises(IndexOutOfRange):
        store.entry(5)
    with pytest.raises(IndexOutOfRange):
        store.raw(3, 7)
    with pytest.raises(IndexOutOfRange):
        store.entries(4, 2)
    with pytest.raises(IndexOutOfRange):
        store.term(6)
    with pytest.raises(IndexOutOfRange) as err:
        store.entry(-5)
    assert not isinstance(err.value, Compacted), "nothing was compacted: -5 is simply not an index"
    with pytest.raises(IndexOutOfRange) as err:
        store.term(-7)
    assert not isinstance(err.value, Compacted)


def test_use_after_close(store):
    store.close()
    for call in (
        lambda: store.tail(),
        lambda: store.first_index,
        lambda: store.append(b""),
        lambda: store.entry(0),
        lambda: store.entry_fields(0, 1),
        lambda: store.term(0),
        lambda: store.sync(),
        lambda: store.truncate_suffix(0),
        lambda: store.compact_prefix(0),
        lambda: store.close(),
    ):
        with pytest.raises(StoreClosedError):
            call()
