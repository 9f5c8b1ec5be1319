"""ConsumeQueue: per topic and queue, fixed 20-byte units pointing at messages in the log (docs/formats.md section 4).

    offset field             bytes
    0      commitlog_offset  8     the message's body position in the log: entry pos + 48
    8      size              4     the message's TOTALSIZE (= the entry's body_length)
    12     tags_code         8     Java String.hashCode of the tags (0 when none)

The unit for queue offset q is at byte ``q * 20`` across files of 300,000 units (6,000,000 bytes) named by the
absolute byte position of their first byte (20 digits), under ``consumequeue/<topic>/<queueId>/``. Units are
written only for committed messages, so a ConsumeQueue is derived data: on restart it is checked against the log
and repaired (``truncate`` drops units beyond the log; the dispatcher re-dispatches what is missing). Retention
deletes whole files at the front (``drop_before``): offsets below ``min_offset`` read as no units.

A node may hold tens of thousands of queues (10,000 topics of 8), so a queue costs no descriptor while idle:
its files are opened through a node-wide ``OpenFiles`` that keeps at most ``OPEN_FILES`` of them open (least
recently used closed first), as RocketMQ maps its files lazily; and ``holds`` answers "are the first n units on
disk?" with one ``stat``, so a restart need not open every queue.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from storage.fileio import FileIO

log = logging.getLogger(__name__)

UNIT: Final = struct.Struct(">qiq")
UNIT_SIZE: Final = UNIT.size  # 20
UNITS_PER_FILE: Final = 300_000
FILE_SIZE: Final = UNITS_PER_FILE * UNIT_SIZE
OPEN_FILES: Final = 1024  # descriptors a node's ConsumeQueues keep open at most (the process limit is shared)
SYNCFS_AT: Final = 64  # files to sync from which one syncfs of their filesystem replaces an fdatasync each


@dataclass(frozen=True, slots=True)
class CQUnit:
    queue_offset: int
    commitlog_offset: int
    size: int
    tags_code: int


def queue_dir(root: str | os.PathLike[str], topic: str, queue_id: int) -> str:
    """A queue's directory. Paths are built by concatenation, not ``os.path.join``: the joins were a fifth of a
    restart's replay that opened 80,000 queues."""
    return f"{os.fspath(root)}/{topic}/{queue_id}"


def file_path(directory: str, start: int) -> str:
    """The queue file whose first unit is at byte ``start`` of the queue."""
    return f"{directory}/{start:020d}"


def holds(
    root: str | os.PathLike[str], topic: str, queue_id: int, n: int, units_per_file: int = UNITS_PER_FILE
) -> bool:
    """Does the queue's last file reach unit ``n - 1`` (so ``ConsumeQueue.max_offset >= n``)? One ``stat`` of the
    file that unit lives in: what a restart asks of every queue its snapshot names. False may also mean a
    later file holds it: open the queue to know."""
    if n <= 0:
        return True
    file_size = units_per_file * UNIT_SIZE
    last = (n - 1) * UNIT_SIZE
    start = last - last % file_size
    try:
        size = os.stat(file_path(queue_dir(root, topic, queue_id), start)).st_size
    except FileNotFoundError:
        return False
    return size >= last - start + UNIT_SIZE


class OpenFiles:
    """The ConsumeQueue files a node keeps open: at most ``limit``, the least recently used closed first. Every
    caller uses a descriptor at once and asks again next time, so closing one never pulls it from under a
    caller; data written through a closed descriptor stays in the page cache and a later ``fdatasync`` of the
    same file (reopened) makes it durable."""

    def __init__(self, io: FileIO | None = None, limit: int = OPEN_FILES):
        if limit < 1:
            raise ValueError(f"OpenFiles needs a limit of at least 1, got {limit}")
        self.io = io or FileIO()
        self.limit = limit
        self._fds: OrderedDict[str, int] = OrderedDict()
        # Queues with files written since their last flush: a node's flush syncs these, not every queue it holds.
        self.written: set[ConsumeQueue] = set()
        self._no_syncfs = False  # syncfs was refused: fdatasync each file

    def __len__(self) -> int:
        return len(self._fds)

    def fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        fd = self.io.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._fds[path] = fd
        if len(self._fds) > self.limit:
            self.io.close(self._fds.popitem(last=False)[1])
        return fd

    def close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            self.io.close(fd)

    def close_all(self) -> None:
        while self._fds:
            self.io.close(self._fds.popitem()[1])

    def sync(self, paths: Iterable[str]) -> None:
        """fdatasync each file through a descriptor of its own, not the cached ones, so it may run off the event
        loop while ``fd`` closes and reuses those; a file deleted since it was written (retention, a truncation)
        is skipped. From ``SYNCFS_AT`` files on, one ``syncfs`` of their filesystem instead: an fdatasync of a
        file just written costs a journal commit, so a node that wrote to each of 80,000 queues spent 20-26 s
        syncing them one by one (docs/benchmarks.md)."""
        paths = list(paths)
        if len(paths) >= SYNCFS_AT and self.io.can_syncfs and not self._no_syncfs:
            try:
                self._each(list(_one_per_filesystem(paths).values()), self.io.syncfs)
                return
            except (
                OSError
            ) as e:  # refused here (a seccomp filter, an old kernel): an fdatasync each from now on
                if e.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                    raise
                self._no_syncfs = True
                log.warning("syncfs is refused here (%s): ConsumeQueue files are synced one by one", e)
        self._each(paths, self.io.fdatasync)

    def _each(self, paths: list[str], sync: Callable[[int], None]) -> None:
        for path in paths:
            try:
                fd = self.io.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                sync(fd)
            finally:
                self.io.close(fd)


def _one_per_filesystem(paths: Iterable[str]) -> dict[int, str]:
    """A file of each filesystem (device) the existing ``paths`` are on."""
    found: dict[int, str] = {}
    for path in paths:
        try:
            found.setdefault(os.stat(path).st_dev, path)
        except FileNotFoundError:
            continue
    return found


class ConsumeQueue:
    """Append-only units of one topic/queue. Appends go to the page cache; ``flush`` makes them durable.

    ``append`` only buffers the unit: the dispatcher writes a chunk's units of each queue with one ``pwrite``
    (``write_appended``, at the end of every apply), instead of a system call per message on every node. Every
    other method writes the buffer first, so nothing reads around it. Descriptors come from ``files`` (the
    node's ``OpenFiles``; a queue made alone gets its own)."""

    __slots__ = (
        "_appended",
        "_appended_at",
        "_dir",
        "_dirty",
        "_file_size",
        "_files",
        "io",
        "max_offset",
        "min_offset",
        "queue_id",
        "rewrites",
        "topic",
    )

    def __init__(
        self,
        root: str | os.PathLike[str],
        topic: str,
        queue_id: int,
        units_per_file: int = UNITS_PER_FILE,
        io: FileIO | None = None,
        files: OpenFiles | None = None,
    ):
        # Writes, truncations and syncs go through the storage's file layer (storage/fileio.py), so the chaos
        # launcher's power-loss mode sees them (docs/chaos.md).
        self._files = files if files is not None else OpenFiles(io)
        self.io = self._files.io
        self.topic = topic
        self.queue_id = queue_id
        self._dir = queue_dir(root, topic, queue_id)
        self._file_size = units_per_file * UNIT_SIZE
        self._dirty: set[int] | None = None  # file starts written since the last flush
        self._appended = bytearray()  # units appended but not yet written, from queue offset _appended_at
        self._appended_at = 0
        # Bumped whenever units below ``max_offset`` change (a hole filled, a truncation, files dropped or
        # removed): a copy of units read earlier is stale once it moves (``BrokerStateMachine``'s replay).
        self.rewrites = 0
        files_ = self._list()
        self.max_offset = self._recover(files_)
        self.min_offset = files_[0] // UNIT_SIZE if files_ else 0  # units below: their file was deleted

    @property
    def dir(self) -> Path:
        return Path(self._dir)

    # -- files ---------------------------------------------------------------------------------------------
    def _list(self) -> list[int]:
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:  # created at its first write
            return []
        return sorted(int(name) for name in names if name.isdigit())

    def _path(self, start: int) -> str:
        return file_path(self._dir, start)

    def _fd(self, start: int) -> int:
        path = self._path(start)
        try:
            return self._files.fd(path)
        except FileNotFoundError:  # the queue's first file: its directory comes with it
            os.makedirs(self._dir, exist_ok=True)
            return self._files.fd(path)

    def _written(self, start: int) -> None:
        if self._dirty is None:
            self._dirty = set()
            self._files.written.add(self)
        self._dirty.add(start)

    def _recover(self, files: list[int]) -> int:
        """The next queue offset; a torn unit at the end (a crash mid-write) is cut off."""
        if not files:
            return 0
        last = files[-1]
        fd = self._fd(last)  # kept open: a replay reads the units it holds next (``raw_units``)
        length = os.fstat(fd).st_size
        whole = length - length % UNIT_SIZE
        if whole != length:
            self.io.ftruncate(fd, whole)
        return (last + whole) // UNIT_SIZE

    # -- writes --------------------------------------------------------------------------------------------
    def append(self, commitlog_offset: int, size: int, tags_code: int) -> int:
        """Add the unit for the next queue offset (written by ``write_appended``) and return that offset."""
        q = self.max_offset
        if not self._appended:
            self._appended_at = q
        self._appended += UNIT.pack(commitlog_offset, size, tags_code)
        self.max_offset = q + 1
        return q

    @property
    def has_appended(self) -> bool:
        """Are there appended units not yet written?"""
        return bool(self._appended)

    def write_appended(self) -> None:
        """Write the appended units, one ``pwrite`` per file they fall in. A write that fails (a full disk)
        keeps the units it did not write appended, so the next call writes them: none is left a hole."""
        data = self._appended
        if not data:
            return
        self._appended = bytearray()
        byte, done = self._appended_at * UNIT_SIZE, 0
        try:
            while done < len(data):
                at = byte + done
                start = at - at % self._file_size
                n = min(len(data) - done, start + self._file_size - at)
                self.io.pwrite(self._fd(start), bytes(data[done : done + n]), at - start)
                self._written(start)
                done += n
        except BaseException:
            self._appended = data[done:]
            self._appended_at += done // UNIT_SIZE
            raise

    def put(self, queue_offset: int, commitlog_offset: int, size: int, tags_code: int) -> None:
        """Fill the unit of an offset below ``max_offset`` (a hole left by ``skip_to``)."""
        self.write_appended()
        if not 0 <= queue_offset < self.max_offset:
            raise IndexError(
                f"{self.topic}/{self.queue_id}: put at {queue_offset} outside [0, {self.max_offset})"
            )
        byte = queue_offset * UNIT_SIZE
        start = byte - byte % self._file_size
        self.rewrites += 1
        self.io.pwrite(self._fd(start), UNIT.pack(commitlog_offset, size, tags_code), byte - start)
        self._written(start)

    def skip_to(self, queue_offset: int) -> None:
        """Make the queue end at ``queue_offset`` with zero units (size 0: not held here) in between: the
        messages before a snapshot that the log no longer holds. The hole is kept on disk (a sparse file)."""
        self.write_appended()
        if queue_offset <= self.max_offset:
            return
        byte = queue_offset * UNIT_SIZE
        start = (byte - 1) - (byte - 1) % self._file_size
        fd = self._fd(start)
        if self.io.size(fd) < byte - start:
            self.io.ftruncate(fd, byte - start)
        self._written(start)
        self.max_offset = queue_offset

    def truncate(self, queue_offset: int) -> int:
        """Remove units at ``queue_offset`` and after; returns how many were removed."""
        self.write_appended()
        if queue_offset >= self.max_offset:
            return 0
        removed = self.max_offset - queue_offset
        self.rewrites += 1
        byte = queue_offset * UNIT_SIZE
        for start in self._list():
            if start > byte:
                self._close_file(start)
                self.io.unlink(self._path(start))
            elif byte - start < self._file_size:
                self.io.ftruncate(self._fd(start), byte - start)
        self.max_offset = queue_offset
        return removed

    def drop_before(self, queue_offset: int) -> int:
        """Delete the files whose every unit is below ``queue_offset`` (retention: the log no longer holds
        their messages), never the last one; returns how many were deleted."""
        self.write_appended()
        files = self._list()
        byte = queue_offset * UNIT_SIZE
        dropped = 0
        self.rewrites += 1
        for start in files[:-1]:
            if start + self._file_size > byte:
                break
            self._close_file(start)
            self.io.unlink(self._path(start))
            dropped += 1
            self.min_offset = (start + self._file_size) // UNIT_SIZE
        return dropped

    def flush(self) -> None:
        for path in self.take_written():
            self.io.fdatasync(self._files.fd(path))

    def take_written(self) -> list[str]:
        """Write the appended units and hand over the files written since the last flush: the caller makes them
        durable (``flush``, or ``OpenFiles.sync`` off the event loop)."""
        self.write_appended()
        dirty, self._dirty = self._dirty, None
        self._files.written.discard(self)
        return [self._path(start) for start in sorted(dirty or ())]

    # -- reads ---------------------------------------------------------------------------------------------
    def get(self, queue_offset: int) -> CQUnit:
        units = self.read(queue_offset, 1)
        if not units:
            raise IndexError(
                f"{self.topic}/{self.queue_id}: queue offset {queue_offset} not in [0, {self.max_offset})"
            )
        return units[0]

    def read(self, queue_offset: int, max_units: int) -> list[CQUnit]:
        """Up to ``max_units`` consecutive units from ``queue_offset`` (fewer at a file end or the queue end)."""
        raw = self.raw_units(queue_offset, max_units)
        return [
            CQUnit(queue_offset + i, *UNIT.unpack_from(raw, i * UNIT_SIZE))
            for i in range(len(raw) // UNIT_SIZE)
        ]

    def raw_units(self, queue_offset: int, max_units: int) -> bytes:
        """``read`` as the units' bytes (``UNIT`` each), with one ``pread``."""
        self.write_appended()
        if queue_offset < 0:
            raise IndexError(f"{self.topic}/{self.queue_id}: negative queue offset {queue_offset}")
        n = min(max_units, self.max_offset - queue_offset)
        if n <= 0 or queue_offset < self.min_offset:
            return b""
        byte = queue_offset * UNIT_SIZE
        start = byte - byte % self._file_size
        n = min(n, (start + self._file_size - byte) // UNIT_SIZE)
        return os.pread(self._fd(start), n * UNIT_SIZE, byte - start)

    def spans(self, queue_offset: int, max_units: int) -> tuple[list[int], list[int]]:
        """``read`` for a pull: the (commitlog offsets, sizes) of up to ``max_units`` consecutive units, unpacked
        with one call and no object per unit (fewer at a file end or the queue end)."""
        raw = self.raw_units(queue_offset, max_units)
        n = len(raw) // UNIT_SIZE
        if n == 0:
            return [], []
        flat = _offsets_and_sizes(n).unpack_from(raw)
        return list(flat[0::2]), list(flat[1::2])

    def _close_file(self, start: int) -> None:
        """Before the file is deleted: nothing of it is left to sync."""
        if self._dirty is not None:
            self._dirty.discard(start)
        self._files.close(self._path(start))

    def remove(self) -> None:
        """Delete the queue's files and directory (its topic was deleted): nothing appended is written."""
        self._appended = bytearray()
        self._dirty = None
        self.rewrites += 1
        for start in self._list():
            self._files.close(self._path(start))
            self.io.unlink(self._path(start))
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)
        self.max_offset = self.min_offset = 0

    def close(self) -> None:
        self.flush()
        for start in self._list():
            self._files.close(self._path(start))


@functools.lru_cache(maxsize=64)
def _offsets_and_sizes(n: int) -> struct.Struct:
    """The commitlog_offset and size fields of ``n`` packed units (tags codes skipped)."""
    return struct.Struct(">" + "qi8x" * n)
