"""Crash recovery and corruption: torn tails are cut back to the last good entry, damage before the tail is
refused with the file, byte offset and index named, and ``repair`` truncates there and counts the loss."""

from __future__ import annotations

import os

import pytest

from storage import codec
from storage.errors import StorageCorruptError
from storage.filestore import FileLogStore, repair
from storage.index import UNIT_SIZE
from storage.segments import segment_name
from tests.storage.conftest import INDEX_UNITS, SEGMENT
from tests.storage.faults import CrashIO, SimulatedCrash, abandon
from tests.storage.helpers import append, body_for, build

N = 40


def open_store(d, **kw):
    return FileLogStore.open(str(d), segment_size=SEGMENT, index_units=INDEX_UNITS, **kw)


@pytest.fixture
def log(tmp_path):
    """A closed log of N entries (terms 1 and 2) spread over several data and index files; returns its facts."""
    s = open_store(tmp_path)
    append(s, [body_for(i) for i in range(N // 2)], term=1)
    append(s, [body_for(i) for i in range(N // 2, N)], term=2)
    facts = {"tail": s.tail(), "entries": [(e.pos, e.header.size, bytes(e.body)) for e in s.entries(0, N)]}
    s.close()
    return tmp_path, facts


def data_file(d, pos):
    return os.path.join(d, "data", segment_name(pos - pos % SEGMENT))


def flip(path, offset, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def test_clean_reopen_rebuilds_nothing(log):
    d, facts = log
    s = open_store(d)
    assert s.tail() == facts["tail"]
    assert s.recovery.rebuilt_units == 0 and s.recovery.torn_bytes == 0 and s.recovery.bad is None
    s.close()


@pytest.mark.parametrize("where", ["body", "header_term", "header_size"])
def test_damaged_last_entry_is_a_torn_tail(log, where):
    d, facts = log
    pos, _size, _ = facts["entries"][-1]
    off = {
        "body": codec.HEADER_SIZE + 1,
        "header_term": codec.TERM_OFFSET + 7,
        "header_size": codec.SIZE_OFFSET + 3,
    }
    flip(data_file(d, pos), pos % SEGMENT + off[where])
    s = open_store(d)
    assert s.last_index == N - 2
    assert s.recovery.bad is not None and s.recovery.bad.index == N - 1
    assert os.path.getsize(data_file(d, pos)) == pos % SEGMENT
    append(s, [b"again"], term=2)
    s = reopen(s, d)
    assert s.last_index == N - 1 and bytes(s.entry(N - 1).body) == b"again"
    s.close()


def reopen(s, d):
    s.close()
    return open_store(d)


@pytest.mark.parametrize(
    "where",
    ["body", "header_magic", "header_index", "header_term", "header_pos", "header_chain", "header_size"],
)
def test_damage_before_the_tail_is_refused_then_repaired(log, where):
    d, facts = log
    victim = N - 12
    pos, size, _ = facts["entries"][victim]
    rel = {
        "body": codec.HEADER_SIZE,
        "header_magic": 3,
        "header_index": codec.INDEX_OFFSET + 7,
        "header_term": codec.TERM_OFFSET + 7,
        "header_pos": codec.POS_OFFSET + 7,
        "header_chain": codec.CHAIN_CRC_OFFSET,
        "header_size": codec.SIZE_OFFSET + 3,
    }[where]
    if size == codec.HEADER_SIZE and where == "body":
        victim -= 1
        pos, size, _ = facts["entries"][victim]
    flip(data_file(d, pos), pos % SEGMENT + rel)
    with pytest.raises(StorageCorruptError) as err:
        open_store(d)
    e = err.value
    assert (e.path, e.offset, e.index) == (data_file(d, pos), pos % SEGMENT, victim), str(e)
    assert segment_name(pos - pos % SEGMENT) in str(e) and str(victim) in str(e)
    result = repair(str(d), SEGMENT, index_units=INDEX_UNITS)
    assert result.bad.index == victim and result.dropped_entries == N - victim
    s = open_store(d)
    assert s.last_index == victim - 1
    assert [bytes(e.body) for e in s.entries(0, victim)] == [b for _, _, b in facts["entries"][:victim]]
    s.close()


def test_damage_outside_the_tail_window_is_found_on_read_and_by_full_verify(log):
    d, facts = log
    pos, size, _ = facts["entries"][3]
    flip(data_file(d, pos), pos % SEGMENT + size - 1)
    s = FileLogStore.open(str(d), segment_size=SEGMENT, index_units=INDEX_UNITS, tail_bytes=SEGMENT)
    with pytest.raises(StorageCorruptError) as err:
        s.entries(0, 10)
    assert err.value.index == 3 and err.value.path == data_file(d, pos)
    with pytest.raises(StorageCorruptError) as err:
        s.entry_fields(2, 10)  # the apply loop's read checks the same way
    assert err.value.index == 3 and err.value.path == data_file(d, pos)
    s.close()
    with pytest.raises(StorageCorruptError):
        FileLogStore.open(str(d), segment_size=SEGMENT, index_units=INDEX_UNITS, verify="full")


@pytest.mark.parametrize("field_offset", [0, 4, 12, 16, 24, 31])
def test_damaged_index_unit_is_rebuilt_from_data(log, field_offset):
    d, facts = log
    victim = N - 5
    index_path = os.path.join(d, "index", segment_name((victim - victim % INDEX_UNITS) * UNIT_SIZE))
    flip(index_path, (victim % INDEX_UNITS) * UNIT_SIZE + field_offset, 0x10)
    s = open_store(d)
    assert s.tail() == facts["tail"] and s.recovery.rebuilt_units >= 1
    assert s.term(victim) == 2 and s.entry(victim).pos == facts["entries"][victim][0]
    s.close()


def test_lost_index_is_rebuilt(log):
    d, facts = log
    for name in os.listdir(os.path.join(d, "index")):
        os.unlink(os.path.join(d, "index", name))
    s = open_store(d)
    assert s.tail() == facts["tail"] and s.recovery.rebuilt_units == N
    assert [s.term(i) for i in range(N)] == [1] * (N // 2) + [2] * (N // 2)
    s.close()


def test_cut_index_file_is_rebuilt(log):
    d, facts = log
    last_index_file = sorted(os.listdir(os.path.join(d, "index")))[-1]
    path = os.path.join(d, "index", last_index_file)
    os.truncate(path, 40)
    s = open_store(d)
    assert s.tail() == facts["tail"]
    assert s.entry(N - 1).pos == facts["entries"][-1][0]
    s.close()


def test_cut_at_every_byte_of_the_last_entry(log, tmp_path_factory):
    d, facts = log
    pos, size, _ = facts["entries"][-1]
    path = data_file(d, pos)
    with open(path, "rb") as f:
        original = f.read()
    prev_tail_pos = facts["entries"][-2][0] + facts["entries"][-2][1]
    for cut in range(pos % SEGMENT, pos % SEGMENT + size):
        with open(path, "wb") as f:
            f.write(original[:cut])
        s = open_store(d)
        assert s.last_index == N - 2, cut
        assert s.tail().end_pos == prev_tail_pos
        s.close()
    with open(path, "wb") as f:
        f.write(original)
    s = open_store(d)
    assert s.last_index == N - 1, "the data files are the truth: a whole entry found there is the log's again"
    s.close()


def test_crash_in_the_middle_of_an_append(tmp_path):
    s = open_store(tmp_path)
    append(s, [body_for(i) for i in range(10)], term=1)
    before = s.tail()
    s.close()
    for budget in (0, 10, 48, 60, 200, 5000):
        s = FileLogStore.open(
            str(tmp_path), segment_size=SEGMENT, index_units=INDEX_UNITS, io=CrashIO(budget)
        )
        frames = build(s.tail(), [body_for(i, 3) for i in range(10, 20)], 1, SEGMENT)
        try:
            s.append(frames)
        except SimulatedCrash:
            abandon(s)
        else:
            s.close()
        s = open_store(tmp_path)
        assert before.last_index <= s.last_index <= 19
        got = s.raw(before.last_index + 1, s.last_index + 1)
        assert frames.startswith(got), "only whole entries of the interrupted batch survive, in order"
        s.truncate_suffix(before.last_index + 1)
        s.close()


def test_missing_start_record_means_a_log_from_index_0(tmp_path):
    s = open_store(tmp_path)
    append(s, [b"x"] * 3, term=1)
    s.close()
    os.unlink(os.path.join(tmp_path, "data", "start.json"))
    s = open_store(tmp_path)  # a fresh-log start is implied, and the data does start at index 0
    assert s.last_index == 2
    s.close()


def test_segment_size_mismatch_is_refused(log):
    d, _ = log
    with pytest.raises(Exception, match="segment_size"):
        FileLogStore.open(str(d), segment_size=SEGMENT * 2, index_units=INDEX_UNITS)


@pytest.mark.parametrize("chunk", [60, 100, 333])
def test_recovery_reads_in_chunks_smaller_than_entries(log, monkeypatch, chunk):
    """The walk reads the data in chunks; frames split by a chunk boundary or larger than a chunk still count."""
    import storage.recovery

    d, facts = log
    monkeypatch.setattr(storage.recovery, "_CHUNK", chunk)
    s = FileLogStore.open(str(d), segment_size=SEGMENT, index_units=INDEX_UNITS, verify="full")
    assert s.tail() == facts["tail"] and s.recovery.bad is None and s.recovery.walked_from == 0
    s.close()
    pos, _, _ = facts["entries"][-1]
    flip(data_file(d, pos), pos % SEGMENT + codec.HEADER_SIZE)  # the last entry: a torn tail
    s = FileLogStore.open(str(d), segment_size=SEGMENT, index_units=INDEX_UNITS, verify="full")
    assert s.last_index == N - 2
    s.close()


def test_crash_between_the_blank_and_the_next_file(tmp_path):
    s = open_store(tmp_path)
    append(s, [b"a" * 400, b"b" * 400], term=1)  # 896 bytes used: a third 448-byte entry needs the next file
    end = s.tail().end_pos
    s.close()
    room = SEGMENT - end
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, index_units=INDEX_UNITS, io=CrashIO(room))
    with pytest.raises(SimulatedCrash, match="crash"):
        append(s, [b"c" * 400], term=1)  # the blank is written, the crash hits the next file's first write
    abandon(s)
    assert os.path.getsize(data_file(tmp_path, 0)) == SEGMENT, "the blank reached the file"
    s = open_store(tmp_path)
    assert s.tail().end_pos == end and s.last_index == 1
    assert os.path.getsize(data_file(tmp_path, 0)) == end, "the orphan blank is cut"
    assert not os.path.exists(data_file(tmp_path, SEGMENT)), "the empty next file is removed"
    assert append(s, [b"d" * 10], term=1) == [end]
    s.close()
