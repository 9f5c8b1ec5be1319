"""A raw pull as one Arrow record batch, built column by column (the batch read's hot path, issue 29).

A ``Pull`` with ``raw`` set is answered with the messages as the CommitLog stores them, concatenated
(``PullResponse.raw``; the layout is ``broker_adapter.core.formats``'s). ``broker_adapter.pulled.decode`` turns
such bytes into one ``PulledMessage`` per message, and ``queues.to_batch`` turns those into rows of
``queues.SCHEMA``: a Python object per message and per column, and a property parse per message. Here the only
Python work per message is reading its TOTALSIZE to find the next one; everything else is numpy over the whole
buffer and Arrow's compute kernels:

- the fixed fields: every message's first 88 bytes gathered into one array and read as a big-endian record
  (``HEAD``), the checks of ``pulled.decode`` (MAGICCODE, each length inside its message, the topic) vectorised;
- body and properties: their bytes gathered into one buffer each, with offsets, as Arrow binary and string
  arrays (the properties checked as UTF-8);
- the properties split with Arrow's ``split_pattern`` into ``name\\x01value`` items; tags, keys and message id
  taken from their items, the rest (``queues.OWN_COLUMNS`` excepted) as the map, in stored order.

``to_columns`` returns None when the bytes are anything it does not handle exactly as the per-message path
would: a malformed message, properties that are not ``name\\x01value`` or not UTF-8, a property named twice in
one message (the per-message path keeps the last value at the first one's place), another topic. The caller
then takes the per-message path (``queues.to_batch``), which gives the same rows or raises the error naming
the fault; ``tests/spark/test_columns.py`` compares the two on every case.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_adapter.core.formats import (
    FIXED_SIZE,
    KEY_SEPARATOR,
    MAGIC_CODE,
    NAME_VALUE_SEPARATOR,
    OVERHEAD,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_ID,
    PROPERTY_SEPARATOR,
    PROPERTY_SEQUENCE,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
)

# Properties that have their own column (or are the producer's dedup identity): not repeated in ``properties``.
OWN_COLUMNS: Final = frozenset(
    {PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_PRODUCER_ID, PROPERTY_SEQUENCE}
)

HEAD_SIZE: Final = FIXED_SIZE + 4  # the fixed fields and BODYLEN: where the body starts
# The fields a row needs, at their offsets in the message (docs/formats.md section 5), big-endian.
HEAD: Final = np.dtype(
    {
        "names": [
            "total",
            "magic",
            "queue_id",
            "queue_offset",
            "commitlog_offset",
            "born",
            "stored",
            "body_len",
        ],
        "formats": [">i4", ">i4", ">i4", ">i8", ">i8", ">i8", ">i8", ">i4"],
        "offsets": [0, 4, 12, 20, 28, 40, 56, FIXED_SIZE],
        "itemsize": HEAD_SIZE,
    }
)
_HEAD_BYTES: Final = np.arange(HEAD_SIZE, dtype=np.int64)
_TOTAL: Final = struct.Struct(">i")
_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
_STRINGS: Final = pa.list_(pa.string())
_MAX_OFFSET: Final = (1 << 31) - 1  # Arrow's binary and string arrays have 32-bit offsets


def _array(values: np.ndarray, type_: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A numpy array of fixed-width values as an Arrow array of ``type_`` (``valid``: False where null), built
    from its buffer: ``pa.array`` would import pandas, a third of a second in each fresh Spark Python worker."""
    values = np.ascontiguousarray(values, dtype=f"=i{type_.bit_width // 8}")  # the ints of any fixed width
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(type_, len(values), [bitmap, pa.py_buffer(values)])


def _lengths(strings: pa.Array) -> np.ndarray:
    """The length of each value of a string, binary or list array, from its offsets."""
    offsets = np.frombuffer(
        strings.buffers()[1], dtype=np.int32, count=len(strings) + 1, offset=strings.offset * 4
    )
    return np.diff(offsets)


def _numpy(ints: pa.Array) -> np.ndarray:
    """A fixed-width integer array without nulls as a numpy view of its buffer."""
    width = ints.type.bit_width // 8
    return np.frombuffer(ints.buffers()[1], dtype=f"=i{width}", count=len(ints), offset=ints.offset * width)


def _taken(values: pa.Array, at: np.ndarray) -> pa.Array:
    return values.take(_array(at, pa.int64()))


def _repeated(text: str, n: int) -> pa.Array:
    """A string column of ``n`` times ``text``."""
    one = text.encode()
    offsets = np.arange(0, (n + 1) * len(one), len(one), dtype=np.int32)[: n + 1]
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(one * n))


def starts(data: bytes) -> np.ndarray | None:
    """Where each message of a raw pull starts (by TOTALSIZE), or None when they do not tile ``data``."""
    out: list[int] = []
    append = out.append
    total_at = _TOTAL.unpack_from
    end = len(data)
    at = 0
    try:
        while at < end:
            append(at)
            total = total_at(data, at)[0]
            if total < OVERHEAD:
                return None
            at += total
    except struct.error:  # fewer than 4 bytes left
        return None
    return np.array(out, dtype=np.int64) if at == end else None


def _gather(data: bytes, begin: np.ndarray, end: np.ndarray) -> tuple[pa.Buffer, pa.Buffer] | None:
    """The 32-bit offsets and the bytes of ``data[begin[i]:end[i]]`` of every i, concatenated (None when they
    do not fit 32-bit offsets). One slice per message, joined in C: cheaper than any numpy mask over the
    whole buffer (docs/spark.md, Benchmark)."""
    offsets = np.zeros(len(begin) + 1, dtype=np.int64)
    np.cumsum(end - begin, out=offsets[1:])
    if offsets[-1] > _MAX_OFFSET:
        return None
    joined = b"".join([data[b:e] for b, e in zip(begin.tolist(), end.tolist(), strict=True)])
    return pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(joined)


def _picked(values: pa.Array, chosen: np.ndarray, rows: np.ndarray, n: int) -> pa.Array:
    """A column of ``n`` rows: ``values[chosen[j]]`` in row ``rows[j]`` (ascending), null in the rows no item
    names."""
    if len(chosen) == n:
        return _taken(values, chosen)
    if len(chosen) == 0:
        return pa.nulls(n, pa.string())
    at = np.full(n, -1, dtype=np.int64)
    at[rows] = chosen
    return values.take(_array(at, pa.int64(), at >= 0))


def _keys(values: pa.Array, chosen: np.ndarray, rows: np.ndarray, n: int) -> pa.Array:
    """The keys column: the KEYS value of row ``rows[j]`` (``values[chosen[j]]``) split at ``KEY_SEPARATOR``; an
    empty list for a row without one or with an empty one (as ``queues.to_batch`` does)."""
    given = _lengths(values)[chosen] != 0
    split = pc.split_pattern(_taken(values, chosen[given]), KEY_SEPARATOR)
    counts = np.zeros(n, dtype=np.int32)
    counts[rows[given]] = _lengths(split)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(_array(offsets, pa.int32()), split.flatten())


def to_columns(group: str, topic: str, data: bytes, count: int) -> list[pa.Array] | None:
    """The columns of ``queues.SCHEMA`` for the ``count`` messages of a raw pull of ``topic``, or None when the
    per-message path must decide (module docstring)."""
    at = starts(data)
    if at is None or len(at) != count or count == 0:
        return None
    raw = np.frombuffer(data, dtype=np.uint8)  # a view: nothing copied
    head = raw[at[:, None] + _HEAD_BYTES].view(HEAD).ravel()
    end = at + head["total"]
    body_at = at + HEAD_SIZE
    body_end = body_at + head["body_len"]
    if (head["magic"] != MAGIC_CODE).any() or (head["body_len"] < 0).any() or (body_end + 3 > end).any():
        return None
    name = topic.encode()
    props_at = body_end + 1 + len(name) + 2
    if (raw[body_end] != len(name)).any() or (props_at > end).any():
        return None
    if name and (raw[(body_end + 1)[:, None] + np.arange(len(name))] != np.frombuffer(name, np.uint8)).any():
        return None
    props_len = raw[props_at - 2].astype(np.int64) << 8 | raw[props_at - 1]
    if (props_at + props_len != end).any():
        return None
    bodies = _gather(data, body_at, body_end)
    props = _gather(data, props_at, end)
    if bodies is None or props is None:
        return None
    properties = _properties(pa.StringArray.from_buffers(count, *props), count)
    if properties is None:
        return None
    return [
        _repeated(group, count),
        _repeated(topic, count),
        _array(head["queue_id"], pa.int32()),
        _array(head["queue_offset"], pa.int64()),
        _array(head["commitlog_offset"], pa.int64()),
        *properties,
        pa.BinaryArray.from_buffers(pa.binary(), count, [None, *bodies]),
        _array(head["born"] * 1000, _TIMESTAMP),
        _array(head["stored"] * 1000, _TIMESTAMP),
    ]


def _properties(props: pa.StringArray, n: int) -> list[pa.Array] | None:
    """``msg_id, keys, tags, properties`` of ``n`` messages from their stored properties, or None (see
    ``to_columns``)."""
    try:
        props.validate(full=True)  # UTF-8
    except pa.ArrowInvalid:
        return None
    items = pc.split_pattern(props, PROPERTY_SEPARATOR)
    flat = items.flatten()
    present = np.flatnonzero(_lengths(flat))  # "a\x011\x02" splits into "a\x011" and ""
    rows = _numpy(pc.list_parent_indices(items))[present]
    pairs = pc.split_pattern(_taken(flat, present), NAME_VALUE_SEPARATOR, max_splits=1)
    if (_lengths(pairs) < 2).any():
        return None  # an item without its separator
    halves = pairs.flatten()  # name, value, name, value...: every pair has two
    names = _taken(halves, np.arange(0, len(halves), 2)).dictionary_encode()
    values = _taken(halves, np.arange(1, len(halves), 2))
    codes = _numpy(names.indices)
    dictionary = names.dictionary.to_pylist()
    pair_keys = np.sort(rows * len(dictionary) + codes)
    if (pair_keys[1:] == pair_keys[:-1]).any():
        return None  # a property named twice in one message
    code = {name: i for i, name in enumerate(dictionary)}

    def column(name: str) -> pa.Array:
        chosen = np.flatnonzero(codes == code.get(name, -1))
        return _picked(values, chosen, rows[chosen], n)

    with_keys = np.flatnonzero(codes == code.get(PROPERTY_KEYS, -1))
    own = np.array([name in OWN_COLUMNS for name in dictionary], dtype=np.bool_)
    kept = np.flatnonzero(~own[codes]) if len(codes) else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows[kept], minlength=n), out=offsets[1:])
    return [
        column(PROPERTY_UNIQ_KEY),
        _keys(values, with_keys, rows[with_keys], n),
        column(PROPERTY_TAGS),
        pa.MapArray.from_arrays(
            _array(offsets, pa.int32()),
            names.dictionary.take(_array(codes[kept], pa.int32())),
            _taken(values, kept),
        ),
    ]
