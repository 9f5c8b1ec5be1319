"""Where a topic's queues are and how far they reach, asked on the driver; reading one queue's range, in a task.

A queue is (group, topic, queue id). ``Topology`` finds the groups that hold the topics (the one group of
``addresses``, or every group the name servers route the topic to), each queue's end (``ListTopics``) and, when a
plan needs it, a queue's first held offset (a one-message pull from offset 0 is answered from the first offset
retention kept) or the first offset stored at or after a time (a binary search over one-message pulls: store
times grow with the offset, decision 0021). Everything goes to each group's leader through the broker's own
clients, which follow a leader change, so a failover costs a retry, not an error.

``read_range`` runs in a Spark task: it pulls ``[start, end)`` of one queue from the leader in batches and turns
each batch into an Arrow record batch. A pull below what retention kept is answered from the first kept offset;
the skipped offsets are lost data, which fails the task naming the range or, with ``failOnDataLoss`` false, is
logged and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from broker_adapter.client import Consumer
from broker_adapter.core.formats import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
)
from broker_adapter.nameserver.client import NameServerClient, NoRouteError
from broker_adapter.pulled import PulledMessage, decode
from dledger.errors import DLedgerError, PermissionDeniedError
from spark.datasource.columns import OWN_COLUMNS, to_columns
from spark.datasource.options import Connect, OptionError

log = logging.getLogger("spark.datasource")

READER_GROUP = "spark-dledger"  # the consumer group name the reads carry; they commit nothing

SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("commitlog_offset", pa.int64()),
        ("msg_id", pa.string()),
        ("keys", pa.list_(pa.string())),
        ("tags", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
        ("born_timestamp", pa.timestamp("us", tz="UTC")),
        ("store_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
QUEUE_OFFSET = SCHEMA.get_field_index("queue_offset")
DDL = (
    "`group` string, topic string, queue_id int, queue_offset long, commitlog_offset long, msg_id string, "
    "keys array<string>, tags string, properties map<string,string>, body binary, born_timestamp timestamp, "
    "store_timestamp timestamp"
)


class DataLossError(DLedgerError):
    """Offsets a read needs are no longer held (retention deleted them); the message names the range."""


@dataclass(frozen=True, slots=True)
class QueueRange:
    """One queue's offsets ``[start, end)`` to read; ``from_first`` when the start is "whatever is held"."""

    group: str
    addresses: tuple[str, ...]
    topic: str
    queue_id: int
    start: int
    end: int
    from_first: bool = False

    @property
    def name(self) -> str:
        return f"{self.group}/{self.topic}/{self.queue_id}"


@dataclass(slots=True)
class GroupTopics:
    """One group and, per topic read, each queue's end (the next offset it will store)."""

    group: str
    addresses: tuple[str, ...]
    ends: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _leader_first(leader: str, addresses: Sequence[str]) -> tuple[str, ...]:
    return (leader, *[a for a in addresses if a != leader]) if leader else tuple(addresses)


class Topology:
    """The driver's view of the topics' queues; keeps one client per group. Not thread-safe."""

    def __init__(self, connect: Connect, topics: Sequence[str]):
        self.connect = connect
        self.topics = tuple(topics)
        self._clients: dict[str, Consumer] = {}
        self._ns: NameServerClient | None = None

    def client(self, group: str, addresses: Sequence[str]) -> Consumer:
        c = self._clients.get(group)
        if c is None or set(c.servers) != set(addresses):
            if c is not None:
                c.close()
            c = self._clients[group] = new_consumer(self.connect, addresses)
        return c

    def _routes(self) -> dict[str, tuple[str, ...]]:
        """group -> addresses of every group holding one of the topics."""
        cfg = self.connect
        if not cfg.nameservers:
            return {cfg.group_name: cfg.addresses}
        if self._ns is None:
            self._ns = NameServerClient(cfg.nameservers, timeout_s=cfg.timeout_s, security=cfg.security)
        out: dict[str, tuple[str, ...]] = {}
        for topic in self.topics:
            try:
                routes = self._ns.route(topic)
            except NoRouteError:
                routes = []  # no group holds it (yet): groups() says so when it must
            except DLedgerError as e:
                raise OptionError(f"option nameservers: cannot ask {cfg.where()}: {e}") from None
            for r in routes:
                out[r.group] = _leader_first(r.leader_address, r.addresses)
        return out

    def groups(self, strict: bool = True) -> list[GroupTopics]:
        """Every group holding a topic read, with its queues' ends. ``strict`` (planning): an unreachable group
        or a topic no group holds is an ``OptionError``; otherwise an unreachable group is left out this time."""
        out: list[GroupTopics] = []
        found: set[str] = set()
        for group, addresses in sorted(self._routes().items()):
            try:
                infos = {t.topic: t for t in self.client(group, addresses).list_topics()}
            except DLedgerError as e:
                if strict and (isinstance(e, PermissionDeniedError) or "UNAUTHENTICATED" in str(e)):
                    raise OptionError(f"option accessKey: group {group!r} refused the client: {e}") from None
                if strict:
                    option = "nameservers" if self.connect.nameservers else "addresses"
                    raise OptionError(
                        f"option {option}: cannot reach group {group!r} at {addresses}: {e}"
                    ) from None
                log.warning("group %s at %s unreachable, left out of this batch: %s", group, addresses, e)
                continue
            g = GroupTopics(group, tuple(addresses))
            for topic in self.topics:
                info = infos.get(topic)
                if info is not None:
                    g.ends[topic] = info.max_offsets
                    found.add(topic)
            if g.ends:
                out.append(g)
        missing = [t for t in self.topics if t not in found]
        if strict and missing:
            raise OptionError(
                f"option topic: no topic {', '.join(map(repr, missing))} in {self.connect.where()}"
            )
        return out

    def first_offset(self, g: GroupTopics, topic: str, queue_id: int) -> int:
        """The first offset the group still holds in the queue (its end when it holds none)."""
        c = self.client(g.group, g.addresses)
        msgs = c.pull(topic, queue_id, 0, 1)
        return msgs[0].queue_offset if msgs else g.ends[topic][queue_id]

    def offset_at(self, g: GroupTopics, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms`` (the queue's end when none is)."""
        c = self.client(g.group, g.addresses)
        lo, hi = self.first_offset(g, topic, queue_id), g.ends[topic][queue_id]
        while lo < hi:
            mid = (lo + hi) // 2
            msgs = c.pull(topic, queue_id, mid, 1)
            if not msgs:  # retention moved past mid meanwhile
                lo = mid + 1
            elif msgs[0].store_timestamp >= timestamp_ms:
                hi = msgs[0].queue_offset if msgs[0].queue_offset > mid else mid
            else:
                lo = msgs[0].queue_offset + 1
        return lo

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()
        if self._ns is not None:
            self._ns.close()
            self._ns = None


def new_consumer(cfg: Connect, addresses: Sequence[str]) -> Consumer:
    return Consumer(
        list(addresses), READER_GROUP, timeout_s=cfg.timeout_s, retry_for_s=cfg.retry_s, security=cfg.security
    )


def _ts(ms: list[int]) -> pa.Array:
    return pa.array([m * 1000 for m in ms], type=pa.int64()).cast(pa.timestamp("us", tz="UTC"))


def to_batch(group: str, msgs: list[PulledMessage]) -> pa.RecordBatch:
    """Pulled messages as rows of ``SCHEMA``, one message at a time (properties parsed once per message): the
    reference that ``raw_batch``'s column-wise path is held to, and its fallback."""
    props = [m.properties for m in msgs]
    keys = [p.get(PROPERTY_KEYS) for p in props]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([group] * len(msgs), type=pa.string()),
            pa.array([m.topic for m in msgs], type=pa.string()),
            pa.array([m.queue_id for m in msgs], type=pa.int32()),
            pa.array([m.queue_offset for m in msgs], type=pa.int64()),
            pa.array([m.commitlog_offset for m in msgs], type=pa.int64()),
            pa.array([p.get(PROPERTY_UNIQ_KEY) for p in props], type=pa.string()),
            pa.array([k.split(KEY_SEPARATOR) if k else [] for k in keys], type=pa.list_(pa.string())),
            pa.array([p.get(PROPERTY_TAGS) for p in props], type=pa.string()),
            pa.array(
                [[(k, v) for k, v in p.items() if k not in OWN_COLUMNS] for p in props],
                type=pa.map_(pa.string(), pa.string()),
            ),
            pa.array([m.body for m in msgs], type=pa.binary()),
            _ts([m.born_timestamp for m in msgs]),
            _ts([m.store_timestamp for m in msgs]),
        ],
        schema=SCHEMA,
    )


def raw_batch(group: str, topic: str, data: bytes, count: int) -> pa.RecordBatch:
    """The ``count`` messages of a raw pull of ``topic`` as rows of ``SCHEMA``: built column-wise
    (``columns.to_columns``), or message by message when that path declines (``to_batch``, which raises
    ``DLedgerError`` naming what is malformed)."""
    cols = to_columns(group, topic, data, count)
    if cols is None:
        return to_batch(group, decode(data, count))
    return pa.RecordBatch.from_arrays(cols, schema=SCHEMA)


def _lost(r: QueueRange, lo: int, hi: int, fail: bool) -> None:
    what = (
        f"data loss in {r.name}: offsets {lo}..{hi - 1} are no longer held (retention deleted them) "
        f"while this read needs {r.start}..{r.end - 1}"
    )
    if fail:
        raise DataLossError(what + "; failOnDataLoss=false skips them")
    log.warning("%s; skipped (failOnDataLoss=false)", what)
    print(f"WARN spark.datasource: {what}; skipped (failOnDataLoss=false)", flush=True)


def read_range(cfg: Connect, r: QueueRange, batch: int, fail_on_loss: bool) -> Iterator[pa.RecordBatch]:
    """The messages of ``r`` in queue order, a record batch per pull. The next pull is in flight while Spark
    takes the batch before it (one pull ahead, on a thread: the gRPC wait and the leader's work overlap the
    hand-off to the JVM)."""
    if r.end <= r.start:
        return
    with new_consumer(cfg, r.addresses) as c, ThreadPoolExecutor(1, "dledger-pull") as ahead:

        def pull(at: int) -> tuple[bytes, int]:
            return c.pull_raw(r.topic, r.queue_id, at, min(batch, r.end - at))

        at = r.start
        pending = ahead.submit(pull, at)
        while True:
            data, count = pending.result()
            rows = raw_batch(r.group, r.topic, data, count)
            offsets = rows.column(QUEUE_OFFSET)
            first = offsets[0].as_py() if count else r.end
            if first > at and not (r.from_first and at == r.start):
                _lost(r, at, min(first, r.end), fail_on_loss)
            if not count:
                return
            at = offsets[count - 1].as_py() + 1
            if at < r.end:
                pending = ahead.submit(pull, at)
            yield rows
            if at >= r.end:
                return
