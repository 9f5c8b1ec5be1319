"""The async flush policy: the store reports when a flush is due and never starts a thread by itself; the
explicit AsyncFlusher flushes in the background and stops cleanly."""

from __future__ import annotations

import threading
import time

from storage.filestore import AsyncFlusher, FileLogStore
from tests.storage.conftest import INDEX_UNITS, SEGMENT
from tests.storage.helpers import append


def open_async(tmp_path, interval_ms=10):
    return FileLogStore.open(
        str(tmp_path),
        segment_size=SEGMENT,
        flush="async",
        flush_interval_ms=interval_ms,
        index_units=INDEX_UNITS,
    )


def test_flush_due_follows_the_callers_clock(tmp_path):
    threads = threading.active_count()
    s = open_async(tmp_path, interval_ms=10)
    assert threading.active_count() == threads, "the store must not start threads"
    assert not s.flush_due(0) and not s.dirty
    append(s, [b"a"], term=1)
    assert s.dirty
    assert not s.flush_due(1000.0)  # first sighting starts the interval
    assert not s.flush_due(1009.0)
    assert s.flush_due(1010.0)
    s.sync()
    assert not s.dirty and not s.flush_due(5000.0)
    s.close()


def test_sync_policy_is_never_dirty(tmp_path):
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, flush="sync", index_units=INDEX_UNITS)
    append(s, [b"a"] * 3, term=1)
    assert not s.dirty and not s.flush_due(10**9)
    s.close()


def test_async_flusher_flushes_and_stops(tmp_path):
    s = open_async(tmp_path, interval_ms=5)
    flusher = AsyncFlusher(s).start()
    try:
        append(s, [b"x" * 100] * 20, term=1)
        deadline = time.monotonic() + 10
        while (s.dirty or flusher.flushes == 0) and time.monotonic() < deadline:  # poll, bounded
            time.sleep(0.005)
        assert not s.dirty and flusher.flushes >= 1
    finally:
        flusher.stop()
    append(s, [b"y"], term=1)
    flusher.stop()  # stopping twice is harmless
    s.close()


def test_a_sync_returns_only_once_a_concurrent_sync_of_its_writes_is_done(tmp_path):
    """Two threads sync at once (a node's flusher and its ready loop): the one that finds nothing left to take
    must still wait for the other's fdatasync, or it would report as durable what is not on disk yet."""
    from storage.fileio import FileIO

    class HeldSync(FileIO):
        def __init__(self):
            self.entered = threading.Event()
            self.release = threading.Event()

        def fdatasync(self, fd):
            self.entered.set()
            assert self.release.wait(10)
            super().fdatasync(fd)

    io = HeldSync()
    s = FileLogStore.open(str(tmp_path), segment_size=SEGMENT, flush="async", index_units=INDEX_UNITS, io=io)
    try:
        append(s, [b"a"], term=1)
        first = threading.Thread(target=s.sync)
        first.start()
        assert io.entered.wait(10)  # the first sync took the dirty file and is in its fdatasync
        second_done = threading.Event()
        second = threading.Thread(target=lambda: (s.sync(), second_done.set()))
        second.start()
        assert not second_done.wait(0.2), "the second sync returned while the first was still syncing"
        io.release.set()
        first.join(10)
        second.join(10)
        assert second_done.is_set()
    finally:
        io.release.set()
        s.close()
