"""Read-only scan of one data segment: check 1 (per-node integrity) in bulk, one call per segment file.

This is the only code that touches entry bytes, and it runs inside Spark tasks (one task per data segment) as
well as in the benchmark's plain single-process pass, so both measure the same work. It maps the file read-only
(``mmap.ACCESS_READ``: the audit can never write a node's files), walks the entries with ``storage.codec``'s
header layout and checks, per entry:

    bad_magic / bad_size   the header is not an entry (structure): the scan of this segment stops there
    pos_mismatch           the header's pos is not the entry's real byte position (file name + offset)
    index_continuity       the index does not follow the previous entry's (+1)
    term_decrease          the term is below the previous entry's
    body_crc / chain_crc   the CRCs of FORMATS.md section 1
    index_unit             the index file unit of that index differs from the header (or is missing)
    segment_end            a segment that is not the node's last does not end with a blank filler that
                           reaches the file's end
    torn_tail              (warning) the node's last segment ends in bytes that are not an entry
    bad_message / physical_offset   (check 3) a message body that does not decode, or whose PHYSICALOFFSET is
                           not its entry's pos + 48

Rows for the entries are handed to ``on_chunk`` in chunks (columns, not objects); the function returns a
JSON-able summary of the segment (first and last entry, counts per rule, the first few violations of each rule,
entries per term) from which the driver checks what crosses segment boundaries.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from spark.broker import BODY_BAD_MESSAGE, BODY_MESSAGE, MESSAGE_MAGIC_BYTES, body_kind, message_fields
from storage import codec

SAMPLES_PER_RULE: Final = 5
CHUNK_ROWS: Final = 131_072
INDEX_UNIT: Final = 32
INDEX_UNIT_DTYPE: Final = np.dtype(
    [("magic", ">i4"), ("pos", ">i8"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8")]
)
assert INDEX_UNIT_DTYPE.itemsize == INDEX_UNIT

_CHAIN: Final = struct.Struct(">qqI")
_PREFIX: Final = struct.Struct(">ii")

CHECK_INTEGRITY: Final = "integrity"
CHECK_BROKER: Final = "broker"


@dataclass(frozen=True, slots=True)
class SegmentTask:
    """One unit of Spark work: a data segment of one node, with that node's index files to compare against."""

    node: int
    path: str
    start: int
    last: bool
    index_files: tuple[tuple[int, str], ...]  # (start byte, path) of the node's index segments


@dataclass(slots=True)
class EntryChunk:
    """Columns of up to ``CHUNK_ROWS`` entries, in file order (a builder: filled by the scan, then handed on)."""

    index: array = field(default_factory=lambda: array("q"))
    term: array = field(default_factory=lambda: array("q"))
    pos: array = field(default_factory=lambda: array("q"))
    size: array = field(default_factory=lambda: array("i"))
    magic: array = field(default_factory=lambda: array("i"))
    body_crc: array = field(default_factory=lambda: array("q"))
    chain_crc: array = field(default_factory=lambda: array("q"))
    body_kind: array = field(default_factory=lambda: array("b"))
    # Sparse broker columns: row numbers of the message entries and their fields.
    msg_rows: list[int] = field(default_factory=list)
    topic: list[str] = field(default_factory=list)
    queue_id: list[int] = field(default_factory=list)
    queue_offset: list[int] = field(default_factory=list)
    tags_code: list[int] = field(default_factory=list)
    msg_id: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.index)


class _Findings:
    """Counts per rule and the first few violations of each, as JSON-able dicts."""

    def __init__(self, node: int, path: str):
        self.node = node
        self.file = path
        self.counts: dict[str, int] = {}
        self.samples: list[dict[str, Any]] = []

    def flag(self, check: str, rule: str, offset: int | None, index: int | None, detail: str) -> None:
        n = self.counts.get(rule, 0)
        self.counts[rule] = n + 1
        if n < SAMPLES_PER_RULE:
            self.samples.append(
                {
                    "check": check,
                    "rule": rule,
                    "node": self.node,
                    "file": self.file,
                    "offset": offset,
                    "index": index,
                    "detail": detail,
                }
            )


def _read_index_span(files: tuple[tuple[int, str], ...], lo: int, hi: int) -> bytes:
    """Bytes [lo, hi) of the node's index, concatenated across index files; zeros where no file has them."""
    out = bytearray(hi - lo)
    for k, (start, path) in enumerate(files):
        end_limit = files[k + 1][0] if k + 1 < len(files) else None
        if (end_limit is not None and end_limit <= lo) or start >= hi:
            continue
        a = max(lo, start)
        b = hi if end_limit is None else min(hi, end_limit)
        with open(path, "rb") as f:
            f.seek(a - start)
            got = f.read(b - a)
        out[a - lo : a - lo + len(got)] = got
    return bytes(out)


def _check_index_units(task: SegmentTask, chunk: EntryChunk, offsets: array, found: _Findings) -> None:
    """Compare the chunk's headers with the index file units at the same indexes (vectorised)."""
    n = len(chunk)
    if n == 0:
        return
    idx = np.frombuffer(chunk.index, dtype=np.int64)
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi - lo > 4 * n + 1024:  # corrupt indexes: compare the plausible run only
        lo = max(0, int(idx[0]))
        hi = lo + n - 1
    raw = (
        _read_index_span(task.index_files, lo * INDEX_UNIT, (hi + 1) * INDEX_UNIT)
        if task.index_files
        else b""
    )
    units = np.frombuffer(raw, dtype=INDEX_UNIT_DTYPE) if raw else np.zeros(0, dtype=INDEX_UNIT_DTYPE)
    rows = idx - lo
    inside = (rows >= 0) & (rows < len(units))
    bad = ~inside
    r = np.where(inside, rows, 0)
    if len(units):
        u = units[r]
        bad |= inside & (
            (u["magic"] != np.frombuffer(chunk.magic, dtype=np.int32))
            | (u["pos"] != np.frombuffer(chunk.pos, dtype=np.int64))
            | (u["size"] != np.frombuffer(chunk.size, dtype=np.int32))
            | (u["index"] != idx)
            | (u["term"] != np.frombuffer(chunk.term, dtype=np.int64))
        )
    bad_rows = np.flatnonzero(bad)
    for row in bad_rows[:SAMPLES_PER_RULE].tolist():
        i = int(idx[row])
        if inside[row] and len(units):
            got = units[int(r[row])]
            what = (
                f"index unit has magic {int(got['magic'])}, pos {int(got['pos'])}, size {int(got['size'])}, "
                f"index {int(got['index'])}, term {int(got['term'])}; the header has magic {chunk.magic[row]}, "
                f"pos {chunk.pos[row]}, size {chunk.size[row]}, index {i}, term {chunk.term[row]}"
            )
        else:
            what = f"no index unit for index {i} (the index files end before byte {(i + 1) * INDEX_UNIT})"
        found.flag(CHECK_INTEGRITY, "index_unit", offsets[row], i, what)
    if len(bad_rows) > SAMPLES_PER_RULE:
        found.counts["index_unit"] += len(bad_rows) - SAMPLES_PER_RULE


def _first_nonzero(mm: mmap.mmap, off: int, length: int, step: int = 1 << 24) -> int | None:
    """Offset of the first non-zero byte in ``mm[off:length]``, scanning in bounded chunks."""
    while off < length:
        part = np.frombuffer(mm, dtype=np.uint8, count=min(step, length - off), offset=off)
        hits = np.flatnonzero(part)
        found = int(hits[0]) + off if len(hits) else None
        del part, hits
        if found is not None:
            return found
        off += step
    return None


def scan_segment(
    task: SegmentTask, on_chunk: Callable[[EntryChunk], None], chunk_rows: int = CHUNK_ROWS
) -> dict[str, Any]:
    """Scan one data segment read-only; hand entry columns to ``on_chunk``; return the segment's summary."""
    found = _Findings(task.node, task.path)
    terms: dict[int, int] = {}
    summary: dict[str, Any] = {
        "node": task.node,
        "file": task.path,
        "start": task.start,
        "last": task.last,
        "entries": 0,
        "messages": 0,
        "first": None,
        "final": None,
        "tail": "end",
    }
    with open(task.path, "rb") as f:
        length = os.fstat(f.fileno()).st_size
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if length else None
    summary["length"] = length
    if mm is None:
        summary.update(counts={}, samples=[], terms={})
        return summary
    mv = memoryview(mm)
    try:
        _walk(task, mm, mv, length, found, terms, summary, on_chunk, chunk_rows)
    finally:
        mv.release()
        mm.close()
    summary["counts"] = found.counts
    summary["samples"] = found.samples
    summary["terms"] = {str(t): n for t, n in sorted(terms.items())}
    return summary


def _walk(task, mm, mv, length, found, terms, summary, on_chunk, chunk_rows) -> None:
    unpack_header = codec.HEADER.unpack_from
    unpack_prefix = _PREFIX.unpack_from
    pack_chain = _CHAIN.pack
    crc32 = zlib.crc32
    magics = codec.ENTRY_MAGICS
    start = task.start
    flag = found.flag
    chunk = EntryChunk()
    offsets = array("q")
    expect_index: int | None = None
    prev_chain: int | None = None
    prev_term: int | None = None
    count = 0
    off = 0

    def flush() -> None:
        nonlocal chunk, offsets
        if len(chunk):
            _check_index_units(task, chunk, offsets, found)
            t, c = np.unique(np.frombuffer(chunk.term, dtype=np.int64), return_counts=True)
            for term, n in zip(t.tolist(), c.tolist(), strict=True):
                terms[term] = terms.get(term, 0) + n
            summary["messages"] += len(chunk.msg_rows)
            on_chunk(chunk)
        chunk = EntryChunk()
        offsets = array("q")

    while off + codec.MIN_BLANK_LEN <= length:
        magic, size = unpack_prefix(mm, off)
        if magic == codec.MAGIC_BLANK:
            summary["tail"] = "blank"
            if off + size != length:
                flag(
                    CHECK_INTEGRITY,
                    "segment_end",
                    off,
                    expect_index,
                    f"blank filler at offset {off} claims {size} bytes but {length - off} remain in the file",
                )
            break
        if magic == 0 and size == 0:
            summary["tail"] = "zeros"
            nonzero = _first_nonzero(mm, off, length)
            if nonzero is not None:
                _structural(
                    task,
                    found,
                    nonzero,
                    expect_index,
                    f"non-zero bytes at offset {nonzero} after "
                    f"unwritten (zero) space that starts at offset {off}",
                    summary,
                )
            elif not task.last:
                flag(
                    CHECK_INTEGRITY,
                    "segment_end",
                    off,
                    expect_index,
                    f"segment is not the node's last but ends in unwritten space at offset {off} "
                    "instead of a blank filler",
                )
            break
        if off + codec.HEADER_SIZE > length:
            _structural(
                task,
                found,
                off,
                expect_index,
                f"{length - off} bytes at offset {off} are too short for an entry header",
                summary,
            )
            break
        magic, size, index, term, pos, _ch, chain, bcrc, blen = unpack_header(mm, off)
        if magic not in magics:
            _structural(
                task, found, off, expect_index, f"bad magic {magic} at offset {off}", summary, "bad_magic"
            )
            break
        if blen < 0 or size != codec.HEADER_SIZE + blen or off + size > length:
            _structural(
                task,
                found,
                off,
                index,
                f"size {size} (body_length {blen}) at offset {off} does not fit the {length}-byte file",
                summary,
                "bad_size",
            )
            break
        real = start + off
        if pos != real:
            flag(CHECK_INTEGRITY, "pos_mismatch", off, index, f"header pos {pos}, real byte position {real}")
        if expect_index is not None and index != expect_index:
            flag(
                CHECK_INTEGRITY,
                "index_continuity",
                off,
                index,
                f"index {index} follows index {expect_index - 1} (expected {expect_index})",
            )
        if prev_term is not None and term < prev_term:
            flag(CHECK_INTEGRITY, "term_decrease", off, index, f"term {term} after term {prev_term}")
        body_at = off + codec.HEADER_SIZE
        real_crc = crc32(mv[body_at : off + size])
        if real_crc != bcrc:
            flag(
                CHECK_INTEGRITY,
                "body_crc",
                off,
                index,
                f"header body_crc {bcrc:#010x}, body hashes to {real_crc:#010x}",
            )
        if prev_chain is None:
            summary["first"] = {
                "index": index,
                "term": term,
                "body_crc": bcrc,
                "chain_crc": chain,
                "pos": pos,
                "offset": off,
            }
        else:
            want = crc32(pack_chain(index, term, bcrc), prev_chain)
            if want != chain:
                flag(
                    CHECK_INTEGRITY,
                    "chain_crc",
                    off,
                    index,
                    f"header chain_crc {chain:#010x}, expected {want:#010x} from the previous entry",
                )
        kind = 0
        if blen >= 8:
            kind = body_kind(mm[body_at + 4 : body_at + 8])
            if kind == BODY_MESSAGE:
                kind = _message(chunk, mv[body_at : off + size], len(chunk), real, index, off, found)
        chunk.index.append(index)
        chunk.term.append(term)
        chunk.pos.append(pos)
        chunk.size.append(size)
        chunk.magic.append(magic)
        chunk.body_crc.append(bcrc)
        chunk.chain_crc.append(chain)
        chunk.body_kind.append(kind)
        offsets.append(off)
        count += 1
        expect_index = index + 1
        prev_chain = chain
        prev_term = term
        summary["final"] = {
            "index": index,
            "term": term,
            "chain_crc": chain,
            "end_pos": real + size,
            "end_offset": off + size,
        }
        if len(chunk) >= chunk_rows:
            flush()
        off += size
    else:
        if off < length and any(mm[off:length]):
            _structural(
                task,
                found,
                off,
                expect_index,
                f"{length - off} trailing bytes at offset {off} are not an entry",
                summary,
            )
        elif not task.last and off < length:
            flag(
                CHECK_INTEGRITY,
                "segment_end",
                off,
                expect_index,
                f"segment is not the node's last but ends at offset {off} without a blank filler",
            )
    flush()
    summary["entries"] = count


def _structural(task, found, off, index, what, summary, rule="bad_frame") -> None:
    """A break in the structure: the rest of this segment cannot be walked. In the node's last segment this is a
    torn tail (a crash mid-write; recovery truncates it), reported as a warning; elsewhere it is corruption."""
    summary["tail"] = "torn" if task.last else "broken"
    summary["tail_offset"] = off
    if task.last:
        found.flag(CHECK_INTEGRITY, "torn_tail", off, index, what + " (the node's last segment: a torn tail)")
    else:
        found.flag(CHECK_INTEGRITY, rule, off, index, what)


def _message(chunk: EntryChunk, body, row: int, real_pos: int, index: int, off: int, found: _Findings) -> int:
    try:
        m = message_fields(body)
    except ValueError as err:
        found.flag(CHECK_BROKER, "bad_message", off, index, f"message body does not decode: {err}")
        return BODY_BAD_MESSAGE
    want = real_pos + codec.HEADER_SIZE
    if m.physical_offset != want:
        found.flag(
            CHECK_BROKER,
            "physical_offset",
            off,
            index,
            f"message PHYSICALOFFSET {m.physical_offset}, its body is at {want}",
        )
    chunk.msg_rows.append(row)
    chunk.topic.append(m.topic)
    chunk.queue_id.append(m.queue_id)
    chunk.queue_offset.append(m.queue_offset)
    chunk.tags_code.append(m.tags_code)
    chunk.msg_id.append(m.msg_id)
    return BODY_MESSAGE


__all__ = ["MESSAGE_MAGIC_BYTES", "EntryChunk", "SegmentTask", "scan_segment"]
