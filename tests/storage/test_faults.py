"""A full disk (ENOSPC) never leaves a partial entry: the failed append is rolled back, the error says so, and
the log after reopening is exactly the log before the failed append."""

from __future__ import annotations

import os

import pytest

from storage.errors import DiskFullError
from storage.filestore import FileLogStore
from tests.storage.conftest import INDEX_UNITS, SEGMENT
from tests.storage.faults import DiskFullIO
from tests.storage.helpers import append, body_for, build


def snapshot_files(d):
    out = {}
    for sub in ("data",):
        for name in sorted(os.listdir(os.path.join(d, sub))):
            with open(os.path.join(d, sub, name), "rb") as f:
                out[(sub, name)] = f.read()
    return out


def prepare(tmp_path, n=7):
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, index_units=INDEX_UNITS)
    append(s, [body_for(i, size=100) for i in range(n)], term=1)
    s.close()


@pytest.mark.parametrize("budget", [0, 1, 47, 100, 149, 500, 1000, 1400])
@pytest.mark.parametrize("flush", ["sync", "async"])
def test_enospc_mid_append_rolls_back(tmp_path, budget, flush):
    prepare(tmp_path)  # 7 x 148-byte entries: the seventh starts the second data file
    before_files = snapshot_files(tmp_path)
    io = DiskFullIO(budget)
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, flush=flush, index_units=INDEX_UNITS, io=io)
    before = s.tail()
    frames = build(before, [body_for(i, 1, size=100) for i in range(7, 20)], 1, SEGMENT)  # crosses files
    with pytest.raises(DiskFullError, match="rolled back"):
        s.append(frames)
    assert s.tail() == before
    s.close()
    assert snapshot_files(tmp_path) == before_files
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, index_units=INDEX_UNITS)
    assert s.tail() == before
    assert s.append(frames)  # space again: the same append now succeeds
    assert s.last_index == 19
    s.close()


def test_enospc_at_fdatasync_rolls_back(tmp_path):
    prepare(tmp_path)
    io = DiskFullIO(fail_sync=True)
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, flush="sync", index_units=INDEX_UNITS, io=io)
    before = s.tail()
    with pytest.raises(DiskFullError):
        append(s, [b"x" * 50] * 3, term=1)
    assert s.tail() == before
    io.fail_sync = False
    s.close()
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, index_units=INDEX_UNITS)
    assert s.tail() == before
    s.close()


def test_enospc_creating_an_index_file(tmp_path):
    prepare(tmp_path, n=INDEX_UNITS - 1)
    io = DiskFullIO(fail_fallocate=True)
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, index_units=INDEX_UNITS, io=io)
    before = s.tail()
    index_files = sorted(os.listdir(os.path.join(tmp_path, "index")))
    with pytest.raises(DiskFullError):
        append(s, [b"y"] * 3, term=1)  # needs the second index file
    assert s.tail() == before
    assert sorted(os.listdir(os.path.join(tmp_path, "index"))) == index_files
    s.close()
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, index_units=INDEX_UNITS)
    assert s.tail() == before
    append(s, [b"y"] * 3, term=1)
    s.close()


def test_async_flush_error_is_reported(tmp_path):
    prepare(tmp_path)
    io = DiskFullIO(fail_sync=True)
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, flush="async", index_units=INDEX_UNITS, io=io)
    append(s, [b"z"], term=1)
    assert s.dirty
    with pytest.raises(DiskFullError):
        s.sync()
    assert s.dirty, "a failed flush leaves the data marked as not durable"
    io.fail_sync = False
    s.sync()
    assert not s.dirty
    s.close()


def test_enospc_on_the_second_new_index_file_removes_the_first(tmp_path):
    prepare(tmp_path, n=INDEX_UNITS - 1)

    class SecondFallocateFails(DiskFullIO):
        calls = 0

        def fallocate(self, fd, offset, length):
            SecondFallocateFails.calls += 1
            if SecondFallocateFails.calls == 2:
                raise OSError(28, "No space left on device (injected at the second fallocate)")
            super().fallocate(fd, offset, length)

    s = FileLogStore.open(
        str(tmp_path), segment_size=SEGMENT, index_units=INDEX_UNITS, io=SecondFallocateFails()
    )
    before = s.tail()
    index_files = sorted(os.listdir(os.path.join(tmp_path, "index")))
    with pytest.raises(DiskFullError):
        append(s, [b"z"] * (2 * INDEX_UNITS), term=1)  # needs two new index files
    assert s.tail() == before
    assert sorted(os.listdir(os.path.join(tmp_path, "index"))) == index_files
    s.close()
