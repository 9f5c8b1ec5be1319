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
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from storage.fileio import FileIO

UNIT: Final = struct.Struct(">qiq")
UNIT_SIZE: Final = UNIT.size  # 20
UNITS_PER_FILE: Final = 300_000
FILE_SIZE: Final = UNITS_PER_FILE * UNIT_SIZE


@dataclass(frozen=True, slots=True)
class CQUnit:
    queue_offset: int
    commitlog_offset: int
    size: int
    tags_code: int


def queue_dir(root: str | os.PathLike, topic: str, queue_id: int) -> Path:
    return Path(root) / topic / str(queue_id)


class ConsumeQueue:
    """Append-only units of one topic/queue. Appends go to the page cache; ``flush`` makes them durable.

    ``append`` only buffers the unit: the dispatcher writes a chunk's units of each queue with one ``pwrite``
    (``write_appended``, at the end of every apply), instead of a system call per message on every node. Every
    other method writes the buffer first, so nothing reads around it."""

    def __init__(
        self,
        root: str | os.PathLike,
        topic: str,
        queue_id: int,
        units_per_file: int = UNITS_PER_FILE,
        io: FileIO | None = None,
    ):
        # Writes, truncations and syncs go through the storage's file layer (storage/fileio.py), so the chaos
        # launcher's power-loss mode sees them (docs/chaos.md).
        self.io = io or FileIO()
        self.topic = topic
        self.queue_id = queue_id
        self.dir = queue_dir(root, topic, queue_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._file_size = units_per_file * UNIT_SIZE
        self._fds: dict[int, int] = {}  # file start byte -> fd
        self._dirty: set[int] = set()
        self._appended = bytearray()  # units appended but not yet written, from queue offset _appended_at
        self._appended_at = 0
        self.max_offset = self._recover()
        files = self._files()
        self.min_offset = files[0] // UNIT_SIZE if files else 0  # units below: their file was deleted

    # -- files ---------------------------------------------------------------------------------------------
    def _files(self) -> list[int]:
        return sorted(int(p.name) for p in self.dir.iterdir() if p.name.isdigit())

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            fd = self.io.open(str(self.dir / f"{start:020d}"), os.O_RDWR | os.O_CREAT, 0o644)
            self._fds[start] = fd
        return fd

    def _recover(self) -> int:
        """The next queue offset; a torn unit at the end (a crash mid-write) is cut off."""
        files = self._files()
        if not files:
            return 0
        last = files[-1]
        path = self.dir / f"{last:020d}"
        length = path.stat().st_size
        whole = length - length % UNIT_SIZE
        if whole != length:
            self.io.ftruncate(self._fd(last), whole)
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
        """Write the appended units, one ``pwrite`` per file they fall in."""
        data = self._appended
        if not data:
            return
        self._appended = bytearray()
        byte, done = self._appended_at * UNIT_SIZE, 0
        while done < len(data):
            at = byte + done
            start = at - at % self._file_size
            n = min(len(data) - done, start + self._file_size - at)
            self.io.pwrite(self._fd(start), bytes(data[done : done + n]), at - start)
            self._dirty.add(start)
            done += n

    def put(self, queue_offset: int, commitlog_offset: int, size: int, tags_code: int) -> None:
        """Fill the unit of an offset below ``max_offset`` (a hole left by ``skip_to``)."""
        self.write_appended()
        if not 0 <= queue_offset < self.max_offset:
            raise IndexError(
                f"{self.topic}/{self.queue_id}: put at {queue_offset} outside [0, {self.max_offset})"
            )
        byte = queue_offset * UNIT_SIZE
        start = byte - byte % self._file_size
        self.io.pwrite(self._fd(start), UNIT.pack(commitlog_offset, size, tags_code), byte - start)
        self._dirty.add(start)

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
        self._dirty.add(start)
        self.max_offset = queue_offset

    def truncate(self, queue_offset: int) -> int:
        """Remove units at ``queue_offset`` and after; returns how many were removed."""
        self.write_appended()
        if queue_offset >= self.max_offset:
            return 0
        removed = self.max_offset - queue_offset
        byte = queue_offset * UNIT_SIZE
        for start in self._files():
            path = self.dir / f"{start:020d}"
            if start > byte:
                self._close_file(start)
                self.io.unlink(str(path))
            elif byte - start < self._file_size:
                self.io.ftruncate(self._fd(start), byte - start)
        self.max_offset = queue_offset
        return removed

    def drop_before(self, queue_offset: int) -> int:
        """Delete the files whose every unit is below ``queue_offset`` (retention: the log no longer holds
        their messages), never the last one; returns how many were deleted."""
        self.write_appended()
        files = self._files()
        byte = queue_offset * UNIT_SIZE
        dropped = 0
        for start in files[:-1]:
            if start + self._file_size > byte:
                break
            self._close_file(start)
            self.io.unlink(str(self.dir / f"{start:020d}"))
            dropped += 1
            self.min_offset = (start + self._file_size) // UNIT_SIZE
        return dropped

    def flush(self) -> None:
        self.write_appended()
        for start in self._dirty:
            fd = self._fds.get(start)
            if fd is not None:
                self.io.fdatasync(fd)
        self._dirty.clear()

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
        self.write_appended()
        if queue_offset < 0:
            raise IndexError(f"{self.topic}/{self.queue_id}: negative queue offset {queue_offset}")
        n = min(max_units, self.max_offset - queue_offset)
        if n <= 0 or queue_offset < self.min_offset:
            return []
        byte = queue_offset * UNIT_SIZE
        start = byte - byte % self._file_size
        n = min(n, (start + self._file_size - byte) // UNIT_SIZE)
        raw = os.pread(self._fd(start), n * UNIT_SIZE, byte - start)
        return [
            CQUnit(queue_offset + i, *UNIT.unpack_from(raw, i * UNIT_SIZE))
            for i in range(len(raw) // UNIT_SIZE)
        ]

    def spans(self, queue_offset: int, max_units: int) -> tuple[list[int], list[int]]:
        """``read`` for a pull: the (commitlog offsets, sizes) of up to ``max_units`` consecutive units, unpacked
        with one call and no object per unit (fewer at a file end or the queue end)."""
        self.write_appended()
        if queue_offset < 0:
            raise IndexError(f"{self.topic}/{self.queue_id}: negative queue offset {queue_offset}")
        n = min(max_units, self.max_offset - queue_offset)
        if n <= 0 or queue_offset < self.min_offset:
            return [], []
        byte = queue_offset * UNIT_SIZE
        start = byte - byte % self._file_size
        n = min(n, (start + self._file_size - byte) // UNIT_SIZE)
        raw = os.pread(self._fd(start), n * UNIT_SIZE, byte - start)
        n = len(raw) // UNIT_SIZE
        if n == 0:
            return [], []
        flat = _offsets_and_sizes(n).unpack_from(raw)
        return list(flat[0::2]), list(flat[1::2])

    def _close_file(self, start: int) -> None:
        fd = self._fds.pop(start, None)
        self._dirty.discard(start)
        if fd is not None:
            self.io.close(fd)

    def close(self) -> None:
        self.flush()
        for start in list(self._fds):
            self._close_file(start)


@functools.lru_cache(maxsize=64)
def _offsets_and_sizes(n: int) -> struct.Struct:
    """The commitlog_offset and size fields of ``n`` packed units (tags codes skipped)."""
    return struct.Struct(">" + "qi8x" * n)
