"""The key and message-id index: which CommitLog positions hold a message with a given key or message id, so a
query by key or id reads a few messages instead of scanning the log. RocketMQ's IndexFile layout, in files
beside the ConsumeQueues (``<node dir>/keyindex/``; docs/formats.md section 8).

Each file is a header, a table of hash slots and an array of entries. An entry is (hash, position, previous
entry of the same slot); a slot holds its newest entry, so a lookup walks one chain from the newest entry to the
oldest. The dispatcher adds a message's entries as it dispatches it (an entry, then its slot: a few ``struct``
operations on a memory map, no system call) and writes the header (entry count, last position) once per apply
chunk. A file that fills up is followed by a new one; lookups go from the newest file to the oldest.

The files are derived data, like the ConsumeQueues, and never part of a snapshot. The header's last position
says what is indexed: positions grow with the log, so a message at or below it is never indexed twice, and at
start the node indexes what its log holds past it (all of it when the directory is missing). A file not closed
cleanly (the process was killed) gets its slots rebuilt from its entries up to the header's count at open (an
entry written after the last header write is dropped, and indexed again from the log); only the newest file can
be in that state: a full one is marked clean as the next one starts, and stays so. Nothing is synced but
before every snapshot (``take_unsynced``: the files written since, synced by the snapshot thread through
descriptors of their own, which covers what the memory map wrote) or at ``flush``, so a power loss may lose recent
entries: delete the directory to rebuild it.

Hashes collide (64 bits) and entries outlive what they point at (a message deleted by retention, a message of
a deleted topic): a query reads each candidate message and keeps those whose key or id matches and that their
ConsumeQueue still points at (``core/admin.py``).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

KEY: Final = "k"
MSG_ID: Final = "i"
MAGIC: Final = b"DLKI"
VERSION: Final = 1
HEADER: Final = struct.Struct(
    ">4sIIIIIqq"
)  # magic, version, slots, capacity, count, clean, last_pos, first_pos
HEADER_SIZE: Final = 64
SLOT: Final = struct.Struct(">I")  # entry number + 1 of the slot's newest entry; 0: empty
ENTRY: Final = struct.Struct(
    ">qqI"
)  # hash, CommitLog position, entry number + 1 of the previous one (0: none)
SLOTS: Final = 1 << 20  # 4 MiB of slots a file
CAPACITY: Final = 1 << 22  # entries a file (80 MiB, written as it fills: the file is sparse until then)
REBUILD_CHUNK: Final = 1 << 16  # entries read at once when a file's slots are rebuilt (1.25 MiB)
assert array("I").itemsize == SLOT.size  # the rebuild's slot table is an array of them


def _hash(data: bytes) -> int:
    """Adler-32 (high half) and CRC-32 (low half: the slot, so slots spread as CRC-32 does) of ``data``, as a
    signed 64-bit integer: cheap, and a collision only costs a lookup one more message read."""
    h = (zlib.adler32(data) << 32) | zlib.crc32(data)
    return h - (1 << 64) if h >= 1 << 63 else h


def key_hash(kind: str, value: str) -> int:
    """The hash of ``kind:value`` (UTF-8): ``"k:" + key`` or ``"i:" + message id``."""
    return _hash(f"{kind}:{value}".encode())


class _File:
    __slots__ = ("base", "capacity", "count", "first_pos", "last_pos", "mask", "mm", "path", "slots")

    def __init__(self, path: Path, slots: int, capacity: int, written: bool = True):
        """``written``: the file entries are added to (the newest). It is marked not clean while open; an older,
        full file is never written again, so once its slots are right it stays clean."""
        self.path = path
        fresh = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fresh:
                os.ftruncate(fd, HEADER_SIZE + SLOT.size * slots + ENTRY.size * capacity)
            self.mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        if fresh:
            HEADER.pack_into(self.mm, 0, MAGIC, VERSION, slots, capacity, 0, 1, -1, -1)
        magic, version, self.slots, self.capacity, self.count, clean, self.last_pos, self.first_pos = (
            HEADER.unpack_from(self.mm, 0)
        )
        if magic != MAGIC or version != VERSION or self.slots & (self.slots - 1):
            self.mm.close()
            raise ValueError(f"{path}: not a key index file of version {VERSION}")
        self.mask = self.slots - 1
        self.base = HEADER_SIZE + SLOT.size * self.slots
        if not clean:
            self._rebuild_slots()
        if written or not clean:
            self.write_header(clean=not written)

    def _rebuild_slots(self) -> None:
        """The slots of the entries the header counts (an entry past it may have moved its slot already).

        A restart after a kill runs this on a file of up to ``CAPACITY`` entries before the node serves, so it
        goes a chunk of entries at a time: the low 32 bits of each hash (the slot's bits) are gathered from the
        chunk's bytes by slicing, and each entry costs one Python step, a table store (the newest entry of a
        slot is the last stored). An entry at a time through ``struct`` took 2.9 s for 2 million entries."""
        mm, mask, base, size = self.mm, self.mask, self.base, ENTRY.size
        table = array("I", bytes(SLOT.size * self.slots))
        for first in range(0, self.count, REBUILD_CHUNK):
            n = min(REBUILD_CHUNK, self.count - first)
            raw = mm[base + size * first : base + size * (first + n)]
            low = bytearray(4 * n)
            for k in range(4):  # a hash is 8 big-endian bytes at the entry's start: its low half is bytes 4-7
                low[k::4] = raw[4 + k :: size]
            words = array("I", low)
            if sys.byteorder == "little":
                words.byteswap()
            for j, w in enumerate(words, first + 1):
                table[w & mask] = j
        if sys.byteorder == "little":
            table.byteswap()
        mm[HEADER_SIZE:base] = table.tobytes()

    def write_header(self, clean: bool) -> None:
        HEADER.pack_into(
            self.mm,
            0,
            MAGIC,
            VERSION,
            self.slots,
            self.capacity,
            self.count,
            int(clean),
            self.last_pos,
            self.first_pos,
        )

    def find(self, h: int, limit: int, out: list[int]) -> None:
        mm = self.mm
        e = SLOT.unpack_from(mm, HEADER_SIZE + SLOT.size * (h & self.mask))[0]
        while e and len(out) < limit:
            if e > self.count:
                return  # cannot happen after an open: an entry past the header's count
            eh, pos, prev = ENTRY.unpack_from(mm, self.base + ENTRY.size * (e - 1))
            if eh == h and pos not in out:  # an entry indexed twice across a crash at a file's end
                out.append(pos)
            e = prev

    def close(self, clean: bool) -> None:
        self.write_header(clean)
        self.mm.flush()
        self.mm.close()


class KeyIndex:
    def __init__(self, directory: str | Path, slots: int = SLOTS, capacity: int = CAPACITY):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._slots, self._capacity = slots, capacity
        self._files: list[_File] = []
        paths = sorted(self.dir.glob("*.idx"))
        for k, path in enumerate(paths):
            try:
                self._files.append(_File(path, slots, capacity, written=k == len(paths) - 1))
            except ValueError:
                path.unlink()  # unreadable: what it held is indexed again from the log
        self.last_pos: int = max((f.last_pos for f in self._files), default=-1)
        self._pending_pos = self.last_pos
        self.added = 0  # entries added since start
        self._unsynced: set[_File] = set()  # files written since they were last synced

    def _writable(self, need: int = 1) -> _File:
        if not self._files or self._files[-1].count + need > self._files[-1].capacity:
            if self._files:  # full: written no more, its slots final (a kill leaves nothing to rebuild)
                self._files[-1].write_header(clean=True)
                self._unsynced.add(self._files[-1])
            n = int(self._files[-1].path.stem) + 1 if self._files else 0
            self._files.append(_File(self.dir / f"{n:08d}.idx", self._slots, self._capacity))
        return self._files[-1]

    def add(self, pos: int, msg_id: str | None, keys: Iterable[str]) -> None:
        """Index the message at CommitLog position ``pos`` (ignored at or below the last one indexed)."""
        self.add_raw(pos, msg_id.encode() if msg_id else None, " ".join(keys).encode() or None)

    def add_raw(self, pos: int, msg_id: bytes | None, keys: bytes | None) -> None:
        """``add`` with the message's raw UNIQ_KEY and KEYS property values (keys separated by spaces)."""
        self.add_many(((pos, msg_id, keys),))

    def add_many(self, items: Sequence[tuple[int, bytes | None, bytes | None]]) -> None:
        """``add_raw`` for each (pos, raw UNIQ_KEY, raw KEYS) of an apply chunk, in one loop: the dispatcher
        collects a chunk's messages and indexes them together (a call per message and per entry cost more
        than the hashing)."""
        if not items:
            return
        unpack_slot, pack_slot, pack_entry = SLOT.unpack_from, SLOT.pack_into, ENTRY.pack_into
        f = self._writable()
        last, added = self._pending_pos, 0
        for pos, uniq, keys in items:
            if pos <= last:
                continue
            last = pos
            hashes = [_hash(b"i:" + uniq)] if uniq else []
            if keys:
                hashes += [_hash(b"k:" + k) for k in keys.split(b" ") if k]
            if not hashes:
                continue
            if f.count + len(hashes) > f.capacity:  # this file is full: on to the next
                self._unsynced.add(f)
                f = self._writable(len(hashes))
            mm, base, mask, count = f.mm, f.base, f.mask, f.count
            for h in hashes:
                slot = HEADER_SIZE + SLOT.size * (h & mask)
                pack_entry(mm, base + ENTRY.size * count, h, pos, unpack_slot(mm, slot)[0])
                count += 1
                pack_slot(mm, slot, count)
            f.count = count
            if f.first_pos < 0:
                f.first_pos = pos
            f.last_pos = pos
            added += len(hashes)
        self._pending_pos = last
        self.added += added

    def commit(self) -> None:
        """Record what ``add`` wrote (the entry count and the last position) in the header."""
        if self._pending_pos == self.last_pos:
            return
        self.last_pos = self._pending_pos
        f = self._writable()
        f.write_header(clean=False)
        self._unsynced.add(f)

    def take_unsynced(self) -> list[str]:
        """Record what is indexed (``commit``) and hand over the files written since they were last synced: the
        caller makes them durable (an ``fdatasync`` of each, off the event loop; ``ConsumeQueue.take_written``
        is the same for the queues)."""
        self.commit()
        taken, self._unsynced = self._unsynced, set()
        return [str(f.path) for f in taken]

    def flush(self) -> None:
        """Make what is indexed durable, on the calling thread."""
        self.commit()
        taken, self._unsynced = self._unsynced, set()
        for f in taken:
            if f in self._files:  # not a file pruned since
                f.mm.flush()

    def lookup(self, kind: str, value: str, limit: int) -> list[int]:
        """Positions of messages that may carry ``value`` as a key (``KEY``) or message id (``MSG_ID``),
        newest first, at most ``limit``."""
        h = key_hash(kind, value)
        out: list[int] = []
        for f in reversed(self._files):
            f.find(h, limit, out)
            if len(out) >= limit:
                break
        return out

    def prune_below(self, pos: int) -> int:
        """Delete the files (never the newest) whose every entry is before ``pos`` (the log no longer holds
        them); returns how many entries went."""
        gone = 0
        while len(self._files) > 1 and self._files[0].last_pos < pos:
            f = self._files.pop(0)
            self._unsynced.discard(f)
            gone += f.count
            f.close(clean=True)
            f.path.unlink()
        return gone

    def rows(self) -> int:
        return sum(f.count for f in self._files)

    def close(self) -> None:
        self.commit()
        for f in self._files:
            f.close(clean=True)
        self._files = []
