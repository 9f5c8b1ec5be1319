"""Index files of a chosen size (``[storage] index_units_per_file``, docs/storage.md): a log rolls from one to the
next and reopens reading both; files made with another size are used where the layout agrees (a unit's byte is
``index * 32`` whatever the size) and refused, with the file named, where it does not."""

from __future__ import annotations

import os

import pytest

from storage.errors import StorageError
from storage.filestore import FileLogStore, repair
from storage.index import UNIT_SIZE, units_per_file_of
from storage.segments import list_segments
from tests.storage.helpers import append, body_for

SEGMENT = 4096
N = 50


def open_store(d, units: int | None) -> FileLogStore:
    return FileLogStore.open(str(d), segment_size=SEGMENT, index_units=units)


def index_files(d) -> list[tuple[int, int]]:
    """(first byte, size) of every index file."""
    return [(base, os.path.getsize(p)) for base, p in list_segments(os.path.join(d, "index"))]


def written(d, units: int | None) -> list[tuple[int, int, int]]:
    """(index, term, pos) of every entry, read back through the index of a store opened with ``units``."""
    s = open_store(d, units)
    try:
        assert s.last_index == N - 1
        return [(i, s.term(i), s.entries(i, i + 1)[0].pos) for i in range(N)]
    finally:
        s.close()


@pytest.fixture
def log(tmp_path):
    """A closed log of N entries written with 16 units a file: four index files of 512 bytes."""
    s = open_store(tmp_path, 16)
    for k in range(0, N, 10):
        append(s, [body_for(i) for i in range(k, k + 10)], term=1 + k // 20)
    s.close()
    return tmp_path


def test_a_log_rolls_to_the_next_index_file_and_reopens_reading_every_one(log):
    assert index_files(log) == [(0, 512), (512, 512), (1024, 512), (1536, 512)]
    first = written(log, 16)
    assert [t for _, t, _ in first] == [1 + i // 20 for i in range(N)]
    s = open_store(log, 16)
    assert s.recovery.rebuilt_units == 0, "a clean reopen finds every unit in its file"
    append(s, [body_for(N)], term=3)
    s.close()
    assert index_files(log)[-1] == (1536, 512), "entry 50 fits the fourth file"
    assert units_per_file_of(os.path.join(log, "index")) == 16


@pytest.mark.parametrize("units", [32, 8])
def test_files_of_another_size_are_refused_naming_the_file(log, units):
    with pytest.raises(StorageError) as e:
        open_store(log, units)
    msg = str(e.value)
    # 32 units: the file at byte 512 cannot start a 1024-byte file; 8 units: the first file holds 16 units
    path = os.path.join(log, "index", "00000000000000000512" if units == 32 else "00000000000000000000")
    assert path in msg and "index_units_per_file = 16" in msg and f"not this node's {units}" in msg
    assert written(log, 16)[-1][0] == N - 1, "the refusal changed nothing: the log opens with its own size"


def test_a_smaller_first_file_is_grown_and_used(tmp_path):
    """Only the first file and 16 units: its units sit where 64-unit files put them, so it is grown, not
    refused, and the log reads the same."""
    s = open_store(tmp_path, 16)
    append(s, [body_for(i) for i in range(10)], term=1)
    before = [(i, s.term(i), s.entries(i, i + 1)[0].pos) for i in range(10)]
    s.close()
    s = open_store(tmp_path, 64)
    assert s.recovery.rebuilt_units == 0
    assert [(i, s.term(i), s.entries(i, i + 1)[0].pos) for i in range(10)] == before
    s.close()
    assert index_files(tmp_path) == [(0, 64 * UNIT_SIZE)]


def test_a_store_opened_without_a_size_keeps_the_size_its_files_were_made_with(log):
    """A tool (or a test) opening a node's log without the node's config: with the default size it would grow
    the first file to 160 MiB, and the node would then refuse it at its next start."""
    assert written(log, None)[-1][0] == N - 1
    assert index_files(log) == [(0, 512), (512, 512), (1024, 512), (1536, 512)]
    assert written(log, 16)[-1][0] == N - 1


def test_repair_uses_the_size_the_files_were_made_with(log):
    """``dledger repair`` has no node config: it reads the size from the files instead of refusing them."""
    r = repair(str(log), SEGMENT)
    assert r.bad is None and r.tail.last_index == N - 1
    assert index_files(log) == [(0, 512), (512, 512), (1024, 512), (1536, 512)]
