"""``FileLogStore``: the durable ``LogStore`` over DLedger-format data and index files.

Layout under the node directory: ``data/`` (segment files, and ``start.json``: where the log begins) and
``index/`` (32-byte units). See ``segments``, ``index`` and ``recovery`` for each part; this module is the
policy that ties them together:

- ``append`` validates the frames (``codec.scan_frames``: structure, body_crc, dense index, pos, chain from the
  tail) before writing anything, writes them with one ``pwrite`` per data file touched (normally one), and
  under the ``sync`` policy calls fdatasync once for the whole batch (group commit). Index units are written
  after the data, into preallocated memory-mapped files.
- A failed write (ENOSPC, EIO) is rolled back: files are cut back to their size before the append, files the
  append created are removed, so reopening finds the log exactly as it was. ENOSPC raises ``DiskFullError``.
- The ``async`` policy leaves data in the page cache (survives kill -9, not power loss, as DLedger's default);
  the owner calls ``sync()`` when ``flush_due(now_ms)`` says so, from a thread of its choice, or starts an
  ``AsyncFlusher``. The store never starts a thread by itself.

Thread safety: one lock serialises every call; ``sync()`` holds it only to collect duplicated descriptors and
runs fdatasync outside it, so an event loop appending under ``async`` is not blocked by an executor's fsync.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from storage import bodies, codec
from storage.api import EntryFields, LogPosition
from storage.codec import Entry
from storage.errors import (
    Compacted,
    DiskFullError,
    IndexOutOfRange,
    StorageCorruptError,
    StorageError,
    StoreClosedError,
)
from storage.fileio import FileIO, is_disk_full
from storage.index import DEFAULT_UNITS_PER_FILE, UNIT, IndexFiles, units_per_file_of
from storage.recovery import LogStart, Recovery, recover
from storage.segments import DataSegments

FLUSH_POLICIES = ("sync", "async")

_T = TypeVar("_T")


def _fields(h: Any, body: memoryview) -> EntryFields:
    """(magic, index, term, pos, body) of a ``codec.HEADER`` unpack and its body."""
    return h[0], h[2], h[3], h[4], body


class FileLogStore:
    """A ``LogStore`` on disk. Create with ``FileLogStore.open(directory, ...)``."""

    def __init__(
        self,
        directory: str,
        segment_size: int,
        flush: str,
        flush_interval_ms: int,
        io: FileIO,
        index_units: int | None,
        verify: str,
        tail_bytes: int,
        repair: bool,
    ):
        if flush not in FLUSH_POLICIES:
            raise ValueError(f"flush must be one of {FLUSH_POLICIES}, got {flush!r}")
        if verify not in ("tail", "full"):
            raise ValueError(f"verify must be 'tail' or 'full', got {verify!r}")
        if segment_size <= codec.HEADER_SIZE + codec.MIN_BLANK_LEN:
            raise ValueError(f"segment_size {segment_size} cannot hold even an empty entry")
        if flush_interval_ms <= 0:
            raise ValueError(f"flush_interval_ms must be positive, got {flush_interval_ms}")
        self.directory = directory
        self.segment_size = segment_size
        self.flush_policy = flush
        self.flush_interval_ms = flush_interval_ms
        self.io = io
        self._lock = threading.RLock()
        # Held through a whole ``sync`` (not the store's lock, which readers and the writer take meanwhile): a sync
        # that finds nothing left to take still waits for one in progress, which may hold its writes.
        self._sync_lock = threading.Lock()
        self._closed = False
        self._dirty = False
        self._flush_mark_ms: float | None = None
        data_dir = os.path.join(directory, "data")
        index_dir = os.path.join(directory, "index")
        os.makedirs(data_dir, exist_ok=True)
        start = LogStart.load(data_dir)
        record_start = start is None  # a new log, or one whose record is missing: it starts at index 0
        if start is None:
            start = LogStart.fresh(segment_size)
        elif start.segment_size and start.segment_size != segment_size:
            raise StorageError(
                f"log in {directory} was written with segment_size {start.segment_size}, opened with {segment_size}"
            )
        self._data_dir = data_dir
        self._start = start
        self._segments = DataSegments(data_dir, segment_size, io)
        if index_units is None:
            index_units = units_per_file_of(index_dir) or DEFAULT_UNITS_PER_FILE
        try:
            self._index = IndexFiles(index_dir, index_units, io)
        except BaseException:
            self._segments.close()
            raise
        try:
            # Files that hold only compacted entries (a crash between the start record and their removal).
            self._segments.drop_before(start.prev.end_pos)
            self._index.drop_before(start.first_index)
            self.recovery: Recovery = recover(
                self._segments,
                self._index,
                start,
                full=verify == "full",
                tail_bytes=tail_bytes,
                repair=repair,
            )
        except BaseException:
            self._index.close()
            self._segments.close()
            raise
        self._tail = self.recovery.tail
        if record_start:
            start.save(data_dir, io)  # after recovery accepted the data as a log from index 0
        if self.recovery.torn_bytes or self.recovery.dropped_entries:
            self._segments.sync_dirty()

    @classmethod
    def open(
        cls,
        directory: str,
        segment_size: int = codec.DEFAULT_SEGMENT_SIZE,
        flush: str = "sync",
        flush_interval_ms: int = 10,
        *,
        io: FileIO | None = None,
        index_units: int | None = None,
        verify: str = "tail",
        tail_bytes: int = 32 << 20,
    ) -> FileLogStore:
        """Open (or create) the log in ``directory``, recovering from a crash.

        ``verify="tail"`` checks the last ``tail_bytes`` of the log (fast open); ``"full"`` checks every entry.
        Corruption before the tail raises ``StorageCorruptError``; run ``repair`` to truncate there.
        ``store.recovery`` reports what recovery found and did. ``index_units``: units per index file (a node
        passes its ``[storage] index_units_per_file``); None: what the log's index files were made with, the
        default for a new log, so a tool opening a node's log without its config keeps the node's layout.
        """
        return cls(
            directory,
            segment_size,
            flush,
            flush_interval_ms,
            io or FileIO(),
            index_units,
            verify,
            tail_bytes,
            repair=False,
        )

    # -- facts ---------------------------------------------------------------------------------------------------

    @property
    def first_index(self) -> int:
        self._check_open()
        return self._start.first_index

    @property
    def last_index(self) -> int:
        self._check_open()
        return self._tail.last_index

    def tail(self) -> LogPosition:
        self._check_open()
        return self._tail

    def snapshot_point(self) -> LogPosition:
        """The position just before ``first_index`` (the last compacted entry, or the fresh-log origin)."""
        self._check_open()
        return self._start.prev

    # -- writes --------------------------------------------------------------------------------------------------

    def append(self, frames: bytes | bytearray | memoryview) -> list[int]:
        with self._lock:
            self._check_open()
            t = self._tail
            seg = self.segment_size
            run = codec.scan_frames(
                frames, t.last_index + 1, t.end_pos, t.chain_crc, seg, prev_term=t.last_term
            )
            n = len(run.offsets)
            if n == 0:
                return []
            first = t.last_index + 1
            positions, sizes, offsets = run.positions, run.sizes, run.offsets
            view = memoryview(frames)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            touched: dict[int, int | None] = {}
            created_index: list[int] = []
            end = t.end_pos
            try:
                created_index = self._index.ensure(first, first + n)
                k = 0
                while k < n:
                    p = positions[k]
                    base = p - p % seg
                    j = n
                    last_p = positions[n - 1]
                    if last_p - last_p % seg != base:  # the batch crosses into another file: find where
                        j = k + 1
                        while j < n and positions[j] - positions[j] % seg == base:
                            j += 1
                    if base != end - end % seg and end % seg:
                        self._pad(end, touched)
                    if end and base != (end - 1) - (end - 1) % seg:
                        # The first write into a new file: the previous file is made durable first, so a later
                        # file with data proves the earlier ones whole, whatever a power cut keeps of unsynced
                        # pages (recovery's mid-log evidence, docs/storage.md). Once per segment file.
                        self._segments.sync_file((end - 1) - (end - 1) % seg)
                    self._remember(base, touched)
                    self._segments.write(p, view[offsets[k] : offsets[j - 1] + sizes[j - 1]])
                    end = positions[j - 1] + sizes[j - 1]
                    k = j
                if self.flush_policy == "sync":
                    self._segments.sync_dirty()
            except OSError as exc:
                self._rollback(touched, created_index, exc)
                if is_disk_full(exc):
                    raise DiskFullError(
                        f"disk full appending entries {first}..{first + n - 1} in {self.directory}; "
                        "the append was rolled back"
                    ) from exc
                raise StorageError(
                    f"append of entries {first}..{first + n - 1} failed and was rolled back: {exc}"
                ) from exc
            self._index.write(
                first,
                b"".join(map(UNIT.pack, run.magics, positions, sizes, range(first, first + n), run.terms)),
            )
            self._tail = LogPosition(first + n - 1, run.terms[-1], end, run.chains[-1])
            self._dirty = self.flush_policy == "async"
            return positions

    def _pad(self, end: int, touched: dict[int, int | None]) -> None:
        """Fill the rest of the file holding ``end`` with a blank record (zeros if under 8 bytes remain)."""
        room = self.segment_size - end % self.segment_size
        self._remember(end - end % self.segment_size, touched)
        filler = codec.encode_blank(room) if room >= codec.MIN_BLANK_LEN else bytes(room)
        self._segments.write(end, filler)

    def _remember(self, base: int, touched: dict[int, int | None]) -> None:
        if base not in touched:
            seg = self._segments.get(base)
            touched[base] = None if seg is None else seg.size

    def _rollback(self, touched: dict[int, int | None], created_index: list[int], exc: OSError) -> None:
        try:
            for base, size in touched.items():
                self._segments.restore_size(base, size)
            self._index.remove_files(created_index)
            # No fdatasync here: it may fail the same way. The cut files stay dirty and the next sync flushes
            # them; if a crash comes first, recovery sees at most whole unacknowledged entries or a torn tail.
        except OSError as undo:
            self._closed = True  # the files are in an unknown state: refuse further use; reopening recovers
            raise StorageError(
                f"append failed ({exc}) and rolling it back failed too ({undo}); reopen the log to recover"
            ) from undo

    def truncate_suffix(self, index: int) -> None:
        with self._lock:
            self._check_open()
            first, last = self._start.first_index, self._tail.last_index
            if index < first:
                raise Compacted(f"cannot truncate from index {index}: entries before {first} are compacted")
            if index > last + 1:
                raise IndexOutOfRange(f"cannot truncate from index {index}: the log ends at {last}")
            if index == last + 1:
                return
            new_tail = self._position_after(index - 1)
            self._segments.truncate(new_tail.end_pos)
            self._index.clear(index, last + 1)
            if self.flush_policy == "sync":
                self._segments.sync_dirty()
                self._segments.sync_dir()
            else:
                self._dirty = True
            self._tail = new_tail

    def compact_prefix(self, index: int) -> None:
        with self._lock:
            self._check_open()
            first, last = self._start.first_index, self._tail.last_index
            if index <= first:
                return
            if index > last + 1:
                raise IndexOutOfRange(f"cannot compact up to index {index}: the log ends at {last}")
            prev = self._position_after(index - 1)
            cut = self._index.pos(index) if index <= last else prev.end_pos
            new_start = LogStart(index, prev, self.segment_size)
            new_start.save(self._data_dir, self.io)  # durable before anything is removed
            self._start = new_start
            self._segments.drop_before(cut)
            self._index.drop_before(index)

    def reset_to_snapshot(self, meta_index: int, meta_term: int, chain_crc: int, end_pos: int) -> None:
        """Drop every entry and continue after a snapshot's last included entry.

        Call it after the snapshot itself is durable. Files are removed first, the start record written last:
        a crash in between leaves an empty log at the old start, which the follower refills from its leader.
        """
        with self._lock:
            self._check_open()
            if meta_index < -1 or meta_term < 0 or end_pos < 0:
                raise ValueError(f"bad snapshot point index={meta_index} term={meta_term} end_pos={end_pos}")
            prev = LogPosition(meta_index, meta_term, end_pos, chain_crc & 0xFFFFFFFF)
            self._segments.drop_all()
            self._index.drop_all()
            self._segments.sync_dir()
            new_start = LogStart(meta_index + 1, prev, self.segment_size)
            new_start.save(self._data_dir, self.io)
            self._start = new_start
            self._tail = prev
            self._dirty = False

    def _position_after(self, index: int) -> LogPosition:
        """The tail the log would have if ``index`` were its last entry (reads its chain_crc from the data)."""
        if index == self._start.first_index - 1:
            return self._start.prev
        pos, size = self._index.pos_size(index)
        head = self._segments.read(pos, codec.HEADER_SIZE)
        h = codec.HEADER.unpack_from(head) if len(head) == codec.HEADER_SIZE else None
        if h is None or h[2] != index or h[4] != pos or h[1] != size:
            raise StorageCorruptError(
                "index unit does not match the data",
                self._segments.path_of(pos),
                pos % self.segment_size,
                index,
            )
        return LogPosition(index, h[3], pos + size, h[6])

    # -- durability ----------------------------------------------------------------------------------------------

    def sync(self) -> None:
        """fdatasync every data file written since the last sync; safe to call from another thread. Returns once
        everything written before the call is durable: concurrent calls go one at a time."""
        with self._sync_lock:
            self._sync()

    def _sync(self) -> None:
        with self._lock:
            self._check_open()
            fds = self._segments.take_dirty()
            self._dirty = False
        failed: OSError | None = None
        for fd in fds:
            try:
                if failed is None:
                    self.io.fdatasync(fd)
            except OSError as exc:
                failed = exc
            finally:
                os.close(fd)
        if failed is not None:
            with self._lock:
                for base in self._segments.bases():
                    self._segments.mark_dirty(base)
                self._dirty = True
            if is_disk_full(failed):
                raise DiskFullError(f"disk full while flushing {self.directory}") from failed
            raise StorageError(f"flushing {self.directory} failed: {failed}") from failed

    def flush_due(self, now_ms: float) -> bool:
        """Under ``async``: whether unflushed data is at least ``flush_interval_ms`` old (then call ``sync``).

        ``now_ms`` comes from the caller's clock (the runtime's monotonic time), so the store reads no clock.
        """
        if self._closed or not self._dirty:
            return False
        if self._flush_mark_ms is None:
            self._flush_mark_ms = now_ms
        if now_ms - self._flush_mark_ms >= self.flush_interval_ms:
            self._flush_mark_ms = now_ms
            return True
        return False

    @property
    def dirty(self) -> bool:
        """True if appended data may not be durable yet (``async`` policy)."""
        return self._dirty

    def close(self) -> None:
        with self._lock:
            self._check_open()
            self._closed = True
            try:
                self._segments.sync_dirty()
                self._index.flush()
            finally:
                try:
                    self._index.close()
                finally:
                    self._segments.close()

    # -- reads ---------------------------------------------------------------------------------------------------

    def term(self, index: int) -> int:
        with self._lock:
            self._check_open()
            if self._start.first_index <= index <= self._tail.last_index:
                return self._index.term(index)
            if index == self._start.prev.last_index:
                return self._start.prev.last_term
            self._raise_range(index)

    def entry(self, index: int) -> Entry:
        return self.entries(index, index + 1)[0]

    def raw(self, lo: int, hi: int, max_bytes: int | None = None) -> bytes:
        with self._lock:
            self._check_open()
            self._check_span(lo, hi)
            return b"".join(self._read_runs(lo, hi, max_bytes)[0])

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        return self._decoded(lo, hi, max_bytes, codec.decoded_entry)

    def entry_fields(self, lo: int, hi: int, max_bytes: int | None = None) -> list[EntryFields]:
        return self._decoded(lo, hi, max_bytes, _fields)

    def _decoded(
        self, lo: int, hi: int, max_bytes: int | None, make: Callable[[Any, memoryview], _T]
    ) -> list[_T]:
        """Entries lo..hi-1 (cut by ``max_bytes``), each checked against its place and CRC as it is cut out of
        the file's bytes and handed to ``make(header fields, body)``."""
        with self._lock:
            self._check_open()
            self._check_span(lo, hi)
            chunks, starts = self._read_runs(lo, hi, max_bytes)
        out: list[_T] = []
        unpack = codec.HEADER.unpack_from
        crc32 = codec._crc32
        index = lo
        for data, pos0 in zip(chunks, starts, strict=True):
            mv = memoryview(data)
            off = 0
            end = len(data)
            while off < end:
                h = unpack(mv, off)
                size = h[1]
                body = mv[off + codec.HEADER_SIZE : off + size]
                if (
                    h[2] != index
                    or h[4] != pos0 + off
                    or size != codec.HEADER_SIZE + h[8]
                    or crc32(body) != h[7]
                ):
                    raise StorageCorruptError(
                        "entry fails its check on read (index, pos, size or body_crc)",
                        self._segments.path_of(pos0 + off),
                        (pos0 + off) % self.segment_size,
                        index,
                    )
                out.append(make(h, body))
                off += size
                index += 1
        return out

    def bodies_at(
        self, positions: Sequence[int], lengths: Sequence[int], magic: int = codec.MAGIC_NORMAL
    ) -> bytes:
        """See ``LogStore.bodies_at`` (``storage.bodies``: few preads, each entry checked as it is cut out)."""
        with self._lock:
            self._check_open()
            return bodies.read(
                self._segments,
                self._index,
                self._start.first_index,
                self._tail.last_index,
                self._start.prev.end_pos,
                self._tail.end_pos,
                positions,
                lengths,
                magic,
            )

    def _read_runs(self, lo: int, hi: int, max_bytes: int | None) -> tuple[list[bytes], list[int]]:
        """Read entries lo..hi-1 (cut by ``max_bytes``, at least one) as one pread per data file touched."""
        chunks: list[bytes] = []
        starts: list[int] = []
        if lo == hi:
            return chunks, starts
        seg = self.segment_size
        budget = max_bytes
        a = lo
        index = self._index
        while a < hi:
            pa = index.pos(a)
            base = pa - pa % seg
            # e: last index in [a, hi) inside this file (positions ascend, files are contiguous ranges)
            pl = index.pos(hi - 1)
            if pl - pl % seg == base:
                e = hi - 1
            else:
                x, y = a, hi - 1
                while x < y:
                    mid = (x + y + 1) // 2
                    if index.pos(mid) < base + seg:
                        x = mid
                    else:
                        y = mid - 1
                e = x
            pe, se = index.pos_size(e)
            nbytes = pe + se - pa
            if budget is not None and nbytes > budget:
                # largest e' in [a, e) whose bytes fit; the first entry of the whole read always goes
                x, y = a, e
                while x < y:
                    mid = (x + y) // 2
                    pm, sm = index.pos_size(mid)
                    if pm + sm - pa <= budget:
                        x = mid + 1
                    else:
                        y = mid
                e = x - 1  # last that fits, or a - 1 if none
                if e < a:
                    if chunks:
                        break
                    e = a
                pe, se = index.pos_size(e)
                nbytes = pe + se - pa
                data = self._segments.read(pa, nbytes)
                self._check_read(data, nbytes, pa, a)
                chunks.append(data)
                starts.append(pa)
                break
            data = self._segments.read(pa, nbytes)
            self._check_read(data, nbytes, pa, a)
            chunks.append(data)
            starts.append(pa)
            if budget is not None:
                budget -= nbytes
            a = e + 1
        return chunks, starts

    def _check_read(self, data: bytes, want: int, pos: int, index: int) -> None:
        if len(data) != want:
            raise StorageCorruptError(
                f"data file is shorter than the index says ({len(data)} of {want} bytes)",
                self._segments.path_of(pos),
                pos % self.segment_size,
                index,
            )

    # -- helpers -------------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the log store in {self.directory} is closed")

    def _check_span(self, lo: int, hi: int) -> None:
        if hi < lo:
            raise IndexOutOfRange(f"empty range {lo}..{hi}")
        if lo < self._start.first_index:
            if lo < 0:
                raise IndexOutOfRange(f"index {lo} is negative")
            raise Compacted(f"index {lo} is compacted (first index is {self._start.first_index})")
        if hi > self._tail.last_index + 1:
            raise IndexOutOfRange(
                f"range {lo}..{hi} runs past the end of the log (last index {self._tail.last_index})"
            )

    def _raise_range(self, index: int) -> NoReturn:
        if 0 <= index < self._start.first_index:
            raise Compacted(f"index {index} is compacted (first index is {self._start.first_index})")
        raise IndexOutOfRange(
            f"index {index} is past the end of the log (last index {self._tail.last_index})"
        )


def repair(
    directory: str,
    segment_size: int = codec.DEFAULT_SEGMENT_SIZE,
    *,
    index_units: int | None = None,
) -> Recovery:
    """Check every entry and truncate the log at the first bad one (the operator's answer to corruption).

    ``index_units`` None: the size the index files were made with (``dledger repair`` has no node config), as
    for ``FileLogStore.open``.
    Returns the ``Recovery``: ``bad`` names the file, offset and index cut, ``dropped_entries`` how many
    entries (by the index's count) were lost with it. Losing entries can break Raft's promises for this node:
    run it only when the node can refill its log from the group.
    """
    store = FileLogStore(directory, segment_size, "sync", 10, FileIO(), index_units, "full", 0, repair=True)
    result = store.recovery
    store.close()
    return result


class AsyncFlusher:
    """An explicit background thread that calls ``store.sync()`` every ``interval_ms`` while data is dirty.

    For owners without their own scheduler; the node runtime can instead poll ``flush_due`` and submit
    ``sync`` to its single-thread executor. ``stop()`` joins the thread and does a final sync; an error in a
    flush stops the thread and is re-raised by ``stop()``.
    """

    def __init__(self, store: FileLogStore, interval_ms: int | None = None):
        self.store = store
        self.interval_s = (interval_ms or store.flush_interval_ms) / 1000.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.flushes = 0

    def start(self) -> AsyncFlusher:
        if self._thread is not None:
            raise RuntimeError("flusher already started")
        self._thread = threading.Thread(target=self._run, name=f"flusher:{self.store.directory}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.store.dirty:
                    self.store.sync()
                    self.flushes += 1
            except StoreClosedError:
                return
            except BaseException as exc:  # reported by stop(); a flusher that cannot flush must not spin
                self.error = exc
                return

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self.error is not None:
            raise self.error
        if self.store.dirty:
            self.store.sync()
