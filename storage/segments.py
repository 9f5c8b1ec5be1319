"""Data segment files: the log's bytes at their absolute positions, split into fixed-size files.

A position ``pos`` lives in the file named ``segment_name(pos - pos % segment_size)`` (20 digits, DLedger's and
RocketMQ's naming) at offset ``pos % segment_size``. Entries never straddle files (``codec.place``); the rest of a
file is padded with a blank record (``codec.encode_blank``). Files are not preallocated: a file's size is what
was written to it, so the recovered tail is close to ``size`` and the page cache carries everything a killed
process wrote.

Writes use ``pwrite`` through ``FileIO`` (one call per batch and file), reads use ``pread``: measured against
mmap on this machine, pwrite appends were as fast for batches and need no remapping as files grow, and pread of
a contiguous range returns ``bytes`` that replication can send as they are.

This module knows positions and files only; which bytes form valid entries is ``recovery``'s business.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from storage.errors import StorageCorruptError
from storage.fileio import FileIO

if TYPE_CHECKING:
    from storage.codec import Buf

NAME_DIGITS = 20


def segment_name(base: int) -> str:
    """A segment's file name: the absolute byte position of its first byte, zero-padded to 20 digits."""
    return f"{base:0{NAME_DIGITS}d}"


def parse_segment_name(name: str) -> int | None:
    """The base position a file name stands for, or None if it is not a segment name."""
    if len(name) == NAME_DIGITS and name.isdigit():
        return int(name)
    return None


def list_segments(directory: str) -> list[tuple[int, str]]:
    """(base, path) of every segment-named file in ``directory``, in position order."""
    out = []
    for name in os.listdir(directory):
        base = parse_segment_name(name)
        if base is not None:
            out.append((base, os.path.join(directory, name)))
    out.sort()
    return out


@dataclass(slots=True)
class Segment:
    """One open data file. ``size`` is its length on disk as this process knows it."""

    base: int
    path: str
    fd: int
    size: int
    dirty: bool = field(default=False)


class DataSegments:
    """The set of data files of one log, opened read-write."""

    def __init__(self, directory: str, segment_size: int, io: FileIO):
        self.directory = directory
        self.segment_size = segment_size
        self.io = io
        self._segs: dict[int, Segment] = {}
        self._order: list[int] = []  # bases, ascending
        os.makedirs(directory, exist_ok=True)
        for base, path in list_segments(directory):
            if base % segment_size:
                raise StorageCorruptError(
                    f"data file name is not a multiple of the segment size {segment_size}", path, 0
                )
            fd = io.open(path, os.O_RDWR)
            size = io.size(fd)
            if size > segment_size:
                io.close(fd)
                raise StorageCorruptError(
                    f"data file is larger than the segment size {segment_size}", path, size
                )
            self._segs[base] = Segment(base, path, fd, size)
            self._order.append(base)

    # -- lookup --------------------------------------------------------------------------------------------------

    def base_of(self, pos: int) -> int:
        return pos - pos % self.segment_size

    def bases(self) -> list[int]:
        return list(self._order)

    def get(self, base: int) -> Segment | None:
        return self._segs.get(base)

    def path_of(self, pos: int) -> str:
        """The path of the file that holds (or would hold) ``pos``, for error messages."""
        return os.path.join(self.directory, segment_name(self.base_of(pos)))

    def end_pos(self) -> int:
        """Absolute position just past the last byte of the last file (0 when there are no files)."""
        if not self._order:
            return 0
        last = self._segs[self._order[-1]]
        return last.base + last.size

    # -- writes --------------------------------------------------------------------------------------------------

    def create(self, base: int) -> Segment:
        if base in self._segs:
            return self._segs[base]
        path = os.path.join(self.directory, segment_name(base))
        fd = self.io.open(path, os.O_RDWR | os.O_CREAT)
        try:
            # The new name must be durable before any fdatasync of the file's data can acknowledge an entry in
            # it: fdatasync does not sync the directory entry (fsync(2)), and a power cut would take the file
            # with every entry in it (found by the power-loss emulation, storage/powerloss.py).
            self.io.fsync_dir(self.directory)
        except BaseException:
            self.io.close(fd)
            raise
        seg = Segment(base, path, fd, self.io.size(fd))
        self._segs[base] = seg
        self._order.append(base)
        self._order.sort()
        return seg

    def write(self, pos: int, data: Buf) -> Segment:
        """Write ``data`` at absolute ``pos`` (all inside one file, created if needed) in one call."""
        seg = self._segs.get(self.base_of(pos)) or self.create(self.base_of(pos))
        off = pos - seg.base
        if off + len(data) > self.segment_size:
            raise ValueError(
                f"write of {len(data)} bytes at {pos} would straddle segment {segment_name(seg.base)}"
            )
        self.io.pwrite(seg.fd, data, off)
        seg.size = max(seg.size, off + len(data))
        seg.dirty = True
        return seg

    def restore_size(self, base: int, size: int | None) -> None:
        """Undo writes to a file: truncate it back to ``size``, or remove it when it did not exist (None)."""
        seg = self._segs.get(base)
        if seg is None:
            return
        if size is None:
            self._remove(base)
            return
        self.io.ftruncate(seg.fd, size)
        seg.size = size
        seg.dirty = True

    def truncate(self, end_pos: int) -> list[str]:
        """Cut the log's bytes at ``end_pos``: later files are removed, the file holding it is shortened.

        Returns the paths removed. A file whose base equals ``end_pos`` holds nothing afterwards and is removed.
        """
        removed = []
        for base in list(reversed(self._order)):
            if base >= end_pos:
                removed.append(self._segs[base].path)
                self._remove(base)
        base = self.base_of(end_pos)
        seg = self._segs.get(base)
        if seg is not None and seg.size > end_pos - base:
            self.io.ftruncate(seg.fd, end_pos - base)
            seg.size = end_pos - base
            seg.dirty = True
        return removed

    def drop_before(self, pos: int) -> list[str]:
        """Remove files whose every byte is before ``pos`` (compaction). Returns the paths removed."""
        removed = []
        for base in list(self._order):
            if base + self.segment_size <= pos:
                removed.append(self._segs[base].path)
                self._remove(base)
        return removed

    def drop_all(self) -> None:
        """Remove every file, highest position first (a crash midway leaves a shorter, still valid log)."""
        for base in list(reversed(self._order)):
            self._remove(base)

    def _remove(self, base: int) -> None:
        seg = self._segs.pop(base)
        self._order.remove(base)
        self.io.close(seg.fd)
        self.io.unlink(seg.path)

    # -- durability ----------------------------------------------------------------------------------------------

    def take_dirty(self) -> list[int]:
        """Duplicated descriptors of files written since the last call, for an fdatasync outside the lock.

        The caller closes them. A dup keeps the file alive even if a concurrent truncate removes it.
        """
        fds = []
        for base in self._order:
            seg = self._segs[base]
            if seg.dirty:
                fds.append(os.dup(seg.fd))
                seg.dirty = False
        return fds

    def mark_dirty(self, base: int) -> None:
        seg = self._segs.get(base)
        if seg is not None:
            seg.dirty = True

    def sync_dirty(self) -> None:
        """fdatasync every file written since the last sync (in the caller's thread)."""
        for base in self._order:
            seg = self._segs[base]
            if seg.dirty:
                self.io.fdatasync(seg.fd)
                seg.dirty = False

    def sync_file(self, base: int) -> None:
        """fdatasync one file if it was written since its last sync."""
        seg = self._segs.get(base)
        if seg is not None and seg.dirty:
            self.io.fdatasync(seg.fd)
            seg.dirty = False

    def sync_dir(self) -> None:
        self.io.fsync_dir(self.directory)

    # -- reads ---------------------------------------------------------------------------------------------------

    def read(self, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes at absolute ``pos`` inside one file (fewer at the end of the file)."""
        seg = self._segs.get(self.base_of(pos))
        if seg is None:
            return b""
        return self.io.pread(seg.fd, min(n, self.segment_size - (pos - seg.base)), pos - seg.base)

    def close(self) -> None:
        errors = []
        for base in list(self._order):
            seg = self._segs.pop(base)
            try:
                self.io.close(seg.fd)
            except OSError as exc:  # keep closing the rest, then report the first failure
                errors.append(exc)
        self._order.clear()
        if errors:
            raise errors[0]
