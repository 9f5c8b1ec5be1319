"""The ``dledger`` sink: each row becomes one message, stored once however often Spark retries the task.

Exactly once rests on the broker's idempotent producer (docs/broker.md): a message carries a producer id and a
sequence, and the group's leader answers a send whose (producer id, sequence) the log already holds with the
first attempt's place instead of storing it again; the table of what each producer stored is derived from the log,
so it survives failovers and restarts. A task derives both from what a retry of it sees again:

- the producer id from the write and the partition: ``spark-<write id>-p<partition>`` for a batch write (the write
  id is drawn once when Spark plans the write), ``spark-<query id>-b<batch id>-p<partition>`` for a micro-batch
  (the query id is kept in the checkpoint, and a batch replayed after a restart has the same id), with
  ``@<group>`` appended per broker group written to;
- the sequence from the row's place among the partition's rows sorted by content (topic, body, tags, keys,
  properties), so a retry that gets the same rows in another order numbers them the same; and the queue from the
  first key's hash, or else from the sequence, over the queues captured when the write was planned.

A row is stored once when a retry or replay hands the partition the same rows: a deterministic input (this
source, files, a stateful aggregation replayed from its checkpoint) does. Identical rows in one partition are
distinct messages (each has its own sequence). docs/spark.md states the guarantee and its limits.
"""

from __future__ import annotations

import hashlib
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
)

from broker_adapter.client import Producer
from broker_adapter.nameserver.client import NameServerClient, NoRouteError
from broker_adapter.v1 import broker_pb2
from dledger.errors import DLedgerError
from spark.datasource.options import Connect, OptionError, WriteOptions
from spark.datasource.queues import Topology

QUERY_ID = "sql.streaming.queryId"  # the local properties Spark gives a micro-batch's tasks
BATCH_ID = "streaming.sql.batchId"

COLUMNS: dict[str, tuple[DataType, ...]] = {
    "body": (BinaryType(), StringType()),
    "topic": (StringType(),),
    "tags": (StringType(),),
    "keys": (ArrayType(StringType(), True), ArrayType(StringType(), False), StringType()),
    "properties": (MapType(StringType(), StringType(), True), MapType(StringType(), StringType(), False)),
}

# (topic, body, tags, keys, properties) of one row, comparable
Item = tuple[str, bytes, str, tuple[str, ...], tuple[tuple[str, str], ...]]
# topic -> the (group, queue id) list a message of it may go to, sorted
Queues = dict[str, list[tuple[str, int]]]


def check_schema(schema: StructType, topic_option: str | None) -> None:
    names = {f.name.lower(): f for f in schema.fields}
    for name, field in names.items():
        allowed = COLUMNS.get(name)
        if allowed is None:
            raise OptionError(
                f"column {field.name!r}: the dledger sink writes the columns {', '.join(COLUMNS)} only"
            )
        if field.dataType not in allowed:
            raise OptionError(
                f"column {field.name!r}: {field.dataType.simpleString()} is not one of "
                + ", ".join(t.simpleString() for t in allowed)
            )
    if "body" not in names:
        raise OptionError("column 'body': the dledger sink needs a body column (binary or string)")
    if "topic" not in names and topic_option is None:
        raise OptionError("option topic: give the topic, or a topic column")


@dataclass(frozen=True, slots=True)
class Written(WriterCommitMessage):  # type: ignore[misc]
    """What one task stored: messages sent, and how many of them the leader recognised as already stored."""

    partition: int
    producer_id: str
    sent: int
    duplicates: int


def _item(row: Row, topic: str | None) -> Item:
    d = row.asDict()
    body = d["body"]
    t = d.get("topic") or topic
    if t is None:
        raise DLedgerError("a row has no topic (its topic column is null and the option topic is not set)")
    if body is None:
        raise DLedgerError(f"a row for topic {t!r} has a null body")
    keys = d.get("keys") or ()
    if isinstance(keys, str):
        keys = tuple(k for k in keys.split(" ") if k)
    props = d.get("properties") or {}
    return (
        t,
        body.encode() if isinstance(body, str) else bytes(body),
        d.get("tags") or "",
        tuple(keys),
        tuple(sorted(props.items())),
    )


def message_id(producer_id: str, sequence: int) -> str:
    """The same id for a row on every retry: 22 hex digits of the producer, then the sequence (RocketMQ's width)."""
    return hashlib.sha256(producer_id.encode()).hexdigest().upper()[:22] + f"{sequence:010X}"


class _Writing:
    """One task's sends: a producer per group, each with its own sequences."""

    def __init__(self, connect: Connect, producer_id: str, queues: Queues):
        self.connect = connect
        self.producer_id = producer_id
        self.queues = queues
        self.addresses: dict[str, tuple[str, ...]] = {}
        self._producers: dict[str, Producer] = {}
        self._seq: dict[str, int] = {}

    def learn(self, topics: set[str], groups: dict[str, tuple[str, ...]]) -> None:
        """The queues of topics the plan did not know (rows with a topic column)."""
        missing = topics - self.queues.keys()
        if missing:
            self.queues.update(plan_queues(self.connect, sorted(missing), groups))
        self.addresses.update(groups)

    def place(self, items: Sequence[Item]) -> dict[tuple[str, str], list[broker_pb2.OutgoingMessage]]:
        """(group, topic) -> the numbered messages of the rows, in sequence order."""
        out: dict[tuple[str, str], list[broker_pb2.OutgoingMessage]] = {}
        for k, (topic, body, tags, keys, props) in enumerate(items):
            qs = self.queues[topic]
            group, qid = qs[zlib.crc32(keys[0].encode()) % len(qs)] if keys else qs[k % len(qs)]
            seq = self._seq.get(group, 0)
            self._seq[group] = seq + 1
            pid = f"{self.producer_id}@{group}"
            out.setdefault((group, topic), []).append(
                broker_pb2.OutgoingMessage(
                    queue_id=qid,
                    body=body,
                    tags=tags,
                    keys=list(keys),
                    msg_id=message_id(pid, seq),
                    producer_id=pid,
                    sequence=seq,
                    properties=dict(props),
                )
            )
        return out

    def send(self, group: str, topic: str, msgs: list[broker_pb2.OutgoingMessage], batch: int) -> int:
        """Send in order, ``batch`` at a time; how many the leader already held (a retry's)."""
        p = self._producers.get(group)
        if p is None:
            c = self.connect
            p = self._producers[group] = Producer(
                list(self.addresses[group]),
                producer_id=f"{self.producer_id}@{group}",
                timeout_s=c.timeout_s,
                retry_for_s=c.retry_s,
                security=c.security,
            )
        dups = 0
        for i in range(0, len(msgs), batch):
            dups += sum(r.duplicate for r in p.send_messages(topic, msgs[i : i + batch]))
        return dups

    def close(self) -> None:
        for p in self._producers.values():
            p.close()


def plan_groups(connect: Connect, topic: str | None) -> dict[str, tuple[str, ...]]:
    """group -> addresses of the groups a write may go to (with a topic: those holding it)."""
    if not connect.nameservers:
        return {connect.group_name: connect.addresses}
    with NameServerClient(connect.nameservers, timeout_s=connect.timeout_s, security=connect.security) as ns:
        try:
            routes = ns.route(topic or "")
        except NoRouteError:
            raise OptionError(f"option topic: no group of {connect.where()} holds {topic!r}") from None
        except DLedgerError as e:
            raise OptionError(f"option nameservers: cannot ask {connect.where()}: {e}") from None
    return {r.group: tuple(r.addresses) for r in routes}


def plan_queues(connect: Connect, topics: Sequence[str], groups: dict[str, tuple[str, ...]]) -> Queues:
    """topic -> every (group, queue id) that holds it, sorted; a topic no group holds is an ``OptionError``."""
    topo = Topology(connect, topics)
    try:
        out: Queues = {t: [] for t in topics}
        for g in topo.groups(strict=True):
            for t, ends in g.ends.items():
                out[t] += [(g.group, q) for q in range(len(ends))]
                groups.setdefault(g.group, g.addresses)
        return {t: sorted(qs) for t, qs in out.items()}
    finally:
        topo.close()


class _Sink:
    def __init__(self, opts: WriteOptions, schema: StructType):
        check_schema(schema, opts.topic)
        self.opts = opts
        self.groups = plan_groups(opts.connect, opts.topic)
        self.queues: Queues = plan_queues(opts.connect, [opts.topic], self.groups) if opts.topic else {}

    def _write(self, rows: Iterator[Row], producer_id: str, partition: int) -> Written:
        items = sorted(_item(r, self.opts.topic) for r in rows)
        w = _Writing(self.opts.connect, producer_id, dict(self.queues))
        try:
            w.learn({it[0] for it in items}, dict(self.groups))
            dups = 0
            for (group, topic), msgs in w.place(items).items():
                dups += w.send(group, topic, msgs, self.opts.batch_size)
        finally:
            w.close()
        return Written(partition, producer_id, len(items), dups)


class BatchWriter(_Sink, DataSourceWriter):  # type: ignore[misc]
    def __init__(self, opts: WriteOptions, schema: StructType):
        super().__init__(opts, schema)
        self.write_id = (
            uuid.uuid4().hex
        )  # drawn once, when the write is planned: every retry of a task sees it

    def write(self, iterator: Iterator[Row]) -> Written:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        return self._write(iterator, f"spark-{self.write_id}-p{partition}", partition)

    def commit(self, messages: list[Any]) -> None:
        pass  # every message is stored already (a send is acknowledged at quorum commit)

    def abort(self, messages: list[Any]) -> None:
        pass  # what tasks stored stays stored: the broker has no transaction over a job's sends


class StreamWriter(_Sink, DataSourceStreamWriter):  # type: ignore[misc]
    def write(self, iterator: Iterator[Row]) -> Written:
        ctx = TaskContext.get()
        if ctx is None:
            raise DLedgerError("the dledger stream sink runs in Spark tasks only")
        query, batch = ctx.getLocalProperty(QUERY_ID), ctx.getLocalProperty(BATCH_ID)
        if not query or batch is None:
            raise DLedgerError(f"a micro-batch task without {QUERY_ID} / {BATCH_ID}: cannot number its rows")
        partition = ctx.partitionId()
        return self._write(iterator, f"spark-{query}-b{batch}-p{partition}", partition)

    def commit(self, messages: list[Any], batchId: int) -> None:
        pass

    def abort(self, messages: list[Any], batchId: int) -> None:
        pass
