"""In-memory twins of the log and metadata stores, for the deterministic Raft simulator and tests.

``MemoryLogStore`` keeps exactly the facts ``FileLogStore`` keeps (same frames, same positions, same validation,
same errors) without any I/O, so the simulator can drive hundreds of thousands of entries per second through the
real Raft core and the contract suite can hold both stores to one behaviour. Frames live back to back in one
bytearray (a replication read is one slice); per-entry facts live in parallel lists indexed by
``index - first_index``. Blank filler records are not stored: positions still skip to the next segment exactly
as ``codec.place`` says, because ``pos`` is replicated state and must match the file store byte for byte.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NoReturn

from storage import codec
from storage.api import EntryFields, HardState, LogPosition
from storage.codec import Entry
from storage.errors import Compacted, IndexOutOfRange, NoEntryError, StoreClosedError


class MemoryLogStore:
    """A ``LogStore`` held in memory. Not thread-safe (the simulator drives it from one thread)."""

    def __init__(self, segment_size: int = codec.DEFAULT_SEGMENT_SIZE):
        if segment_size <= codec.HEADER_SIZE + codec.MIN_BLANK_LEN:
            raise ValueError(f"segment_size {segment_size} cannot hold even an empty entry")
        self.segment_size = segment_size
        self._buf = bytearray()
        self._base = (
            0  # virtual offset of _buf[0]; offsets below are virtual so compaction does not rewrite them
        )
        self._off: list[int] = []
        self._pos: list[int] = []
        self._size: list[int] = []
        self._term: list[int] = []
        self._chain: list[int] = []
        self._first = 0  # index of _off[0]
        # The entry just before first_index: the snapshot point, or the (-1, 0, 0, 0) origin of a fresh log.
        self._prev = LogPosition(-1, 0, 0, 0)
        self._closed = False

    # -- facts -------------------------------------------------------------------------------------------------

    @property
    def first_index(self) -> int:
        self._check_open()
        return self._first

    @property
    def last_index(self) -> int:
        self._check_open()
        return self._first + len(self._off) - 1

    def tail(self) -> LogPosition:
        self._check_open()
        if not self._off:
            return self._prev
        return LogPosition(
            self._first + len(self._off) - 1, self._term[-1], self._pos[-1] + self._size[-1], self._chain[-1]
        )

    def snapshot_point(self) -> LogPosition:
        """The position just before ``first_index`` (the last compacted entry, or the fresh-log origin)."""
        self._check_open()
        return self._prev

    # -- writes ------------------------------------------------------------------------------------------------

    def append(self, frames: bytes | bytearray | memoryview) -> list[int]:
        if self._closed:
            raise StoreClosedError("the log store is closed")
        if self._off:  # the tail's facts, without building a LogPosition on this hot path
            nxt, end = self._first + len(self._off), self._pos[-1] + self._size[-1]
            chain, term = self._chain[-1], self._term[-1]
        else:
            p = self._prev
            nxt, end, chain, term = p.last_index + 1, p.end_pos, p.chain_crc, p.last_term
        run = codec.scan_frames(frames, nxt, end, chain, self.segment_size, prev_term=term)
        if not run.offsets:
            return []
        start = self._base + len(self._buf)
        self._buf += frames
        self._off.extend([start + o for o in run.offsets])
        self._pos.extend(run.positions)
        self._size.extend(run.sizes)
        self._term.extend(run.terms)
        self._chain.extend(run.chains)
        return run.positions

    def truncate_suffix(self, index: int) -> None:
        self._check_open()
        last = self._first + len(self._off) - 1
        if index < self._first:
            raise Compacted(f"cannot truncate from index {index}: entries before {self._first} are compacted")
        if index > last + 1:
            raise IndexOutOfRange(f"cannot truncate from index {index}: the log ends at {last}")
        k = index - self._first
        if k == len(self._off):
            return
        del self._buf[self._off[k] - self._base :]
        for col in (self._off, self._pos, self._size, self._term, self._chain):
            del col[k:]

    def compact_prefix(self, index: int) -> None:
        self._check_open()
        last = self._first + len(self._off) - 1
        if index <= self._first:
            return
        if index > last + 1:
            raise IndexOutOfRange(f"cannot compact up to index {index}: the log ends at {last}")
        k = index - self._first
        j = k - 1
        self._prev = LogPosition(index - 1, self._term[j], self._pos[j] + self._size[j], self._chain[j])
        cut = (self._off[k] if k < len(self._off) else self._base + len(self._buf)) - self._base
        del self._buf[:cut]
        self._base += cut
        for col in (self._off, self._pos, self._size, self._term, self._chain):
            del col[:k]
        self._first = index

    def reset_to_snapshot(self, meta_index: int, meta_term: int, chain_crc: int, end_pos: int) -> None:
        """Drop every entry and continue after a snapshot's last included entry (a follower installing it)."""
        self._check_open()
        if meta_index < -1 or meta_term < 0 or end_pos < 0:
            raise ValueError(f"bad snapshot point index={meta_index} term={meta_term} end_pos={end_pos}")
        self._buf = bytearray()
        self._base = 0
        for col in (self._off, self._pos, self._size, self._term, self._chain):
            col.clear()
        self._first = meta_index + 1
        self._prev = LogPosition(meta_index, meta_term, end_pos, chain_crc & 0xFFFFFFFF)

    def sync(self) -> None:
        self._check_open()

    def close(self) -> None:
        self._check_open()
        self._closed = True
        self._buf = bytearray()

    # -- reads -------------------------------------------------------------------------------------------------

    def term(self, index: int) -> int:
        self._check_open()
        k = index - self._first
        if 0 <= k < len(self._term):
            return self._term[k]
        if index == self._prev.last_index:
            return self._prev.last_term
        self._raise_range(index)

    def entry(self, index: int) -> Entry:
        self._check_open()
        return self.entries(index, index + 1)[0]

    def raw(self, lo: int, hi: int, max_bytes: int | None = None) -> bytes:
        self._check_open()
        a, b = self._span(lo, hi, max_bytes)
        if a == b:
            return b""
        return bytes(self._buf[self._off[a] - self._base : self._off[b - 1] - self._base + self._size[b - 1]])

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        self._check_open()
        a, b = self._span(lo, hi, max_bytes)
        if a == b:
            return []
        base = self._off[a]
        data = memoryview(
            bytes(self._buf[base - self._base : self._off[b - 1] - self._base + self._size[b - 1]])
        )
        unpack, make, body_at = codec.HEADER.unpack_from, codec.decoded_entry, codec.BODY_OFFSET
        out = []
        for k in range(a, b):
            off = self._off[k] - base
            out.append(make(unpack(data, off), data[off + body_at : off + self._size[k]]))
        return out

    def entry_fields(self, lo: int, hi: int, max_bytes: int | None = None) -> list[EntryFields]:
        out: list[EntryFields] = []
        for e in self.entries(lo, hi, max_bytes):
            h = e.header
            out.append((h.magic, h.index, h.term, h.pos, e.body))
        return out

    def bodies_at(
        self, positions: Sequence[int], lengths: Sequence[int], magic: int = codec.MAGIC_NORMAL
    ) -> bytes:
        self._check_open()
        if len(lengths) != len(positions):
            raise ValueError(f"{len(positions)} positions but {len(lengths)} lengths")
        first, end = self._prev.end_pos, self.tail().end_pos
        buf, hs, out = self._buf, codec.HEADER_SIZE, []
        for p, ln in zip(positions, lengths, strict=True):
            if p < first:
                raise Compacted(f"position {p} is compacted (the log starts at position {first})")
            if p + hs + ln > end or ln < 0:
                raise IndexOutOfRange(f"no entry of {ln} body bytes at {p}: the log ends at {end}")
            k = bisect.bisect_left(self._pos, p)
            o = self._off[k] - self._base if k < len(self._pos) and self._pos[k] == p else -1
            if (
                o < 0
                or self._size[k] != hs + ln
                or int.from_bytes(buf[o : o + 4], "big", signed=True) != magic
            ):
                raise NoEntryError(
                    f"no entry of magic {magic} with a {ln}-byte body starts at position {p}", p
                )
            out.append(buf[o + hs : o + hs + ln])
        return b"".join(out)

    # -- helpers -----------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the log store is closed")

    def _raise_range(self, index: int) -> NoReturn:
        if 0 <= index < self._first:
            raise Compacted(f"index {index} is compacted (first index is {self._first})")
        raise IndexOutOfRange(f"index {index} is past the end of the log (last index {self.last_index})")

    def _span(self, lo: int, hi: int, max_bytes: int | None) -> tuple[int, int]:
        """Slots [a, b) for entries lo..hi-1, cut so the total stays within ``max_bytes`` (at least one entry)."""
        if hi < lo:
            raise IndexOutOfRange(f"empty range {lo}..{hi}")
        if lo < self._first:
            if lo < 0:
                raise IndexOutOfRange(f"index {lo} is negative")
            raise Compacted(f"index {lo} is compacted (first index is {self._first})")
        last = self._first + len(self._off) - 1
        if hi > last + 1:
            raise IndexOutOfRange(f"range {lo}..{hi} runs past the end of the log (last index {last})")
        a, b = lo - self._first, hi - self._first
        if max_bytes is not None and a < b:
            b = _cut(self._off, self._size, a, b, max_bytes)
        return a, b


def _cut(offsets: list[int], sizes: list[int], a: int, b: int, max_bytes: int) -> int:
    """The largest b' in (a, b] with frames a..b'-1 within ``max_bytes``, and never below a + 1.

    Frames are contiguous in the buffer, so the bytes of a..j are ``offsets[j] + sizes[j] - offsets[a]``;
    a binary search finds the cut without summing sizes one by one.
    """
    start = offsets[a]
    if offsets[b - 1] + sizes[b - 1] - start <= max_bytes:
        return b
    lo, hi = a + 1, b - 1  # answer in [a + 1, b - 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if offsets[mid - 1] + sizes[mid - 1] - start <= max_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


class MemoryMetaStore:
    """A ``MetaStore`` held in a dict: hard state and small keyed values, "durable" for the process lifetime."""

    def __init__(self) -> None:
        self._hard = HardState()
        self._kv: dict[str, bytes] = {}
        self._closed = False

    def load_hard_state(self) -> HardState:
        self._check_open()
        return self._hard

    def save_hard_state(self, hs: HardState) -> None:
        self._check_open()
        if hs.term < 0:
            raise ValueError(f"term must be >= 0, got {hs.term}")
        self._hard = hs

    def get(self, key: str) -> bytes | None:
        self._check_open()
        return self._kv.get(key)

    def put(self, key: str, value: bytes, sync: bool = False) -> None:
        self._check_open()
        self._kv[key] = bytes(value)

    def close(self) -> None:
        self._check_open()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the meta store is closed")
