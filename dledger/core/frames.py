"""What a run of log frames says without decoding it all: each frame's offset and term and the configurations of
its config entries (``scan``), checked just enough to place the entries in the core's in-memory tail
(``dledger/core/raft_log.py``); the store validates every frame fully before it writes one (docs/formats.md).
"""

from __future__ import annotations

import struct
from typing import Final

from dledger.core.membership import Configuration, ConfigurationError
from storage import codec

# magic, size, index, term: enough of a header to place an entry in the tail without decoding it all.
_HEAD: Final = struct.Struct(">iiqq")
_MAGIC_SIZE: Final = struct.Struct(">ii")
_SIZE: Final = struct.Struct(">i")
_CONFIG: Final = codec.MAGIC_CONFIG
_HEADER_SIZE: Final = codec.HEADER_SIZE
_ENTRY_MAGICS: Final = codec.ENTRY_MAGICS


def decode_conf(data: codec.Buf, off: int, size: int, index: int) -> Configuration:
    """The configuration a config entry's frame at ``off`` carries; a bad one is a ``FrameError`` naming it."""
    try:
        return Configuration.decode(memoryview(data)[off + _HEADER_SIZE : off + size])
    except ConfigurationError as e:
        raise codec.FrameError(f"config entry {index}: {e}", off, index) from e


def scan(frames: bytes, first_index: int) -> tuple[list[int], list[int], list[tuple[int, Configuration]]]:
    """Byte offset and term of each frame, and the configurations of its config entries: enough to place entries
    in the tail.

    Walks the size fields (each must be at least a header and stay inside the buffer), checks that the first and
    last frames are well-formed entries numbered ``first_index`` and ``first_index + n - 1``, and reads every
    term only when the run spans more than one term (then also checking dense indexes and non-decreasing
    terms). Full validation (every magic, body CRC, chain, positions) is the store's, before it writes anything.
    """
    end = len(frames)
    head_at = _MAGIC_SIZE.unpack_from
    offs: list[int] = []
    append = offs.append
    config_at: list[tuple[int, int]] = []  # (offset, size) of config entries: rare, decoded below
    off = 0
    while off < end:
        if end - off < _HEADER_SIZE:
            raise codec.FrameError(f"truncated header: {end - off} of {_HEADER_SIZE} bytes", off)
        magic, size = head_at(frames, off)
        if size < _HEADER_SIZE or size > end - off:
            raise codec.FrameError(f"bad frame size {size} at offset {off} ({end - off} bytes left)", off)
        if magic == _CONFIG:
            config_at.append((off, size))
        append(off)
        off += size
    n = len(offs)
    unpack = _HEAD.unpack_from
    m0, _s0, i0, t0 = unpack(frames, 0)
    m1, _s1, i1, t1 = unpack(frames, offs[-1])
    if m0 not in _ENTRY_MAGICS or m1 not in _ENTRY_MAGICS or i0 != first_index or i1 != first_index + n - 1:
        raise codec.FrameError(
            f"frames numbered {i0}..{i1} (magics {m0}, {m1}) where {first_index}..{first_index + n - 1} were "
            "expected",
            0,
            i0,
        )
    confs: list[tuple[int, Configuration]] = []
    if config_at:
        k = 0
        for o, size in config_at:
            k = offs.index(o, k)
            confs.append((first_index + k, decode_conf(frames, o, size, first_index + k)))
    if t0 == t1:
        return offs, [t0] * n, confs
    terms: list[int] = []
    last_term = -1
    for k, o in enumerate(offs):
        magic, _size, index, term = unpack(frames, o)
        if magic not in _ENTRY_MAGICS or index != first_index + k or term < last_term:
            raise codec.FrameError(
                f"bad frame at offset {o}: magic {magic}, index {index} (expected {first_index + k}), term {term} "
                f"(previous {last_term})",
                o,
                index,
            )
        terms.append(term)
        last_term = term
    return offs, terms, confs


def count_frames(data: bytes) -> int:
    """How many frames ``data`` holds (their size fields are trusted: frames the log itself read)."""
    n = off = 0
    end, size_of = len(data), _SIZE.unpack_from
    while off < end:
        off += size_of(data, off + 4)[0]
        n += 1
    return n
