"""What a broker node holds as topics and messages grow (issue 27): descriptors, queues opened at start, the
CommitLog position map."""

import contextlib
import errno
import io
import mmap
import os
from pathlib import Path

import pytest

from broker_adapter.core import commands, keyindex, message
from broker_adapter.core import statemachine as dispatcher
from broker_adapter.core.consumequeue import SYNCFS_AT, UNIT_SIZE, ConsumeQueue, OpenFiles, holds
from broker_adapter.core.keyindex import KeyIndex
from broker_adapter.core.statemachine import BrokerStateMachine
from storage.fileio import FileIO
from tests.broker.test_dispatcher import Log


def _fill(sm: BrokerStateMachine, log: Log, topics: int, queues: int, per_queue: int = 1) -> list:
    sm.apply(log.entries([commands.encode(commands.CreateTopic(f"t{t}", queues)) for t in range(topics)]))
    entries = []
    for o in range(per_queue):
        for t in range(topics):
            for q in range(queues):
                entries += log.entries([log.msg(f"t{t}", q, o)])
                sm.apply(entries[-1:])
    return entries


def _open_fds(under: Path) -> int:
    """Descriptors of this process open on files under ``under`` (other threads' descriptors, a test worker's
    gRPC or logging, come and go meanwhile and must not count)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(under))
    return n


def test_many_queues_keep_a_bounded_number_of_files_open(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq", units_per_file=2, open_files=8)
    log = Log()
    entries = _fill(sm, log, topics=10, queues=4, per_queue=3)  # 40 queues of two files each
    assert len(sm._files) == 8 and _open_fds(tmp_path) <= 8
    for t in range(10):
        for q in range(4):
            assert [u.queue_offset for u in sm.queue(f"t{t}", q).read(0, 2)] == [0, 1]
            assert sm.queue(f"t{t}", q).get(2).size > 0
    sm.flush()  # files closed since they were written are synced through a new descriptor
    assert len(sm._files) <= 8
    sm.close()
    assert _open_fds(tmp_path) == 0
    again = BrokerStateMachine(tmp_path / "cq", units_per_file=2)
    e = entries[-1]
    assert again.queue("t9", 3).get(2).commitlog_offset == e.pos + 48
    again.close()


def test_a_restart_opens_no_queue_that_holds_its_units_and_still_finds_a_short_one(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    entries = _fill(sm, log, topics=20, queues=4)
    buf = io.BytesIO()
    sm.save_snapshot(buf)
    sm.close()
    os.unlink(tmp_path / "cq" / "t7" / "2" / f"{0:020d}")  # deleted: a restart must refill it from the log
    again = BrokerStateMachine(tmp_path / "cq")
    again.load_snapshot(io.BytesIO(buf.getvalue()))
    assert again.short_queues == {("t7", 2): 1}
    assert list(again._queues) == [("t7", 2)]  # the 79 others: one stat each, not opened
    assert again.truncate_beyond(log.pos) == 0
    assert again.repair((e.index, e.pos, e.body) for e in entries) == 1
    assert again.queue("t7", 2).get(0).size > 0
    again.close()


def test_units_past_the_log_end_are_cut_when_the_queue_is_first_opened(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    _fill(sm, log, topics=2, queues=1, per_queue=3)  # t0/0 and t1/0 alternate in the log
    ends = [u.commitlog_offset for u in sm.queue("t1", 0).read(0, 3)]
    sm.close()
    again = BrokerStateMachine(tmp_path / "cq")
    again.topics, again.next_offsets = {"t0": 1, "t1": 1}, {("t0", 0): 3, ("t1", 0): 3}
    assert again.truncate_beyond(ends[1] - 48) == 0  # the log lost the entries from t1's second message on
    assert again.max_offset("t1", 0) == 1 and again.max_offset("t0", 0) == 2
    again.close()


def test_holds_answers_from_the_file_that_unit_lives_in(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=4)
    for q in range(6):
        cq.append(q * 100, 10, 0)
    cq.close()
    assert holds(tmp_path, "t", 0, 6, units_per_file=4) and holds(tmp_path, "t", 0, 0, units_per_file=4)
    assert not holds(tmp_path, "t", 0, 7, units_per_file=4)
    assert not holds(tmp_path, "t", 1, 1, units_per_file=4)  # no such queue
    os.truncate(tmp_path / "t" / "0" / f"{4 * UNIT_SIZE:020d}", UNIT_SIZE)
    assert not holds(tmp_path, "t", 0, 6, units_per_file=4)


def test_open_files_closes_the_least_recently_used(tmp_path):
    files = OpenFiles(limit=2)
    paths = [str(tmp_path / f"f{i}") for i in range(3)]
    a = files.fd(paths[0])
    files.fd(paths[1])
    assert files.fd(paths[0]) == a  # used again: now the most recent
    files.fd(paths[2])
    assert len(files) == 2 and files.fd(paths[0]) == a  # paths[1] was closed, not paths[0]
    files.close_all()
    assert len(files) == 0


def test_the_position_map_keeps_recent_messages_only(tmp_path, monkeypatch):
    monkeypatch.setattr(dispatcher, "POSITIONS_KEPT", 4)
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    entries = _fill(sm, log, topics=1, queues=1, per_queue=20)
    assert len(sm._positions) < 8
    last = entries[-1]
    assert sm.index_of(last.pos + 48) == last.index
    assert sm.index_of(entries[0].pos + 48) is None  # found in the log instead (CommitLog.locate)
    sm.close()


class _CountedSyncs(FileIO):
    """Records the file of every fdatasync, and the file named for every syncfs; fails them while ``failing``."""

    def __init__(self) -> None:
        self.synced: list[str] = []
        self.syncfs_of: list[str] = []
        self.failing = False

    def fdatasync(self, fd: int) -> None:
        if self.failing:
            raise OSError(errno.EIO, "injected")
        self.synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        super().fdatasync(fd)

    def syncfs(self, fd: int) -> None:
        if self.failing:
            raise OSError(errno.EIO, "injected")
        self.syncfs_of.append(os.readlink(f"/proc/self/fd/{fd}"))
        super().syncfs(fd)


def test_a_snapshot_syncs_only_the_queue_files_written_since_the_last_and_off_the_calling_thread(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq", units_per_file=2)
    io_ = sm._files.io = _CountedSyncs()
    log = Log()
    _fill(sm, log, topics=10, queues=4, per_queue=3)  # 40 queues of two files each
    assert len(sm._files.written) == 40
    io_.can_syncfs = False  # an fdatasync each, as on a system without syncfs
    sm.flush()
    assert len(io_.synced) == 80 and not sm._files.written and io_.syncfs_of == []
    io_.synced.clear()
    sm.apply(log.entries([log.msg("t3", 1, 3)]))  # a third file of one queue
    sm.apply(log.entries([log.msg("t5", 0, 3)]))
    assert len(sm._files.written) == 2
    sync = sm.prepare_snapshot()  # on the loop: takes the files, syncs nothing
    assert io_.synced == [] and not sm._files.written
    sm.save_snapshot(io.BytesIO())  # nothing left for it to sync on the loop
    assert io_.synced == []
    io_.failing = True
    with pytest.raises(OSError):
        sync()  # the runtime runs it on the snapshot thread, before the snapshot is published
    io_.failing = False
    sm.prepare_snapshot()()  # a failed sync's files are taken again by the next snapshot
    assert sorted(io_.synced) == sorted(
        str(tmp_path / "cq" / t / q / f"{2 * UNIT_SIZE:020d}") for t, q in (("t3", "1"), ("t5", "0"))
    )
    sm.close()


def test_many_files_are_synced_by_one_syncfs_and_a_failed_one_leaves_them_to_the_next(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq", units_per_file=2)
    io_ = sm._files.io = _CountedSyncs()
    log = Log()
    _fill(sm, log, topics=20, queues=4)  # 80 queues written: at least SYNCFS_AT files
    assert len(sm._files.written) == 80 >= SYNCFS_AT
    sync = sm.prepare_snapshot()
    io_.failing = True
    with pytest.raises(OSError):
        sync()
    io_.failing = False
    sm.prepare_snapshot()()  # the files a failed sync left, taken again
    assert io_.synced == [] and len(io_.syncfs_of) == 1
    assert io_.syncfs_of[0].startswith(str(tmp_path / "cq"))
    sm.apply(log.entries([log.msg("t3", 1, 1)]))
    sm.prepare_snapshot()()  # one file: an fdatasync of it
    assert io_.synced == [str(tmp_path / "cq" / "t3" / "1" / f"{0:020d}")] and len(io_.syncfs_of) == 1
    for t in range(20):  # and the same on the calling thread (close, save_snapshot)
        for q in range(4):
            sm.apply(log.entries([log.msg(f"t{t}", q, 2 if (t, q) == (3, 1) else 1)]))
    sm.flush()
    assert len(io_.syncfs_of) == 2
    sm.close()


def test_where_syncfs_is_refused_the_files_are_synced_one_by_one(tmp_path):
    class Refused(_CountedSyncs):
        def syncfs(self, fd: int) -> None:
            self.syncfs_of.append("refused")
            raise OSError(errno.ENOSYS, "syncfs: Function not implemented")

    files = OpenFiles(Refused())
    paths = []
    for k in range(SYNCFS_AT):
        paths.append(str(tmp_path / f"f{k}"))
        Path(paths[-1]).write_bytes(b"x")
    files.sync(paths)
    assert files.io.syncfs_of == ["refused"] and sorted(files.io.synced) == sorted(paths)
    files.io.synced.clear()
    files.sync(paths)  # not tried again
    assert files.io.syncfs_of == ["refused"] and len(files.io.synced) == SYNCFS_AT


def test_a_snapshot_syncs_the_key_index_off_the_loop_and_only_when_it_was_written(tmp_path, monkeypatch):
    msyncs: list[int] = []

    class CountedMap(mmap.mmap):
        def flush(self, *args: int) -> None:
            msyncs.append(1)
            super().flush(*args)

    monkeypatch.setattr(keyindex.mmap, "mmap", CountedMap)  # the index's files map through this
    sm = BrokerStateMachine(tmp_path / "cq", index_dir=tmp_path / "idx")
    io_ = sm._files.io = _CountedSyncs()
    log = Log()

    def keyed(q: int, key: str) -> bytes:
        m = message.Message(topic="t", body=b"x", queue_id=0, properties={message.PROPERTY_KEYS: key})
        raw = bytearray(message.encode(m))
        message.patch_placement(raw, q, log.pos + 48)
        return bytes(raw)

    sm.apply(log.entries([keyed(0, "k1")]))
    index_file = str(tmp_path / "idx" / "00000000.idx")
    sync = sm.prepare_snapshot()  # on the loop: takes the queue's and the index's files, syncs nothing
    assert io_.synced == [] and msyncs == []
    sm.capture_snapshot()(io.BytesIO())  # nothing left to sync on the loop
    assert io_.synced == [] and msyncs == []
    sync()  # the snapshot thread
    assert index_file in io_.synced
    io_.synced.clear()
    sm.prepare_snapshot()()  # nothing indexed since: the index is not synced again
    assert index_file not in io_.synced
    sm.apply(log.entries([keyed(1, "k2")]))
    sm.prepare_snapshot()()
    assert index_file in io_.synced and msyncs == []
    sm.close()
    again = KeyIndex(tmp_path / "idx")
    assert again.lookup(keyindex.KEY, "k1", 5) and again.lookup(keyindex.KEY, "k2", 5)
    again.close()


def test_a_captured_snapshot_writes_the_state_of_its_capture_whatever_is_applied_before_it_runs(tmp_path):
    """``capture_snapshot`` runs on the loop and its writer on the snapshot thread (dledger/runtime/snapshots.py):
    what is applied in between (new queues, offsets, topics, producers) is not in it."""
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    _fill(sm, log, topics=3, queues=2)
    sm.apply(log.entries([commands.encode(commands.CommitOffset("g", "t0", 0, 1))]))
    before = io.BytesIO()
    sm.save_snapshot(before)
    write = sm.capture_snapshot()
    sm.apply(log.entries([commands.encode(commands.CreateTopic("later", 2))]))
    sm.apply(log.entries([log.msg("later", 1, 0)]))
    sm.apply(log.entries([log.msg("t0", 0, 1)]))
    sm.apply(log.entries([commands.encode(commands.CommitOffset("g", "t1", 1, 1))]))
    captured = io.BytesIO()
    write(captured)
    assert captured.getvalue() == before.getvalue()
    again = BrokerStateMachine(tmp_path / "again")
    again.load_snapshot(io.BytesIO(captured.getvalue()))
    assert "later" not in again.topics and again.next_offset("t0", 0) == 1
    assert again.committed_offset("g", "t0", 0) == 1 and again.committed_offset("g", "t1", 1) is None
    sm.close()
    again.close()
