"""The functions Spark runs in its Python workers, and the Arrow schemas of what they return.

Work is split by file: one task per data segment (``scan_tasks``) and one per ConsumeQueue file
(``queue_tasks``). Each task is a JSON string in a one-column DataFrame with one partition per task, so a cluster
spreads segments over its executors; the workers read the files themselves (read-only) and return columns as
Arrow record batches (``mapInArrow``), never one Python object per row. On a cluster the node directories must be
visible to the executors at the same paths (a shared or network filesystem), as they are in local mode.

The scan's output has one row per entry (``kind`` 0) and one summary row per segment (``kind`` 1) whose ``info``
column holds the segment summary as JSON (see ``spark.segment``): the summaries are few and go to the driver, the
entry rows stay in Spark for the cross-node joins.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Final

import numpy as np
import pyarrow as pa

from broker_adapter.core.formats import UNIT_SIZE
from spark.broker import read_queue_file
from spark.segment import EntryChunk, SegmentTask, scan_segment

KIND_ENTRY: Final = 0
KIND_SUMMARY: Final = 1

SCAN_SCHEMA: Final = pa.schema(
    [
        ("kind", pa.int8()),
        ("node", pa.int16()),
        ("seg", pa.int64()),
        ("index", pa.int64()),
        ("term", pa.int64()),
        ("pos", pa.int64()),
        ("size", pa.int32()),
        ("magic", pa.int32()),
        ("body_crc", pa.int64()),
        ("chain_crc", pa.int64()),
        ("body_kind", pa.int8()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("tags_code", pa.int64()),
        ("msg_id", pa.string()),
        ("info", pa.string()),
    ]
)
SCAN_DDL: Final = (
    "kind byte, node short, seg long, index long, term long, pos long, size int, magic int, body_crc long, "
    "chain_crc long, body_kind byte, topic string, queue_id int, queue_offset long, tags_code long, "
    "msg_id string, info string"
)

QUEUE_SCHEMA: Final = pa.schema(
    [
        ("node", pa.int16()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("commitlog_offset", pa.int64()),
        ("size", pa.int32()),
        ("tags_code", pa.int64()),
    ]
)
QUEUE_DDL: Final = "node short, topic string, queue_id int, queue_offset long, commitlog_offset long, size int, tags_code long"


def task_json(task: SegmentTask) -> str:
    return json.dumps(
        {
            "node": task.node,
            "path": task.path,
            "start": task.start,
            "last": task.last,
            "index_files": [list(f) for f in task.index_files],
            "full": task.full,
            "commit": task.commit,
            "checkpoint_every": task.checkpoint_every,
            "begin": task.begin,
        }
    )


def task_from_json(raw: str) -> SegmentTask:
    d = json.loads(raw)
    return SegmentTask(
        node=d["node"],
        path=d["path"],
        start=d["start"],
        last=d["last"],
        index_files=tuple((int(s), str(p)) for s, p in d["index_files"]),
        full=d["full"],
        commit=d["commit"],
        checkpoint_every=d["checkpoint_every"],
        begin=d.get("begin", 0),
    )


def _sparse(n: int, rows: list[int], values: list, dtype) -> pa.Array:
    if not rows:
        return pa.nulls(n, type=dtype)
    if pa.types.is_string(dtype):
        full: list = [None] * n
        for r, v in zip(rows, values, strict=True):
            full[r] = v
        return pa.array(full, type=dtype)
    np_type = np.int32 if dtype == pa.int32() else np.int64
    data = np.zeros(n, dtype=np_type)
    mask = np.ones(n, dtype=bool)
    idx = np.asarray(rows, dtype=np.int64)
    data[idx] = np.asarray(values, dtype=np_type)
    mask[idx] = False
    return pa.array(data, mask=mask, type=dtype)


def chunk_batch(node: int, seg: int, chunk: EntryChunk) -> pa.RecordBatch:
    """Entry rows of one chunk as an Arrow batch (numeric columns are zero-copy views of the chunk's arrays)."""
    n = len(chunk)
    rows = chunk.msg_rows
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.zeros(n, dtype=np.int8)),
            pa.array(np.full(n, node, dtype=np.int16)),
            pa.array(np.full(n, seg, dtype=np.int64)),
            pa.array(chunk.index),
            pa.array(chunk.term),
            pa.array(chunk.pos),
            pa.array(chunk.size),
            pa.array(chunk.magic),
            pa.array(chunk.body_crc),
            pa.array(chunk.chain_crc),
            pa.array(chunk.body_kind),
            _sparse(n, rows, chunk.topic, pa.string()),
            _sparse(n, rows, chunk.queue_id, pa.int32()),
            _sparse(n, rows, chunk.queue_offset, pa.int64()),
            _sparse(n, rows, chunk.tags_code, pa.int64()),
            _sparse(n, rows, chunk.msg_id, pa.string()),
            pa.nulls(n, type=pa.string()),
        ],
        schema=SCAN_SCHEMA,
    )


def summary_batch(node: int, seg: int, summary: dict) -> pa.RecordBatch:
    row = {name: None for name in SCAN_SCHEMA.names}
    row.update(kind=KIND_SUMMARY, node=node, seg=seg, info=json.dumps(summary))
    return pa.RecordBatch.from_pylist([row], schema=SCAN_SCHEMA)


def scan_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: each input row is a segment task; yields its entry rows, then its summary row."""
    for batch in batches:
        for raw in batch.column(0).to_pylist():
            task = task_from_json(raw)
            out: list[pa.RecordBatch] = []
            started = time.perf_counter()
            summary = scan_segment(task, lambda c, t=task, o=out: o.append(chunk_batch(t.node, t.start, c)))
            summary["worker_s"] = time.perf_counter() - started
            yield from out
            yield summary_batch(task.node, task.start, summary)


def queue_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: each input row is one node's ConsumeQueue files; yields their units per file."""
    for batch in batches:
        for raw in batch.column(0).to_pylist():
            d = json.loads(raw)
            for f in d["files"]:
                units = read_queue_file(f["path"])
                n = len(units)
                first = f["start"] // UNIT_SIZE
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(np.full(n, d["node"], dtype=np.int16)),
                        pa.array([f["topic"]] * n, type=pa.string()),
                        pa.array(np.full(n, f["queue_id"], dtype=np.int32)),
                        pa.array(np.arange(first, first + n, dtype=np.int64)),
                        pa.array(units["commitlog_offset"].astype(np.int64)),
                        pa.array(units["size"].astype(np.int32)),
                        pa.array(units["tags_code"].astype(np.int64)),
                    ],
                    schema=QUEUE_SCHEMA,
                )
