"""``spark.read.format("dledger-files")``: the files of stopped or archived nodes, read as the audit reads them.

``load("DIR[,DIR...]")`` (or the option ``path``) takes node directories or group directories (``spark.layout``);
``kind`` chooses the rows:

- ``entries`` (default): one row per log entry of every data segment of every node (``spark.segment``'s scan,
  read-only; a torn or corrupt tail ends a segment's rows, as the audit reports it);
- ``messages``: the entries that are broker messages, with the queue position the message records, its CommitLog
  offset and size (as a ConsumeQueue unit holds them);
- ``queues``: one row per ConsumeQueue unit of every node (where each queue offset points in the CommitLog).

One Spark partition per data segment (``queues``: per node). Nothing is opened for writing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark.audit import queue_tasks, segment_tasks
from spark.broker import BODY_MESSAGE
from spark.datasource.options import OptionError
from spark.layout import AuditInputError, discover
from spark.segment import EntryChunk, SegmentTask, scan_segment
from spark.tasks import chunk_batch, queue_partition

HEADER_SIZE = 48  # storage.codec.HEADER_SIZE: a message's CommitLog offset is its entry's pos + this
KINDS = ("entries", "messages", "queues")
ENTRY_COLUMNS = (
    "index", "term", "pos", "size", "magic", "body_crc", "chain_crc", "body_kind",
    "topic", "queue_id", "queue_offset", "tags_code", "msg_id",
)  # fmt: skip
DDL = {
    "entries": "node string, segment long, `index` long, term long, pos long, size int, magic int, body_crc long, "
    "chain_crc long, body_kind byte, topic string, queue_id int, queue_offset long, tags_code long, msg_id string",
    "messages": "node string, `index` long, term long, commitlog_offset long, size int, topic string, "
    "queue_id int, queue_offset long, tags_code long, msg_id string",
    "queues": "node string, topic string, queue_id int, queue_offset long, commitlog_offset long, size int, "
    "tags_code long",
}


@dataclass(frozen=True, slots=True)
class FilesOptions:
    paths: tuple[str, ...]
    kind: str


def files_options(options: dict[str, str]) -> FilesOptions:
    opts = {k.lower(): v for k, v in options.items()}
    for key in opts:
        if key not in ("path", "paths", "kind"):
            raise OptionError(f"unknown option {key!r} of the dledger-files data source (known: path, kind)")
    raw = opts.get("path") or opts.get("paths") or ""
    paths = tuple(p.strip() for p in raw.split(",") if p.strip())
    if not paths:
        raise OptionError("option path: the node or group directories to read (load(DIR) or option path)")
    kind = opts.get("kind", "entries").strip().lower()
    if kind not in KINDS:
        raise OptionError(f"option kind: {kind!r} is not one of {', '.join(KINDS)}")
    return FilesOptions(paths, kind)


class FilesSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "dledger-files"

    def schema(self) -> str:
        return DDL[files_options(self.options).kind]

    def reader(self, schema: StructType) -> DataSourceReader:
        return FilesReader(files_options(self.options))


class Task(InputPartition):  # type: ignore[misc]
    def __init__(self, node: str, task: str | SegmentTask):
        super().__init__(node)
        self.node = node
        self.task = task


class FilesReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: FilesOptions):
        self.opts = opts
        try:
            layouts = discover(list(opts.paths))
        except AuditInputError as e:
            raise OptionError(f"option path: {e}") from None
        self.names = {lay.node: lay.name for lay in layouts}
        if opts.kind == "queues":
            self.tasks = [Task(self.names[json.loads(t)["node"]], t) for t in queue_tasks(layouts)]
        else:
            self.tasks = [Task(self.names[t.node], t) for t in segment_tasks(layouts, True, None)]

    def partitions(self) -> Sequence[InputPartition]:
        return self.tasks

    def read(self, partition: Task) -> Iterator[pa.RecordBatch]:
        node = partition.node
        if isinstance(partition.task, str):
            batch = pa.RecordBatch.from_pylist([{"task": partition.task}])
            for b in queue_partition(iter([batch])):
                yield _with_node(node, b.drop_columns(["node"]))
            return
        task = partition.task
        chunks: list[EntryChunk] = []
        scan_segment(task, chunks.append)
        for chunk in chunks:
            b = chunk_batch(task.node, task.start, chunk)
            if self.opts.kind == "entries":
                yield _with_node(
                    node, b.select(["seg", *ENTRY_COLUMNS]).rename_columns(["segment", *ENTRY_COLUMNS])
                )
                continue
            b = b.filter(pc.equal(b.column("body_kind"), BODY_MESSAGE))
            clo = pc.add(b.column("pos"), HEADER_SIZE)
            cols = b.select(
                ["index", "term", "size", "topic", "queue_id", "queue_offset", "tags_code", "msg_id"]
            )
            cols = cols.set_column(
                2, "size", pc.subtract(cols.column("size"), pa.scalar(HEADER_SIZE, pa.int32()))
            )
            yield _with_node(node, cols.add_column(2, "commitlog_offset", clo))


def _with_node(node: str, b: pa.RecordBatch) -> pa.RecordBatch:
    return b.add_column(0, "node", pa.array([node] * b.num_rows, type=pa.string()))
