"""ConsumeQueue files: 20-byte units, file rolling, torn-unit recovery, truncation."""

import errno

import pytest

from broker_adapter.core.consumequeue import UNIT_SIZE, ConsumeQueue
from storage.fileio import FileIO


def test_units_round_trip_across_files_and_reopen(tmp_path):
    cq = ConsumeQueue(tmp_path, "orders", 3, units_per_file=10)
    for q in range(25):
        assert cq.append(1000 + q * 100, 91 + q, -q) == q
    assert [u.queue_offset for u in cq.read(8, 5)] == [8, 9]  # stops at a file end
    assert cq.get(24).commitlog_offset == 1000 + 2400
    cq.close()
    files = sorted(p.name for p in (tmp_path / "orders" / "3").iterdir())
    assert files == [f"{0:020d}", f"{200:020d}", f"{400:020d}"]  # named by first byte position
    again = ConsumeQueue(tmp_path, "orders", 3, units_per_file=10)
    assert again.max_offset == 25
    assert again.get(13).size == 91 + 13 and again.get(13).tags_code == -13
    again.close()


def test_torn_unit_is_cut_on_open(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0)
    for q in range(3):
        cq.append(q, 1, 0)
    cq.close()
    path = tmp_path / "t" / "0" / f"{0:020d}"
    with open(path, "ab") as f:
        f.write(b"\x01" * 7)
    cq = ConsumeQueue(tmp_path, "t", 0)
    assert cq.max_offset == 3 and path.stat().st_size == 3 * UNIT_SIZE
    cq.close()


def test_truncate_drops_units_and_files(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 1, units_per_file=4)
    for q in range(10):
        cq.append(q * 10, 5, 0)
    assert cq.truncate(5) == 5
    assert cq.max_offset == 5 and cq.append(777, 5, 0) == 5
    assert cq.get(5).commitlog_offset == 777
    assert cq.truncate(0) == 6 and cq.max_offset == 0
    cq.close()
    assert ConsumeQueue(tmp_path, "t", 1, units_per_file=4).max_offset == 0


def test_bad_offsets_are_clear(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0)
    with pytest.raises(IndexError, match="not in"):
        cq.get(0)
    with pytest.raises(IndexError, match="negative"):
        cq.read(-1, 1)
    assert cq.read(5, 10) == []
    cq.close()


def test_appended_units_are_written_in_one_go_across_a_file_boundary(tmp_path):
    # The dispatcher appends a chunk's units and writes them once (write_appended): a file boundary inside
    # the chunk splits the write, and another reader of the directory sees exactly what was written.
    cq = ConsumeQueue(tmp_path, "T", 0, units_per_file=4)
    for i in range(10):
        assert cq.append(1000 + i, 50 + i, i) == i
    assert cq.has_appended
    assert ConsumeQueue(tmp_path, "T", 0, units_per_file=4).max_offset == 0  # nothing on disk yet
    cq.write_appended()
    assert not cq.has_appended
    again = ConsumeQueue(tmp_path, "T", 0, units_per_file=4)
    assert again.max_offset == 10
    assert [(u.commitlog_offset, u.size, u.tags_code) for u in again.read(0, 4)] == [
        (1000 + i, 50 + i, i) for i in range(4)
    ]
    assert again.get(9).commitlog_offset == 1009
    assert sorted(int(p.name) for p in cq.dir.iterdir()) == [0, 80, 160]


def test_reads_and_changes_see_units_not_yet_written(tmp_path):
    cq = ConsumeQueue(tmp_path, "T", 0, units_per_file=4)
    for i in range(6):
        cq.append(100 * i, 10, 0)
    assert [u.commitlog_offset for u in cq.read(4, 10)] == [400, 500]  # read writes the buffer first
    cq.append(600, 10, 0)
    assert cq.truncate(5) == 2 and cq.max_offset == 5
    assert ConsumeQueue(tmp_path, "T", 0, units_per_file=4).max_offset == 5


class _FullAfter(FileIO):
    """A disk that fills up after ``writes`` pwrites (ENOSPC, as a full file system answers), until freed."""

    def __init__(self, writes: int):
        self.left = writes

    def pwrite(self, fd, data, offset):
        if self.left == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.left -= 1
        super().pwrite(fd, data, offset)


def test_a_write_cut_by_a_full_disk_keeps_the_units_it_did_not_write(tmp_path):
    """Found by the 30-minute cluster chaos run: a full disk during an apply stopped the node. The units a failed
    write did not reach stay appended and the next write puts them in place: no hole, nothing twice."""
    disk = _FullAfter(writes=1)
    cq = ConsumeQueue(tmp_path, "T", 0, units_per_file=4, io=disk)
    for i in range(10):
        cq.append(1000 + i, 50, 0)
    with pytest.raises(OSError) as e:
        cq.write_appended()  # the first file is written, the second fails
    assert e.value.errno == errno.ENOSPC and cq.has_appended
    assert ConsumeQueue(tmp_path, "T", 0, units_per_file=4).max_offset == 4
    cq.append(1010, 50, 0)
    disk.left = -1  # space again
    cq.write_appended()
    again = ConsumeQueue(tmp_path, "T", 0, units_per_file=4)
    assert again.max_offset == 11
    assert [again.get(q).commitlog_offset for q in range(11)] == [1000 + i for i in range(11)]
