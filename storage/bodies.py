"""Entry bodies read by position (``LogStore.bodies_at`` for the file store).

A reader that already holds positions (the broker's ConsumeQueue units) needs neither the index file nor an
``Entry`` per entry: entries close together are read with one pread, and each is checked as it is cut out of the
read (header pos, magic, size and body_crc), so a corrupt entry is still detected and named.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from storage import codec
from storage.errors import Compacted, IndexOutOfRange, NoEntryError, StorageCorruptError
from storage.index import IndexFiles
from storage.segments import DataSegments

# Neighbouring entries share one pread when at most this many bytes lie between them: reading a few unwanted KiB
# costs less than another call (a queue's messages are interleaved with other queues').
READ_GAP: Final = 16 << 10

# The header fields a read by position checks: magic, size, pos, body_crc, body_length.
_CHECKED: Final = struct.Struct(">ii16xq8xIi")


def read(
    segments: DataSegments,
    index: IndexFiles,
    first_index: int,
    last_index: int,
    first_pos: int,
    end_pos: int,
    positions: Sequence[int],
    lengths: Sequence[int],
    magic: int,
) -> bytes:
    """The bodies of the entries at ``positions`` (``lengths[i]`` bytes each), concatenated; the log holds
    ``first_index..last_index`` at ``first_pos..end_pos``. Runs of ascending entries in one data file whose gaps
    stay under ``READ_GAP`` are read with one pread."""
    n = len(positions)
    if len(lengths) != n:
        raise ValueError(f"{n} positions but {len(lengths)} lengths")
    hs = codec.HEADER_SIZE
    unpack = _CHECKED.unpack_from
    crc32 = codec._crc32
    seg = segments.segment_size
    out: list[memoryview] = []
    i = 0
    while i < n:
        a = positions[i]
        stop = a + hs + lengths[i]
        if a < first_pos:
            raise Compacted(f"position {a} is compacted (the log starts at position {first_pos})")
        if stop > end_pos or lengths[i] < 0:
            raise IndexOutOfRange(f"no entry of {lengths[i]} body bytes at {a}: the log ends at {end_pos}")
        limit = a - a % seg + seg
        j = i + 1
        while j < n:
            p = positions[j]
            e = p + hs + lengths[j]
            if p < stop or p - stop > READ_GAP or e > limit or e > end_pos or lengths[j] < 0:
                break
            stop = e
            j += 1
        data = segments.read(a, stop - a)
        if len(data) != stop - a:
            raise StorageCorruptError(
                f"data file is shorter than the log's end says ({len(data)} of {stop - a} bytes)",
                segments.path_of(a),
                a % seg,
            )
        mv = memoryview(data)
        append = out.append
        for p, ln in zip(positions[i:j], lengths[i:j], strict=True):
            off = p - a
            m, size, pos, crc, blen = unpack(mv, off)
            if pos != p or m != magic or blen != ln or size != hs + ln:
                _no_entry(segments, index, first_index, last_index, p, ln, magic)
            body = mv[off + hs : off + hs + ln]
            if crc32(body) != crc:
                raise StorageCorruptError(
                    "entry fails its body_crc check on read",
                    segments.path_of(p),
                    p % seg,
                    codec.HEADER.unpack_from(mv, off)[2],
                )
            append(body)
        i = j
    return b"".join(out)


def _no_entry(
    segments: DataSegments, index: IndexFiles, lo: int, hi: int, pos: int, length: int, magic: int
) -> None:
    """Raise for a header at ``pos`` that is not the entry asked for: ``StorageCorruptError`` when the index says
    that entry is there (the data file disagrees with it), else ``NoEntryError`` (a stale pointer)."""
    while lo <= hi:
        mid = (lo + hi) // 2
        p = index.pos(mid)
        if p == pos:
            m, _, size, _, _ = index.unit(mid)
            if m == magic and size == codec.HEADER_SIZE + length:
                raise StorageCorruptError(
                    "entry header does not match the index on read",
                    segments.path_of(pos),
                    pos % segments.segment_size,
                    mid,
                )
            break
        if p < pos:
            lo = mid + 1
        else:
            hi = mid - 1
    raise NoEntryError(f"no entry of magic {magic} with a {length}-byte body starts at position {pos}", pos)
