"""The ``dledger`` data source: batch and streaming reads of topics, and the sink (``spark.datasource.sink``).

Offsets are per queue, (group, topic, queue id), as ``{"group": {"topic": {"queue id": offset}}}``: the end of a
batch read, and what a stream keeps in its checkpoint (the next offset to read of each queue). One Spark partition
reads one queue's range. See docs/spark.md for the options and the guarantees.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark.datasource.options import (
    EARLIEST,
    LATEST,
    Bound,
    OptionError,
    ReadOptions,
    read_options,
    write_options,
)
from spark.datasource.queues import DDL, GroupTopics, QueueRange, Topology, read_range

Offsets = dict[str, dict[str, dict[str, int]]]  # group -> topic -> queue id (a string) -> offset


class RangePartition(InputPartition):  # type: ignore[misc]
    def __init__(self, r: QueueRange):
        super().__init__(r.name)
        self.range = r


def _given(bound: Bound, group: str, topic: str, queue_id: int) -> int | None:
    queues = (bound.offsets or {}).get(topic, {})
    value = queues.get(f"{group}/{queue_id}", queues.get(str(queue_id)))
    return value


def resolve(topo: Topology, g: GroupTopics, topic: str, queue_id: int, bound: Bound, default: int) -> int:
    """A bound of one queue as an offset; ``default`` (EARLIEST or LATEST) for a queue a JSON leaves out."""
    end = g.ends[topic][queue_id]
    if bound.kind == "timestamp":
        return topo.offset_at(g, topic, queue_id, bound.timestamp_ms)
    value: int | None = {"earliest": EARLIEST, "latest": LATEST}.get(bound.kind)
    if value is None:
        value = _given(bound, g.group, topic, queue_id)
        value = default if value is None else value
    if value == LATEST:
        return end
    if value == EARLIEST:
        return topo.first_offset(g, topic, queue_id)
    if value > end:
        raise OptionError(
            f"option {bound.option}: offset {value} of {g.group}/{topic}/{queue_id} is beyond its end ({end})"
        )
    return value


def _put(offsets: Offsets, group: str, topic: str, queue_id: int, value: int) -> None:
    offsets.setdefault(group, {}).setdefault(topic, {})[str(queue_id)] = value


def _get(offsets: Mapping[str, Any], group: str, topic: str, queue_id: int) -> int | None:
    v = offsets.get(group, {}).get(topic, {}).get(str(queue_id))
    return None if v is None else int(v)


def _queues(offsets: Mapping[str, Any]) -> Iterator[tuple[str, str, int, int]]:
    for group, topics in sorted(offsets.items()):
        for topic, queues in sorted(topics.items()):
            for q, v in sorted(queues.items(), key=lambda kv: int(kv[0])):
                yield group, topic, int(q), int(v)


class DLedgerSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("dledger")``, ``readStream``, ``write`` and ``writeStream`` (docs/spark.md)."""

    @classmethod
    def name(cls) -> str:
        return "dledger"

    def schema(self) -> str:
        return DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark.datasource.sink import BatchWriter

        return BatchWriter(write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark.datasource.sink import StreamWriter

        return StreamWriter(write_options(self.options), schema)


class BatchReader(DataSourceReader):  # type: ignore[misc]
    """Resolves both ends of every queue when Spark plans the read (so bad offsets, a missing topic or an
    unreachable group fail the plan); each task pulls one queue's range."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        topo = Topology(opts.connect, opts.topics)
        try:
            self.ranges = self._plan(topo)
        finally:
            topo.close()

    def _plan(self, topo: Topology) -> list[QueueRange]:
        out = []
        for g in topo.groups(strict=True):
            for topic, ends in sorted(g.ends.items()):
                for q in range(len(ends)):
                    start = resolve(topo, g, topic, q, self.opts.starting, EARLIEST)
                    end = resolve(topo, g, topic, q, self.opts.ending, LATEST)
                    if start > end:
                        raise OptionError(
                            f"option {self.opts.starting.option}: start {start} of {g.group}/{topic}/{q} "
                            f"is after its end {end} ({self.opts.ending.option})"
                        )
                    if end > start:
                        out.append(
                            QueueRange(
                                g.group,
                                g.addresses,
                                topic,
                                q,
                                start,
                                end,
                                self.opts.starting.kind == "earliest",
                            )
                        )
        return out

    def partitions(self) -> Sequence[InputPartition]:
        return [RangePartition(r) for r in self.ranges]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        o = self.opts
        yield from read_range(o.connect, partition.range, o.pull_batch, o.fail_on_data_loss)


def _limited(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """``latest`` cut so that at most ``max_rows`` offsets are read in all, shared among the queues in proportion
    to how far behind each is (every queue behind gets at least one while the budget lasts)."""
    behind = []
    out: Offsets = {}
    for g, t, q, end in _queues(latest):
        known = _get(start, g, t, q)
        s = known or 0
        if known is not None:
            _put(out, g, t, q, known)
        if end > s:
            behind.append((g, t, q, s, end))
    total = sum(end - s for *_, s, end in behind)
    if total <= max_rows:
        return latest
    budget = max_rows
    for g, t, q, s, end in behind:
        take = min(end - s, max(1, (end - s) * max_rows // total), budget)
        if take:
            _put(out, g, t, q, s + take)
        budget -= take
    for g, t, q, s, end in behind:  # what rounding left over
        now = _get(out, g, t, q) or s
        take = min(end - now, budget)
        if take:
            _put(out, g, t, q, now + take)
        budget -= take
    return out


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Micro-batches of every queue of the topics, in every group holding them, found again at each batch (new
    queues and groups are read from their first held offset). The driver keeps one client per group."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self._topology: Topology | None = None
        self._groups: dict[str, GroupTopics] = {g.group: g for g in self._topo.groups(strict=True)}
        self._target: Offsets | None = None
        self.stop()  # planned; the driver's long-lived reader connects again when it asks

    @property
    def _topo(self) -> Topology:
        if self._topology is None:
            self._topology = Topology(self.opts.connect, self.opts.topics)
        return self._topology

    def __getstate__(
        self,
    ) -> dict[str, Any]:  # the tasks get the reader pickled: without the driver's clients
        return {"opts": self.opts, "_topology": None, "_groups": self._groups, "_target": self._target}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _ends(self) -> Offsets:
        out: Offsets = {}
        for g in self._topo.groups(strict=False):
            self._groups[g.group] = g
            for topic, ends in g.ends.items():
                for q, end in enumerate(ends):
                    _put(out, g.group, topic, q, end)
        return out

    def initialOffset(self) -> Offsets:
        out: Offsets = {}
        for g in self._groups.values():
            for topic, ends in g.ends.items():
                for q in range(len(ends)):
                    _put(
                        out, g.group, topic, q, resolve(self._topo, g, topic, q, self.opts.starting, EARLIEST)
                    )
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        ends = self._ends() if self._target is None else self._target
        latest: Offsets = {}
        for g, t, q, s in _queues(start):  # queues of a group unreachable now stay where they were
            _put(latest, g, t, q, s)
        for g, t, q, end in _queues(ends):
            _put(latest, g, t, q, max(end, _get(start, g, t, q) or 0))
        if isinstance(limit, ReadMaxRows):
            return _limited(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> Offsets | None:
        return None

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        out = []
        for group, topic, q, stop in _queues(end):
            begin = _get(start, group, topic, q)
            if stop <= (begin or 0):
                continue
            g = self._groups.get(group)
            if g is None:
                self._ends()
                g = self._groups.get(group)
            if g is None:
                raise OptionError(f"group {group!r} of the checkpoint is not in {self.opts.connect.where()}")
            out.append(
                RangePartition(
                    QueueRange(group, g.addresses, topic, q, begin or 0, stop, from_first=begin is None)
                )
            )
        return out

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        o = self.opts
        yield from read_range(o.connect, partition.range, o.pull_batch, o.fail_on_data_loss)

    def commit(self, end: Offsets) -> None:
        pass  # nothing to release: the reads commit no consumer offset, the checkpoint is Spark's

    def stop(self) -> None:
        if self._topology is not None:
            self._topology.close()
            self._topology = None
