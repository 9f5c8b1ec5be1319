"""The index: one 32-byte unit per log index (docs/formats.md section 2), so term(i) and pos(i) cost one lookup.

    offset field  type
    0      magic  i32   the entry's magic (0 = no unit: never written, or cleared by a truncation)
    4      pos    i64   the entry's absolute byte position in the data files
    12     size   i32   the entry's total size (header + body)
    16     index  i64   the log index (a check that the unit is where it should be)
    24     term   i64   the entry's term

The unit of index i is at byte ``(i % units_per_file) * 32`` of the file named ``segment_name(first * 32)`` where
``first = i - i % units_per_file`` (DLedger's naming: a file is named by the absolute position of its first byte).

Index files are derived from the data files and rebuilt from them by recovery, so they are never fsynced on the
append path. They are preallocated with ``posix_fallocate`` at creation (DLedger preallocates too), which makes
the mmap writes that fill them safe: a full disk fails the creation, cleanly, never a later store into the map.

``units_per_file`` is a node setting (``[storage] index_units_per_file``, docs/storage.md): DLedger's 160 MiB
by default, small in the test suite, where hundreds of nodes would otherwise preallocate tens of gigabytes.
Because a unit's byte is ``index * 32`` whatever the file size, a log whose files were made with another size
still has every unit in its place; only the cut into files differs. Opening files of another size is refused
when that shows (a file larger than the setting's, or one starting where no file of this size can start), with
the file named; what cannot show (a smaller first file, e.g. one cut by a crash) is grown and used as it is.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from storage.errors import StorageError
from storage.fileio import FileIO
from storage.segments import list_segments, segment_name

if TYPE_CHECKING:
    from storage.codec import Buf

UNIT: Final = struct.Struct(">iqiqq")
UNIT_SIZE: Final = UNIT.size  # 32
DEFAULT_UNITS_PER_FILE: Final = 5_242_880  # 160 MiB files, as DLedger
_ZERO_UNIT: Final = bytes(UNIT_SIZE)
_TERM: Final = struct.Struct(">q")
_POS_SIZE: Final = struct.Struct(">qi")


def _other_size(path: str, base: int, size: int, units_per_file: int, made: int) -> StorageError:
    """The error for an index file made with another ``index_units_per_file`` (``made``: the largest file's
    units, see ``units_per_file_of``); why files of another size can be refused, see the module docstring."""
    shows = (
        f"holds {size // UNIT_SIZE} units" if size > units_per_file * UNIT_SIZE else f"starts at byte {base}"
    )
    was = (
        f"index_units_per_file = {made}"
        if made and made != units_per_file
        else "another index_units_per_file"
    )
    return StorageError(
        f"index file {path} {shows}: it was made with {was}, not this node's {units_per_file}; "
        "set [storage] index_units_per_file back to the value its index files were made with (docs/storage.md)"
    )


def units_per_file_of(directory: str) -> int | None:
    """The ``units_per_file`` the index files in ``directory`` were made with: the size of the largest (a file
    is never larger than its setting; a smaller one was cut by a crash), or None without files. What a store
    opened without a size uses (``FileLogStore.open``, ``repair``): tools and tests that open a node's log
    without its config keep the node's layout."""
    if not os.path.isdir(directory):
        return None
    largest = max((os.stat(path).st_size for _, path in list_segments(directory)), default=0)
    return largest // UNIT_SIZE or None


@dataclass(slots=True)
class _IndexFile:
    first: int  # log index of unit 0
    path: str
    fd: int
    mm: mmap.mmap


class IndexFiles:
    """The index files of one log, memory-mapped read-write."""

    def __init__(self, directory: str, units_per_file: int, io: FileIO):
        if units_per_file <= 0:
            raise ValueError(f"units_per_file must be positive, got {units_per_file}")
        self.directory = directory
        self.units = units_per_file
        self.io = io
        self._files: dict[int, _IndexFile] = {}  # file number -> file
        os.makedirs(directory, exist_ok=True)
        file_bytes = units_per_file * UNIT_SIZE
        opened: list[tuple[int, str, int]] = []  # (first byte, path, fd)
        try:
            for base, path in list_segments(directory):
                opened.append((base, path, io.open(path, os.O_RDWR)))
            sizes = [io.size(fd) for _, _, fd in opened]
            made = max(sizes, default=0) // UNIT_SIZE  # a file is never larger than its setting made it
            for (base, path, _), size in zip(opened, sizes, strict=True):
                if base % file_bytes or size > file_bytes:  # checked for every file before any is grown
                    raise _other_size(path, base, size, units_per_file, made)
            for (base, path, fd), size in zip(opened, sizes, strict=True):
                if size != file_bytes:  # cut by a crash or by hand: units past the cut are rebuilt
                    io.fallocate(fd, 0, file_bytes)
                    io.ftruncate(fd, file_bytes)
                mm = mmap.mmap(fd, file_bytes)
                self._files[base // file_bytes] = _IndexFile(base // UNIT_SIZE, path, fd, mm)
        except BaseException:
            for f in self._files.values():
                f.mm.close()
            self._files.clear()
            for _, _, fd in opened:
                io.close(fd)
            raise

    def _file(self, index: int) -> _IndexFile | None:
        return self._files.get(index // self.units)

    def ensure(self, lo: int, hi: int) -> list[int]:
        """Create (and preallocate) the files that units lo..hi-1 need; returns the file numbers it created."""
        created: list[int] = []
        try:
            for num in range(lo // self.units, (hi - 1) // self.units + 1):
                if num in self._files:
                    continue
                first = num * self.units
                path = os.path.join(self.directory, segment_name(first * UNIT_SIZE))
                fd = self.io.open(path, os.O_RDWR | os.O_CREAT)
                try:
                    self.io.fallocate(fd, 0, self.units * UNIT_SIZE)
                    mm = mmap.mmap(fd, self.units * UNIT_SIZE)
                except BaseException:
                    self.io.close(fd)
                    self.io.unlink(path)
                    raise
                self._files[num] = _IndexFile(first, path, fd, mm)
                created.append(num)
        except BaseException:
            self.remove_files(created)  # all or nothing: a failed append leaves no new index file behind
            raise
        return created

    def remove_files(self, nums: list[int]) -> None:
        for num in nums:
            f = self._files.pop(num)
            f.mm.close()
            self.io.close(f.fd)
            self.io.unlink(f.path)

    # -- units ---------------------------------------------------------------------------------------------------

    def write(self, first: int, packed: Buf) -> None:
        """Store consecutive packed units starting at index ``first`` (files must exist: see ``ensure``)."""
        f = self._files[first // self.units]
        off = (first - f.first) * UNIT_SIZE
        total = len(packed)
        if off + total <= self.units * UNIT_SIZE:  # the usual case: one file
            f.mm[off : off + total] = packed
            return
        view = memoryview(packed)
        i, done = first, 0
        while done < total:
            f = self._files[i // self.units]
            off = (i - f.first) * UNIT_SIZE
            n = min(total - done, self.units * UNIT_SIZE - off)
            f.mm[off : off + n] = view[done : done + n]
            done += n
            i += n // UNIT_SIZE

    def read_units(self, lo: int, hi: int) -> bytes:
        """Packed units lo..hi-1 (zeros where a file is missing)."""
        out = []
        i = lo
        while i < hi:
            num = i // self.units
            n = min(hi, (num + 1) * self.units) - i
            f = self._files.get(num)
            if f is None:
                out.append(bytes(n * UNIT_SIZE))
            else:
                off = (i - f.first) * UNIT_SIZE
                out.append(f.mm[off : off + n * UNIT_SIZE])
            i += n
        return b"".join(out)

    def clear(self, lo: int, hi: int) -> None:
        """Zero units lo..hi-1 where their files exist (after a truncation)."""
        i = lo
        while i < hi:
            num = i // self.units
            n = min(hi, (num + 1) * self.units) - i
            f = self._files.get(num)
            if f is not None:
                off = (i - f.first) * UNIT_SIZE
                f.mm[off : off + n * UNIT_SIZE] = bytes(n * UNIT_SIZE)
            i += n

    def unit(self, index: int) -> tuple[int, int, int, int, int]:
        """(magic, pos, size, index, term) of ``index``; all zeros if there is no file for it."""
        f = self._files.get(index // self.units)
        if f is None:
            return (0, 0, 0, 0, 0)
        return UNIT.unpack_from(f.mm, (index - f.first) * UNIT_SIZE)

    def term(self, index: int) -> int:
        f = self._files[index // self.units]
        term: int = _TERM.unpack_from(f.mm, (index - f.first) * UNIT_SIZE + 24)[0]
        return term

    def pos_size(self, index: int) -> tuple[int, int]:
        f = self._files[index // self.units]
        return _POS_SIZE.unpack_from(f.mm, (index - f.first) * UNIT_SIZE + 4)

    def pos(self, index: int) -> int:
        f = self._files[index // self.units]
        pos: int = _TERM.unpack_from(f.mm, (index - f.first) * UNIT_SIZE + 4)[0]
        return pos

    def last_written(self, floor: int) -> int:
        """The highest index >= ``floor`` with a non-zero unit, assuming units are zero after the tail; floor - 1
        if none. Used only as a hint by recovery, which checks the unit against the data."""
        for num in sorted(self._files, reverse=True):
            f = self._files[num]
            lo = max(floor, f.first)
            hi = f.first + self.units - 1
            if hi < lo:
                continue
            mm = f.mm

            def nonzero(i: int, mm: mmap.mmap = mm, first: int = f.first) -> bool:
                off = (i - first) * UNIT_SIZE
                return mm[off : off + UNIT_SIZE] != _ZERO_UNIT

            if not nonzero(lo):
                continue
            while lo < hi:  # invariant: nonzero(lo)
                mid = (lo + hi + 1) // 2
                if nonzero(mid):
                    lo = mid
                else:
                    hi = mid - 1
            return lo
        return floor - 1

    # -- files ---------------------------------------------------------------------------------------------------

    def drop_before(self, index: int) -> None:
        """Remove files whose every unit is before ``index`` (compaction)."""
        for num in sorted(self._files):
            if (num + 1) * self.units <= index:
                self.remove_files([num])

    def drop_all(self) -> None:
        self.remove_files(sorted(self._files, reverse=True))

    def flush(self) -> None:
        """msync every file (on close: a clean shutdown leaves an index recovery needs not rebuild)."""
        for f in self._files.values():
            f.mm.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.mm.close()
            self.io.close(f.fd)
        self._files.clear()
