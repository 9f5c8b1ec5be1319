"""Quick checks of MemoryLogStore until the shared contract suite covers it."""

from __future__ import annotations

import pytest

from storage import codec
from storage.api import LogPosition, LogStore
from storage.errors import Compacted, IndexOutOfRange, StoreClosedError
from storage.memory import MemoryLogStore, MemoryMetaStore
from tests.storage.helpers import append, body_for, build


def test_fresh_tail_and_protocol():
    s = MemoryLogStore(segment_size=4096)
    assert isinstance(s, LogStore)
    assert s.tail() == LogPosition(-1, 0, 0, 0)
    assert (s.first_index, s.last_index) == (0, -1)
    assert s.term(-1) == 0


def test_append_read_truncate_compact_reset():
    seg = 512
    s = MemoryLogStore(segment_size=seg)
    bodies = [body_for(i, size=100) for i in range(20)]
    pos = append(s, bodies, term=2)
    assert all(p % seg + 148 + 8 <= seg for p in pos)
    assert s.last_index == 19 and s.term(5) == 2
    assert bytes(s.entry(7).body) == bodies[7]
    assert [e.index for e in s.entries(3, 9)] == list(range(3, 9))
    assert len(s.entries(3, 9, max_bytes=300)) == 2
    assert len(s.entries(3, 9, max_bytes=1)) == 1
    raw = s.raw(0, 20)
    assert codec.scan_frames(raw, 0, None, 0, seg).positions == pos
    s.truncate_suffix(15)
    assert s.tail().last_index == 14
    append(s, [b"x"], term=3)
    assert s.term(15) == 3
    t14 = s.entry(14)
    s.compact_prefix(15)
    assert s.first_index == 15 and s.term(14) == 2
    with pytest.raises(Compacted):
        s.entry(14)
    with pytest.raises(Compacted):
        s.truncate_suffix(14)
    s.compact_prefix(16)
    assert s.tail().last_index == 15 and s.first_index == 16 and s.last_index == 15
    append(s, [b"y"])
    prev = s.snapshot_point()
    assert s.entry(16).header.chain_crc == codec.chain_crc(16, 3, codec.zlib.crc32(b"y"), prev.chain_crc)
    assert t14.index == 14
    s.reset_to_snapshot(100, 5, 1234, 9000)
    assert s.tail() == LogPosition(100, 5, 9000, 1234)
    assert s.term(100) == 5 and s.first_index == 101
    frames = build(s.tail(), [b"z"], 5, seg)
    s.append(frames)
    assert s.entry(101).pos == codec.place(9000, 49, seg)
    with pytest.raises(IndexOutOfRange):
        s.entry(102)
    s.close()
    with pytest.raises(StoreClosedError):
        s.close()


def test_bad_frames_write_nothing():
    s = MemoryLogStore(segment_size=4096)
    append(s, [b"a", b"b"])
    good = build(s.tail(), [b"c", b"d"], None, 4096)
    bad = bytearray(good)
    bad[-1] ^= 1
    with pytest.raises(codec.FrameError):
        s.append(bytes(bad))
    assert s.last_index == 1
    s.append(good)
    assert s.last_index == 3


def test_meta():
    m = MemoryMetaStore()
    assert m.load_hard_state().term == 0
    from storage.api import HardState

    m.save_hard_state(HardState(3, "n1"))
    assert m.load_hard_state() == HardState(3, "n1")
    m.put("k", b"v")
    assert m.get("k") == b"v" and m.get("x") is None
