"""Read-only scan of one data segment: check 1 (per-node integrity) in bulk, one call per segment file.

This is the only code that touches entry bytes, and it runs inside Spark tasks (one task per data segment) as
well as in the benchmark's plain single-process pass, so both measure the same work. It maps the file read-only
(``mmap.ACCESS_READ``: the audit can never write a node's files), walks the entries with ``storage.codec``'s
header layout and checks, per entry:

    bad_magic / bad_size   the header is not an entry (structure): the scan of this segment stops there
    pos_mismatch           the header's pos is not the entry's real byte position (file name + offset)
    index_continuity       the index does not follow the previous entry's (+1)
    term_decrease          the term is below the previous entry's
    body_crc / chain_crc   the CRCs of docs/formats.md section 1
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

try:  # the same CRC-32 as zlib, about 3x faster on 1 KiB bodies (pinned by the storage engine)
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # a cluster worker without it falls back to zlib
    _crc32 = zlib.crc32

from spark.broker import (
    BODY_BAD_MESSAGE,
    BODY_COMMAND,
    BODY_MESSAGE,
    BODY_RAW,
    COMMAND_MAGIC_BYTES,
    MESSAGE_MAGIC_BYTES,
    message_fields,
)
from storage import codec

SAMPLES_PER_RULE: Final = 5
CHECKPOINT_EVERY: Final = 4096
CHUNK_ROWS: Final = 131_072
INDEX_UNIT: Final = 32
INDEX_UNIT_DTYPE: Final = np.dtype(
    [("magic", ">i4"), ("pos", ">i8"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8")]
)
assert INDEX_UNIT_DTYPE.itemsize == INDEX_UNIT

CHAIN: Final = struct.Struct(">qqI")
HEADER_DTYPE: Final = np.dtype(
    [
        ("magic", ">i4"),
        ("size", ">i4"),
        ("index", ">i8"),
        ("term", ">i8"),
        ("pos", ">i8"),
        ("channel", ">i4"),
        ("chain_crc", ">u4"),
        ("body_crc", ">u4"),
        ("body_length", ">i4"),
    ]
)
assert HEADER_DTYPE.itemsize == codec.HEADER_SIZE
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
    # Which entry rows to return. ``full``: all. Otherwise only what the cross-node checks need besides the chain:
    # messages and commands, checkpoints (index % checkpoint_every == 0, and the commit index) and everything
    # from the commit index on (the tails that may differ). Every entry is checked either way.
    full: bool = True
    commit: int | None = None
    checkpoint_every: int = CHECKPOINT_EVERY
    begin: int = 0  # the file's first entry is here (the log's start inside it; zeros before, never written)


@dataclass(slots=True)
class EntryChunk:
    """Columns of up to ``CHUNK_ROWS`` consecutive entries of one segment, in file order (numpy arrays)."""

    index: np.ndarray
    term: np.ndarray
    pos: np.ndarray
    size: np.ndarray  # int32
    magic: np.ndarray  # int32
    body_crc: np.ndarray
    chain_crc: np.ndarray
    body_kind: np.ndarray  # int8, spark.broker.BODY_*
    # Sparse broker columns: row numbers (within the chunk) of the message entries and their fields.
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


def _check_index_units(task: SegmentTask, cols: dict[str, np.ndarray], found: _Findings) -> None:
    """Compare the headers with the index file units at the same indexes (vectorised)."""
    idx = cols["index"]
    n = len(idx)
    if n == 0:
        return
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
            (u["magic"] != cols["magic"])
            | (u["pos"] != cols["pos"])
            | (u["size"] != cols["size"])
            | (u["index"] != idx)
            | (u["term"] != cols["term"])
        )
    bad_rows = np.flatnonzero(bad)
    for row in bad_rows[:SAMPLES_PER_RULE].tolist():
        i = int(idx[row])
        if inside[row] and len(units):
            got = units[int(r[row])]
            what = (
                f"index unit has magic {int(got['magic'])}, pos {int(got['pos'])}, size {int(got['size'])}, "
                f"index {int(got['index'])}, term {int(got['term'])}; the header has magic "
                f"{int(cols['magic'][row])}, pos {int(cols['pos'][row])}, size {int(cols['size'][row])}, "
                f"index {i}, term {int(cols['term'][row])}"
            )
        else:
            what = f"no index unit for index {i} (the index files end before byte {(i + 1) * INDEX_UNIT})"
        found.flag(CHECK_INTEGRITY, "index_unit", int(cols["offset"][row]), i, what)
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
    """The per-entry loop does only what needs each entry's bytes (structure, body_crc, chain_crc) and keeps the
    48-byte headers; everything else is checked on the header columns with numpy afterwards."""
    unpack_header = codec.HEADER.unpack_from
    unpack_prefix = _PREFIX.unpack_from
    pack_chain = CHAIN.pack
    crc32 = _crc32
    magics = codec.ENTRY_MAGICS
    header_size = codec.HEADER_SIZE
    flag = found.flag
    headers = bytearray()
    prev_chain: int | None = None
    last_index: int | None = None
    off = task.begin
    while off + codec.MIN_BLANK_LEN <= length:
        if length - off < header_size:
            magic, size = unpack_prefix(mm, off)
            if magic not in (codec.MAGIC_BLANK, 0):
                _structural(
                    task,
                    found,
                    off,
                    _next(last_index),
                    f"{length - off} bytes at offset {off} are too short for an entry header",
                    summary,
                )
                break
            magic, size, index, term, _pos, _ch, chain, bcrc, blen = magic, size, 0, 0, 0, 0, 0, 0, 0
        else:
            magic, size, index, term, _pos, _ch, chain, bcrc, blen = unpack_header(mm, off)
        if magic not in magics:
            _tail(task, mm, length, off, magic, size, last_index, found, summary)
            break
        if blen < 0 or size != header_size + blen or off + size > length:
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
        real_crc = crc32(mv[off + header_size : off + size])
        if real_crc != bcrc:
            flag(
                CHECK_INTEGRITY,
                "body_crc",
                off,
                index,
                f"header body_crc {bcrc:#010x}, body hashes to {real_crc:#010x}",
            )
        if prev_chain is not None:
            want = crc32(pack_chain(index, term, bcrc), prev_chain)
            if want != chain:
                flag(
                    CHECK_INTEGRITY,
                    "chain_crc",
                    off,
                    index,
                    f"header chain_crc {chain:#010x}, expected {want:#010x} from the previous entry",
                )
        prev_chain = chain
        last_index = index
        headers += mv[off : off + header_size]
        off += size
    else:
        if off < length and any(mm[off:length]):
            _structural(
                task,
                found,
                off,
                _next(last_index),
                f"{length - off} trailing bytes at offset {off} are not an entry",
                summary,
            )
        elif not task.last and off < length:
            flag(
                CHECK_INTEGRITY,
                "segment_end",
                off,
                _next(last_index),
                f"segment is not the node's last but ends at offset {off} without a blank filler",
            )
    h = np.frombuffer(headers, dtype=HEADER_DTYPE)
    n = len(h)
    summary["entries"] = n
    if n == 0:
        return
    cols = {
        "index": h["index"].astype(np.int64),
        "term": h["term"].astype(np.int64),
        "pos": h["pos"].astype(np.int64),
        "size": h["size"].astype(np.int32),
        "magic": h["magic"].astype(np.int32),
        "body_crc": h["body_crc"].astype(np.int64),
        "chain_crc": h["chain_crc"].astype(np.int64),
    }
    sizes = cols["size"].astype(np.int64)
    offset = np.full(n, task.begin, dtype=np.int64)
    offset[1:] += np.cumsum(sizes[:-1])
    cols["offset"] = offset
    _vector_checks(task, cols, found)
    _check_index_units(task, cols, found)
    kind = np.zeros(n, dtype=np.int8)
    has_head = np.flatnonzero(cols["size"] >= header_size + 8)
    if len(has_head):
        raw = np.frombuffer(mm, dtype=np.uint8)
        at = offset[has_head] + header_size + 4
        head = raw[at[:, None] + np.arange(4)]
        del raw
        code = head.view(">u4").reshape(-1)
        kind[has_head[code == _MESSAGE_CODE]] = BODY_MESSAGE
        kind[has_head[code == _COMMAND_CODE]] = BODY_COMMAND
    cols["body_kind"] = kind
    msg_rows = np.flatnonzero(kind == BODY_MESSAGE).tolist()
    messages: dict[int, tuple] = {}
    for row in msg_rows:
        o = int(offset[row])
        fields = _message(
            mv[o + header_size : o + int(sizes[row])], task.start + o, int(cols["index"][row]), o, found
        )
        if fields is None:
            kind[row] = BODY_BAD_MESSAGE
        else:
            messages[row] = fields
    summary["messages"] = len(messages)
    t, c = np.unique(cols["term"], return_counts=True)
    for term, count in zip(t.tolist(), c.tolist(), strict=True):
        terms[term] = terms.get(term, 0) + count
    first, last = 0, n - 1
    summary["first"] = {
        "index": int(cols["index"][first]),
        "term": int(cols["term"][first]),
        "body_crc": int(cols["body_crc"][first]),
        "chain_crc": int(cols["chain_crc"][first]),
        "pos": int(cols["pos"][first]),
        "offset": 0,
    }
    summary["final"] = {
        "index": int(cols["index"][last]),
        "term": int(cols["term"][last]),
        "chain_crc": int(cols["chain_crc"][last]),
        "end_pos": task.start + int(offset[last]) + int(sizes[last]),
        "end_offset": int(offset[last]) + int(sizes[last]),
    }
    keep = None
    if not task.full:
        idx = cols["index"]
        mask = (kind != BODY_RAW) | (idx % task.checkpoint_every == 0)
        if task.commit is not None:
            mask |= idx >= task.commit
        keep = np.flatnonzero(mask)
        cols = {name: cols[name][keep] for name in _CHUNK_COLUMNS}
    # Row numbers of messages among the rows returned.
    kept_msgs = sorted(messages) if keep is None else np.searchsorted(keep, sorted(messages)).tolist()
    msg_fields = [messages[r] for r in sorted(messages)]
    rows = len(cols["index"])
    m = 0
    for lo in range(0, rows, chunk_rows):
        hi = min(rows, lo + chunk_rows)
        chunk = EntryChunk(*(cols[name][lo:hi] for name in _CHUNK_COLUMNS))
        while m < len(kept_msgs) and kept_msgs[m] < hi:
            topic, queue_id, queue_offset, tags_code, msg_id = msg_fields[m]
            chunk.msg_rows.append(kept_msgs[m] - lo)
            chunk.topic.append(topic)
            chunk.queue_id.append(queue_id)
            chunk.queue_offset.append(queue_offset)
            chunk.tags_code.append(tags_code)
            chunk.msg_id.append(msg_id)
            m += 1
        on_chunk(chunk)


_CHUNK_COLUMNS: Final = ("index", "term", "pos", "size", "magic", "body_crc", "chain_crc", "body_kind")
_MESSAGE_CODE: Final = int.from_bytes(MESSAGE_MAGIC_BYTES, "big")
_COMMAND_CODE: Final = int.from_bytes(COMMAND_MAGIC_BYTES, "big")


def _next(index: int | None) -> int | None:
    return None if index is None else index + 1


def _vector_checks(task: SegmentTask, cols: dict[str, np.ndarray], found: _Findings) -> None:
    """pos equals the real byte position; indexes follow each other; terms never decrease."""
    idx, term, pos, offset = cols["index"], cols["term"], cols["pos"], cols["offset"]
    real = offset + task.start

    def pos_detail(row: int) -> str:
        return f"header pos {int(pos[row])}, real byte position {int(real[row])}"

    def index_detail(row: int) -> str:
        return f"index {int(idx[row])} follows index {int(idx[row - 1])} (expected {int(idx[row - 1]) + 1})"

    def term_detail(row: int) -> str:
        return f"term {int(term[row])} after term {int(term[row - 1])}"

    _flag_rows(found, "pos_mismatch", np.flatnonzero(pos != real), offset, idx, pos_detail)
    _flag_rows(
        found, "index_continuity", np.flatnonzero(idx[1:] != idx[:-1] + 1) + 1, offset, idx, index_detail
    )
    _flag_rows(found, "term_decrease", np.flatnonzero(term[1:] < term[:-1]) + 1, offset, idx, term_detail)


def _flag_rows(
    found: _Findings, rule: str, rows: np.ndarray, offset, idx, detail: Callable[[int], str]
) -> None:
    """Describe the first few flagged rows; count the others."""
    for row in rows[:SAMPLES_PER_RULE].tolist():
        found.flag(CHECK_INTEGRITY, rule, int(offset[row]), int(idx[row]), detail(row))
    if len(rows) > SAMPLES_PER_RULE:
        found.counts[rule] += len(rows) - SAMPLES_PER_RULE


def _tail(task, mm, length, off, magic, size, last_index, found, summary) -> None:
    """What ends the walk when the next record is not an entry: a blank filler, unwritten zeros, or damage."""
    if magic == codec.MAGIC_BLANK:
        summary["tail"] = "blank"
        if off + size != length:
            found.flag(
                CHECK_INTEGRITY,
                "segment_end",
                off,
                _next(last_index),
                f"blank filler at offset {off} claims {size} bytes but {length - off} remain in the file",
            )
        return
    if magic == 0 and size == 0:
        summary["tail"] = "zeros"
        nonzero = _first_nonzero(mm, off, length)
        if nonzero is not None:
            _structural(
                task,
                found,
                nonzero,
                _next(last_index),
                f"non-zero bytes at offset {nonzero} after "
                f"unwritten (zero) space that starts at offset {off}",
                summary,
            )
        elif not task.last:
            found.flag(
                CHECK_INTEGRITY,
                "segment_end",
                off,
                _next(last_index),
                f"segment is not the node's last but ends in unwritten space at offset {off} instead of "
                "a blank filler",
            )
        return
    _structural(
        task, found, off, _next(last_index), f"bad magic {magic} at offset {off}", summary, "bad_magic"
    )


def _structural(task, found, off, index, what, summary, rule="bad_frame") -> None:
    """A break in the structure: the rest of this segment cannot be walked. In the node's last segment this is a
    torn tail (a crash mid-write; recovery truncates it), reported as a warning; elsewhere it is corruption."""
    summary["tail"] = "torn" if task.last else "broken"
    summary["tail_offset"] = off
    if task.last:
        found.flag(CHECK_INTEGRITY, "torn_tail", off, index, what + " (the node's last segment: a torn tail)")
    else:
        found.flag(CHECK_INTEGRITY, rule, off, index, what)


def _message(body, real_pos: int, index: int, off: int, found: _Findings) -> tuple | None:
    """(topic, queue_id, queue_offset, tags_code, msg_id) of a message body, or None (flagged) if it is bad."""
    try:
        m = message_fields(body)
    except ValueError as err:
        found.flag(CHECK_BROKER, "bad_message", off, index, f"message body does not decode: {err}")
        return None
    want = real_pos + codec.HEADER_SIZE
    if m.physical_offset != want:
        found.flag(
            CHECK_BROKER,
            "physical_offset",
            off,
            index,
            f"message PHYSICALOFFSET {m.physical_offset}, its body is at {want}",
        )
    return m.topic, m.queue_id, m.queue_offset, m.tags_code, m.msg_id


__all__ = ["MESSAGE_MAGIC_BYTES", "EntryChunk", "SegmentTask", "scan_segment"]
