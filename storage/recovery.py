"""Recovery: find where the log really ends, repair what a crash left, refuse what a crash cannot explain.

The data files are the truth; the index is a hint. On open:

1. The *hint* is the last index unit whose entry is really in the data (header matches, body_crc holds).
2. A window before it (``tail_bytes``, or the whole log with ``verify="full"``) is walked entry by entry through
   the data files: magic, size, index continuity, pos (``codec.place``), term order, body_crc and chain_crc.
   Index units the walk disagrees with are rewritten (the index is derived and rebuilt from data).
3. At the first bad frame the walk stops. If anything proves that later entries existed (the hint lies beyond
   it, or a later data file starts with a valid entry) the damage is *mid-log*: ``StorageCorruptError`` names
   the file, the byte offset and the index, and the node refuses to start until ``repair`` truncates there.
   Otherwise it is a *torn tail* (the bytes a crash was writing): the data is truncated back to the last good
   entry and the stale index units are cleared.

Why this split is safe: under ``sync`` an append returns only after fdatasync of its data, and index units are
written after the data, so a unit can only point at data that was written before it; a bad frame with nothing
valid after it is exactly what a crash during a write leaves.

``LogStart`` is the small durable record of where the log begins (``first_index`` and the entry just before
it, the snapshot point); compaction and snapshot installs rewrite it atomically before deleting anything.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from storage import codec
from storage.api import LogPosition
from storage.errors import StorageCorruptError
from storage.fileio import FileIO
from storage.index import UNIT, IndexFiles
from storage.segments import DataSegments

START_FILE = "start.json"
_CHUNK = 8 << 20  # bytes read per walk step
_HINT_TRIES = 64  # index units tried, newest first, before giving up on the hint


@dataclass(frozen=True, slots=True)
class LogStart:
    """Where the log begins: ``first_index`` and the position just before it (the snapshot point)."""

    first_index: int
    prev: LogPosition
    segment_size: int = 0  # recorded so a store opened with another segment size is refused (0 = unknown)

    @classmethod
    def fresh(cls, segment_size: int = 0) -> LogStart:
        return cls(0, LogPosition(-1, 0, 0, 0), segment_size)

    @classmethod
    def load(cls, data_dir: str) -> LogStart | None:
        path = os.path.join(data_dir, START_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
            prev = doc["prev"]
            start = cls(
                int(doc["first_index"]),
                LogPosition(
                    int(prev["index"]), int(prev["term"]), int(prev["end_pos"]), int(prev["chain_crc"])
                ),
                int(doc.get("segment_size") or 0),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageCorruptError(f"unreadable log start record: {exc}", path, 0) from exc
        if start.first_index != start.prev.last_index + 1:
            raise StorageCorruptError(
                "log start record: first_index != prev.index + 1", path, 0, start.first_index
            )
        return start

    def save(self, data_dir: str, io: FileIO) -> None:
        doc = {
            "format": 1,
            "segment_size": self.segment_size,
            "first_index": self.first_index,
            "prev": {
                "index": self.prev.last_index,
                "term": self.prev.last_term,
                "end_pos": self.prev.end_pos,
                "chain_crc": self.prev.chain_crc,
            },
        }
        io.write_file_atomic(os.path.join(data_dir, START_FILE), json.dumps(doc, indent=1).encode() + b"\n")


@dataclass(frozen=True, slots=True)
class BadFrame:
    """The first frame a walk could not accept."""

    path: str
    offset: int  # byte offset inside ``path``
    pos: int  # absolute position
    index: int  # the index the walk expected there
    reason: str


@dataclass(frozen=True, slots=True)
class Walk:
    last_index: int
    last_term: int
    end_pos: int
    chain_crc: int | None
    bad: BadFrame | None


@dataclass(frozen=True, slots=True)
class Recovery:
    """What ``recover`` found and did."""

    tail: LogPosition
    walked_from: int  # first index the walk checked
    rebuilt_units: int  # index units rewritten from data
    torn_bytes: int  # bytes cut from a torn tail
    dropped_entries: int  # entries removed by a repair (0 on a normal open)
    bad: BadFrame | None


def walk(
    segments: DataSegments,
    index: int,
    pos: int,
    prev_chain: int | None,
    last_term: int,
    on_run: Callable[[int, codec.FrameRun], None] | None = None,
) -> Walk:
    """Read the data files forward from ``pos`` (where entry ``index`` starts or is placed) to the end.

    ``on_run(first_index, run)`` sees every accepted run of entries (positions are absolute). Stops at the end
    of the data or at the first frame that fails; never writes. Bounded: every step either accepts at least
    one entry, moves to the next file, doubles its read size (up to one segment) or returns.
    """
    seg_size = segments.segment_size
    chain = prev_chain
    chunk = _CHUNK
    while True:
        base = segments.base_of(pos)
        seg = segments.get(base)
        off = pos - base
        room = seg_size - off
        next_file = seg is None or seg.size <= off or room < codec.MIN_BLANK_LEN
        if not next_file:
            head = segments.read(pos, codec.MIN_BLANK_LEN)
            if len(head) == codec.MIN_BLANK_LEN:
                magic, length = codec.BLANK.unpack_from(head)
                if magic == codec.MAGIC_BLANK:
                    if length != room:
                        return Walk(
                            index - 1,
                            last_term,
                            pos,
                            chain,
                            _bad(segments, pos, index, f"blank record of {length} bytes, {room} remain"),
                        )
                    next_file = True
        if next_file:
            nxt = segments.get(base + seg_size)
            if nxt is None or nxt.size == 0:
                return Walk(index - 1, last_term, pos, chain, None)
            read_from = base + seg_size  # the scan still starts from pos, so it checks the jump is legitimate
        else:
            read_from = pos
        data = segments.read(read_from, chunk)
        run, err = codec.scan_prefix(data, index, pos, chain, seg_size, prev_term=last_term)
        if run.offsets:
            if on_run is not None:
                on_run(index, run)
            index += len(run.offsets)
            last_term = run.terms[-1]
            chain = run.chains[-1]
            pos = run.positions[-1] + run.sizes[-1]
            chunk = _CHUNK
        if err is None:
            continue
        if run.offsets:
            continue  # progress made: the next step re-reads from the failing frame (it may be a blank)
        if err.truncated and len(data) == chunk and chunk < seg_size:
            chunk = min(chunk * 2, seg_size)  # a frame larger than one read: read more
            continue
        return Walk(index - 1, last_term, pos, chain, _bad(segments, read_from + err.offset, index, str(err)))


def _bad(segments: DataSegments, pos: int, index: int, reason: str) -> BadFrame:
    base = segments.base_of(pos)
    return BadFrame(segments.path_of(pos), pos - base, pos, index, reason)


def _unit_matches(
    segments: DataSegments, unit: tuple[int, int, int, int, int], index: int, full: bool
) -> bool:
    """Whether an index unit describes an entry really present in the data (body_crc checked if ``full``)."""
    magic, pos, size, u_index, term = unit
    if magic not in codec.ENTRY_MAGICS or u_index != index or size < codec.HEADER_SIZE or pos < 0:
        return False
    data = segments.read(pos, size if full else codec.HEADER_SIZE)
    if len(data) < (size if full else codec.HEADER_SIZE):
        return False
    h = codec.HEADER.unpack_from(data)
    if (h[0], h[1], h[2], h[3], h[4]) != (magic, size, index, term, pos):
        return False
    if full:
        try:
            codec.validate(data)
        except codec.FrameError:
            return False
    return True


def _later_data_exists(segments: DataSegments, bad: BadFrame) -> bool:
    """True if a data file after the bad frame's file starts with a well-formed entry."""
    bad_base = segments.base_of(bad.pos)
    for base in segments.bases():
        if base <= bad_base:
            continue
        head = segments.read(base, codec.HEADER_SIZE)
        if len(head) >= codec.HEADER_SIZE:
            h = codec.HEADER.unpack_from(head)
            if h[0] in codec.ENTRY_MAGICS and h[2] > bad.index and h[4] == base:
                return True
    return False


def recover(
    segments: DataSegments,
    index_files: IndexFiles,
    start: LogStart,
    *,
    full: bool = False,
    tail_bytes: int = 32 << 20,
    repair: bool = False,
) -> Recovery:
    """Validate the tail (or everything with ``full``), rebuild index units, truncate a torn tail.

    Mid-log corruption raises ``StorageCorruptError`` unless ``repair`` is set, in which case the log is
    truncated at the bad frame and ``Recovery.dropped_entries`` says how many entries went with it.
    """
    floor = start.first_index
    last_unit = index_files.last_written(floor)
    hint = None
    i = last_unit
    tries = 0
    while i >= floor and tries < _HINT_TRIES:
        u = index_files.unit(i)
        if _unit_matches(segments, u, i, full=True):
            hint = (i, u)
            break
        i -= 1
        tries += 1

    s = floor
    if hint is not None and not full:
        target = hint[1][1] - tail_bytes
        lo, hi = floor, hint[0]
        while lo < hi:  # first unit with pos >= target (units are ordered by pos)
            mid = (lo + hi) // 2
            if index_files.unit(mid)[1] >= target:
                hi = mid
            else:
                lo = mid + 1
        if lo > floor and _unit_matches(segments, index_files.unit(lo), lo, full=False):
            s = lo
    if s == floor:
        pos, prev_chain, last_term = start.prev.end_pos, start.prev.chain_crc, start.prev.last_term
    else:
        pos, prev_chain, last_term = index_files.unit(s)[1], None, -1  # unit s-1 is unchecked: trust nothing

    rebuilt = 0

    def on_run(first: int, run: codec.FrameRun) -> None:
        nonlocal rebuilt
        n = len(run.offsets)
        packed = b"".join(
            UNIT.pack(run.magics[k], run.positions[k], run.sizes[k], first + k, run.terms[k])
            for k in range(n)
        )
        if index_files.read_units(first, first + n) != packed:
            index_files.ensure(first, first + n)
            index_files.write(first, packed)
            rebuilt += n

    w = walk(segments, s, pos, prev_chain, last_term, on_run)
    torn = 0
    dropped = 0
    if w.bad is not None:
        evidence = (hint is not None and hint[0] >= w.bad.index) or _later_data_exists(segments, w.bad)
        if evidence and not repair:
            raise StorageCorruptError(
                f"corrupt entry before the end of the log: {w.bad.reason}",
                w.bad.path,
                w.bad.offset,
                w.bad.index,
            )
        if evidence:
            dropped = max(last_unit, hint[0] if hint else -1) - w.bad.index + 1
            dropped = max(dropped, 1)
        torn = segments.end_pos() - w.bad.pos if segments.end_pos() > w.bad.pos else 0
        segments.truncate(w.bad.pos)
    end_pos = w.end_pos
    if w.bad is None and segments.end_pos() > end_pos:
        # A blank (or an empty next file) that a crash left before the next file got its first entry: cut it,
        # so the last file ends where the log ends; the next append pads again if it needs the next file.
        torn = segments.end_pos() - end_pos
        segments.truncate(end_pos)
    if last_unit > w.last_index:
        index_files.clear(w.last_index + 1, last_unit + 1)
    if w.last_index >= floor:
        tail = LogPosition(w.last_index, w.last_term, end_pos, w.chain_crc if w.chain_crc is not None else 0)
    else:
        tail = start.prev
    return Recovery(tail, s, rebuilt, torn, dropped, w.bad)
