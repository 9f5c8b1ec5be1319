"""Power loss (storage/powerloss.py): what was not synced is really gone, what was synced is really kept.

Each test writes through ``PowerLossFileIO``, abandons the store the way a killed process does (no close, no
sync), lets ``power_loss`` rewrite the directory, then reopens it. The negative tests prove the emulation can
fail a store: without the fdatasync, entries are lost; the positive ones prove what ``sync`` promises."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from storage.api import HardState
from storage.filestore import FileLogStore
from storage.powerloss import (
    Journal,
    PowerLossFileIO,
    enable,
    power_loss,
    power_loss_meta_store,
    read_journal,
)
from tests.storage.conftest import INDEX_UNITS, SEGMENT
from tests.storage.helpers import append, body_for

BIG = 1 << 16  # one data file for the whole test: no new file forces a sync of the one before


def open_store(node, flush: str, io=None, segment_size: int = SEGMENT):
    return FileLogStore.open(
        str(node), segment_size=segment_size, flush=flush, index_units=INDEX_UNITS, io=io
    )


def abandon(store) -> None:
    """What kill -9 does to an open store: descriptors closed, nothing synced, nothing flushed."""
    store._index.close()
    store._segments.close()


def bodies(lo: int, hi: int) -> list[bytes]:
    return [body_for(i, size=40) for i in range(lo, hi)]


def reopen_bodies(node, segment_size: int = SEGMENT) -> list[bytes]:
    s = open_store(node, "sync", segment_size=segment_size)
    try:
        return (
            [bytes(e.body) for e in s.entries(s.first_index, s.last_index + 1)] if s.last_index >= 0 else []
        )
    finally:
        s.close()


@pytest.fixture
def node(tmp_path):
    d = tmp_path / "node"
    d.mkdir()
    enable(d)
    return d


def test_without_fdatasync_the_entries_are_lost(node):
    """The checker can fail: an async store's acknowledged-but-unsynced entries do not survive."""
    s = open_store(node, "async", PowerLossFileIO(Journal(node)), BIG)
    append(s, bodies(0, 10), term=1)
    s.sync()
    append(s, bodies(10, 60), term=1)  # never synced
    abandon(s)
    assert sum(f.stat().st_size for f in (node / "data").iterdir()) > 50 * 88  # kill -9 alone keeps all
    report = power_loss(node, random.Random(1), "drop")
    assert report.to_json()["bytes_lost"] == 50 * 88
    assert reopen_bodies(node, BIG) == bodies(0, 10)


def test_sync_policy_keeps_every_appended_entry(node):
    """Under ``sync`` an append returns after fdatasync, and a new data file's directory entry is synced too."""
    s = open_store(node, "sync", PowerLossFileIO(Journal(node)))
    for k in range(0, 60, 6):  # several batches across many segment files
        append(s, bodies(k, k + 6), term=1)
    abandon(s)
    power_loss(node, random.Random(2), "drop")
    assert reopen_bodies(node) == bodies(0, 60)


def test_a_new_segment_whose_directory_was_not_synced_disappears(node):
    """The model is strict about directories: an fdatasynced file whose creation was never made durable by an
    fsync of its directory is gone after the power cut (why DataSegments.create syncs the directory)."""
    io = PowerLossFileIO(Journal(node))
    (node / "sub").mkdir()
    path = str(node / "sub" / "orphan")
    fd = io.open(path, os.O_RDWR | os.O_CREAT)
    io.pwrite(fd, b"synced data", 0)
    io.fdatasync(fd)
    io.close(fd)
    kept = str(node / "kept")
    fd = io.open(kept, os.O_RDWR | os.O_CREAT)
    io.pwrite(fd, b"synced data", 0)
    io.fdatasync(fd)
    io.close(fd)
    io.fsync_dir(str(node))
    io.unlink(kept)  # removal not made durable: the file comes back with its synced content
    report = power_loss(node, random.Random(3), "drop")
    assert not os.path.exists(path) and path in report.undone_creations
    with open(kept, "rb") as f:
        assert f.read() == b"synced data"


def test_a_syncfs_keeps_every_file_and_name_written_before_it_and_nothing_after(node):
    """``syncfs`` (many ConsumeQueue files at a snapshot) is journaled as durable for every file and directory:
    writes and creations before it survive, later ones in the same files and directories do not."""
    io = PowerLossFileIO(Journal(node))
    paths = []
    for k in range(3):
        (node / f"q{k}").mkdir()
        paths.append(str(node / f"q{k}" / "units"))
        fd = io.open(paths[-1], os.O_RDWR | os.O_CREAT)
        io.pwrite(fd, b"before", 0)
        io.close(fd)
    fd = io.open(paths[0], os.O_RDONLY)
    io.syncfs(fd)
    io.close(fd)
    fd = io.open(paths[1], os.O_RDWR)
    io.pwrite(fd, b"-after", 6)  # after the syncfs, never synced: lost
    io.close(fd)
    late = str(node / "q2" / "late")
    fd = io.open(late, os.O_RDWR | os.O_CREAT)
    io.pwrite(fd, b"late", 0)
    io.fdatasync(fd)  # its data synced, its name not: gone
    io.close(fd)
    report = power_loss(node, random.Random(4), "drop")
    for path in paths:
        with open(path, "rb") as f:
            assert f.read() == b"before"
    assert not os.path.exists(late) and report.undone_creations == [late]


@pytest.mark.parametrize("seed", range(6))
def test_a_torn_tail_is_truncated_and_the_synced_prefix_kept(node, seed):
    s = open_store(node, "async", PowerLossFileIO(Journal(node)))
    append(s, bodies(0, 20), term=1)
    s.sync()
    for k in range(20, 80, 5):
        append(s, bodies(k, k + 5), term=1)
    abandon(s)
    report = power_loss(node, random.Random(seed), "torn")
    got = reopen_bodies(node)  # the node starts: a torn tail is cut, never refused
    assert got[:20] == bodies(0, 20)
    assert got == bodies(0, len(got))
    assert len(got) < 80 or not report.files


def test_truncation_and_compaction_are_undone_or_kept_consistently(node):
    s = open_store(node, "async", PowerLossFileIO(Journal(node)))
    append(s, bodies(0, 40), term=1)
    s.sync()
    s.compact_prefix(25)  # start.json is rewritten and synced first; the old files are removed unsynced
    s.truncate_suffix(35)
    append(s, bodies(35, 38), term=2)  # a new term's entries, unsynced
    abandon(s)
    report = power_loss(node, random.Random(4), "drop")
    assert report.restored_removals  # the removed segment files came back ...
    store = open_store(node, "sync")  # ... and the store drops them again (they hold only compacted entries)
    assert store.first_index == 25
    got = [e.body for e in store.entries(25, store.last_index + 1)]
    store.close()
    assert got in (bodies(25, 40), bodies(25, 35))  # the truncation was not synced: either state is a disk's


def test_lmdb_hard_state_survives_and_unsynced_commits_do_not(node):
    meta_dir = str(node / "meta")
    store_cls = power_loss_meta_store(Journal(node))
    m = store_cls(meta_dir, durable_commits=False)  # the old mode: commits stay in the page cache
    m.save_hard_state(HardState(7, "n2"))
    m.put("commit_index", b"100")
    m.put("commit_index", b"200")
    m._env.close()  # abandoned: no close(), no sync
    report = power_loss(node, random.Random(5), "drop")
    assert report.meta_undone == 2
    from storage.meta_lmdb import LmdbMetaStore

    m = LmdbMetaStore(meta_dir)
    assert m.load_hard_state() == HardState(7, "n2")
    assert m.get("commit_index") is None
    m.close()


def test_lmdb_durable_commits_lose_at_most_the_last_one(node):
    meta_dir = str(node / "meta")
    store_cls = power_loss_meta_store(Journal(node))
    m = store_cls(meta_dir)  # the default: every commit syncs its data pages
    m.put("commit_index", b"100")
    m.put("commit_index", b"200")
    m.save_hard_state(HardState(3, None))
    m.put("commit_index", b"300")
    m._env.close()
    power_loss(node, random.Random(6), "drop")
    from storage.meta_lmdb import LmdbMetaStore

    m = LmdbMetaStore(meta_dir)
    assert m.load_hard_state() == HardState(3, None)
    assert m.get("commit_index") == b"200"
    m.close()


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from storage.filestore import FileLogStore
    from storage.powerloss import Journal, PowerLossFileIO
    from tests.storage.helpers import append, body_for
    node, flush = sys.argv[1], sys.argv[2]
    s = FileLogStore.open(node, segment_size=1 << 16, flush=flush, index_units=16, io=PowerLossFileIO(Journal(node)))
    append(s, [body_for(i, size=40) for i in range(0, 10)], term=1)
    s.sync()
    append(s, [body_for(i, size=40) for i in range(10, 50)], term=1)
    print("appended", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("flush,survivors", [("async", 10), ("sync", 50)])
def test_a_real_process_killed_with_sigkill_leaves_a_journal(node, flush, survivors):
    """kill -9 of a real process: its journal is in the page cache; the power cut then takes what it names."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(node), flush], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "appended" in proc.stdout
    assert any(r["o"] == "w" for r in read_journal(node))
    power_loss(node, random.Random(7), "drop")
    assert reopen_bodies(node, BIG) == bodies(0, survivors)


class _NoFsyncIO(PowerLossFileIO):
    """A broken layer that skips fsync: what the emulation must catch."""

    def fsync(self, fd: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass


def _snapshot(store, index: int, payload: bytes):
    return store.save(index, 1, 0, 0, "counter", lambda f: f.write(payload))


def test_a_published_snapshot_survives_and_an_unfinished_one_is_gone(node):
    from statemachine.snapshot import SnapshotStore

    root = node / "snapshot"
    store = SnapshotStore(root, io=PowerLossFileIO(Journal(node)))
    first = _snapshot(store, 10, b"x" * 5000)
    install = store.begin_install(_snapshot_info(20, b"y" * 3000))
    install.write(0, b"y" * 2000)  # received in part, never committed
    install._f._drain()  # its bytes reached the page cache
    power_loss(node, random.Random(8), "drop")
    after = SnapshotStore(root)  # a restart: leftovers of the install are removed
    assert after.latest() == first
    assert [p.name for p in root.iterdir()] == [first.dirname]


def test_a_snapshot_published_without_fsync_is_lost(node):
    from statemachine.snapshot import SnapshotStore

    root = node / "snapshot"
    store = SnapshotStore(root, io=_NoFsyncIO(Journal(node)))
    _snapshot(store, 10, b"x" * 5000)
    power_loss(node, random.Random(9), "drop")
    assert SnapshotStore(root).infos() == []


def _snapshot_info(index: int, payload: bytes):
    import hashlib

    from statemachine.snapshot import SnapshotInfo

    return SnapshotInfo(index, 1, 0, 0, "counter", len(payload), hashlib.sha256(payload).hexdigest())
