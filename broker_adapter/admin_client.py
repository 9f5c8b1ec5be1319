"""``BrokerAdmin``: the administration client of one broker group (``dledger.v1.BrokerAdmin``; docs/broker.md,
Administration), for the CLI and the web console. Blocking and thread-safe; it shares the broker clients' core
(``BrokerConnection``: one channel per node, leader redirects and retries, ``dledger/connections.py``).

Answers are plain dataclasses (those of ``broker_adapter.core.model`` and ``FoundMessage``). Every change (delete, reset, settings) goes through the group's log; errors are
``dledger.errors`` classes with the server's message (``NotFoundError`` for unknown topics, queues and groups,
``InvalidRequestError`` for bad input). Reads go to the leader unless ``allow_follower``.

Browsing (``browse``) and dead letters (``dead_letters``) read with ``Pull``: nothing is committed. ``resend``
sends a dead letter back to its original topic as a new message (a new message id; body, tags, keys and user
properties kept).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from broker_adapter.client import BrokerConnection, Producer, _pull_request
from broker_adapter.core import message, topics
from broker_adapter.core.model import GroupQueue, GroupSummary, OffsetReset, QueueStatus, SendResult
from broker_adapter.pulled import PulledMessage
from broker_adapter.pulled import decode as decode_pulled
from broker_adapter.v1 import admin_pb2, admin_pb2_grpc, broker_pb2
from dledger.errors import NotFoundError

_ADMIN_METHODS = frozenset(admin_pb2.DESCRIPTOR.services_by_name["BrokerAdmin"].methods_by_name)
_ADMIN_WRITES = frozenset({"DeleteTopic", "DeleteGroup", "ResetOffsets", "SetConfig"})
# What a resent dead letter does not take along: what the broker stamped on it and the producer's numbering.
_NOT_RESENT = message.ROCKETMQ_RESERVED_PROPERTIES | {
    message.PROPERTY_ORIGIN,
    message.PROPERTY_PRODUCER_ID,
    message.PROPERTY_SEQUENCE,
    message.PROPERTY_TAGS,
    message.PROPERTY_KEYS,
    message.PROPERTY_UNIQ_KEY,
}


@dataclass(frozen=True, slots=True)
class FoundMessage:
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    tags: str
    keys: tuple[str, ...]
    properties: dict[str, str]
    born_ms: int
    store_ms: int
    body: bytes

    def to_json(self) -> dict[str, Any]:
        """A JSON-able record (the body as text when it is UTF-8, else as hex with ``body_hex``)."""
        d: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__ if k != "body"}
        d["keys"] = list(self.keys)
        try:
            d["body"] = self.body.decode()
        except UnicodeDecodeError:
            d["body_hex"] = self.body.hex()
        return d


def epoch_ms(text: str) -> int:
    """Milliseconds since the epoch from digits or an ISO 8601 time (UTC when it names no zone); ValueError
    naming both forms otherwise (``message query --start``, the console's search and reset forms)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"a time is ms since the epoch or an ISO 8601 time (2026-11-25T10:00:00), got {text!r}"
        ) from None
    return int((t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() * 1000)


def origin_topic(m: FoundMessage) -> str:
    """The topic a dead letter was first sent to (where ``BrokerAdmin.resend`` sends it back)."""
    topic = m.properties.get(message.PROPERTY_RETRY_TOPIC, "")
    if topic.startswith(topics.RETRY_PREFIX) or not topic:
        topic = m.properties.get("DLQ_ORIGIN_TOPIC", topic)
    return topic


def found(m: broker_pb2.StoredMessage | PulledMessage) -> FoundMessage:
    """A message as a query (``StoredMessage``) or a pull (``PulledMessage``) gives it: the same fields."""
    return FoundMessage(
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.commitlog_offset,
        m.msg_id,
        m.tags or "",
        tuple(m.keys),
        dict(m.properties),
        m.born_timestamp,
        m.store_timestamp,
        bytes(m.body),
    )


class BrokerAdmin(BrokerConnection):
    """Administration of one group: ``BrokerAdmin(addresses)`` (a context manager, like every client)."""

    writes = BrokerConnection.writes | _ADMIN_WRITES

    def __init__(self, servers: Sequence[str], **kw: Any):
        super().__init__(servers, **kw)
        self._kw = kw
        self._producer: Producer | None = None

    def _invoke(self, method: str, request: Any) -> Any:
        if method not in _ADMIN_METHODS:
            return super()._invoke(method, request)
        return lambda target, _: getattr(self._channels.stub(target, admin_pb2_grpc.BrokerAdminStub), method)(
            request, timeout=self.timeout_s
        )

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
        super().close()

    # -- topics --------------------------------------------------------------------------------------------
    def topic_status(self, topic: str, allow_follower: bool = False) -> list[QueueStatus]:
        r = self.call(
            "TopicStatus",
            admin_pb2.TopicStatusRequest(topic=topic, allow_follower=allow_follower),
            retry_unknown=True,
        )
        return [
            QueueStatus(topic, q.queue_id, q.min_offset, q.max_offset, q.last_store_timestamp)
            for q in r.queues
        ]

    def delete_topic(self, topic: str) -> int:
        """Delete the topic (docs/broker.md, Administration); returns how many queues it had."""
        return int(
            self.call("DeleteTopic", admin_pb2.DeleteTopicRequest(topic=topic), retry_unknown=False).queues
        )

    def browse(
        self, topic: str, queue_id: int, offset: int, count: int = 32, allow_follower: bool = False
    ) -> list[FoundMessage]:
        """Up to ``count`` messages of a queue from ``offset`` (from the first held one when retention deleted
        what came before); commits nothing."""
        out: list[FoundMessage] = []
        while len(out) < count:
            request = _pull_request(topic, queue_id, offset, min(256, count - len(out)), 0, allow_follower)
            r = self.call("Pull", request, retry_unknown=True)
            got = decode_pulled(r.raw, r.raw_count)
            out += [found(m) for m in got]
            if not got:
                break
            offset = r.next_offset
        return out

    # -- consumer groups -----------------------------------------------------------------------------------
    def list_groups(self, allow_follower: bool = False) -> list[GroupSummary]:
        r = self.call(
            "ListGroups", admin_pb2.ListGroupsRequest(allow_follower=allow_follower), retry_unknown=True
        )
        return [GroupSummary(g.group, tuple(g.topics), g.lag, g.has_settings) for g in r.groups]

    def describe_group(
        self, group: str, topic: str | None = None, allow_follower: bool = False
    ) -> list[GroupQueue]:
        return self.describe(group, topic, allow_follower)[1]

    def describe(
        self, group: str, topic: str | None = None, allow_follower: bool = False
    ) -> tuple[list[str], list[GroupQueue]]:
        """(the members ``group_members`` gives, the queues ``describe_group`` gives) from one call."""
        r = self.call(
            "DescribeGroup",
            admin_pb2.DescribeGroupRequest(group=group, topic=topic or "", allow_follower=allow_follower),
            retry_unknown=True,
        )
        return list(r.members), [
            GroupQueue(
                q.topic,
                q.queue_id,
                q.committed_offset if q.has_committed else None,
                q.max_offset,
                q.in_flight,
            )
            for q in r.queues
        ]

    def group_members(self, group: str) -> list[str]:
        """The group's consumers as the leader sees them (client ids): our own that pulled for the group and
        RocketMQ 5 consumers that heartbeat, within 30 s (a cluster's members: ``NameServerClient.consumers``)."""
        return self.describe(group)[0]

    def delete_group(self, group: str) -> None:
        self.call("DeleteGroup", admin_pb2.DeleteGroupRequest(group=group), retry_unknown=False)

    def reset_offsets(
        self, group: str, topic: str, mode: str, value: int = 0, queue_id: int | None = None
    ) -> list[OffsetReset]:
        """``mode``: "earliest", "latest", "offset" (``value``) or "time" (``value`` ms since the epoch)."""
        request = admin_pb2.ResetOffsetsRequest(group=group, topic=topic, mode=mode, value=value)
        if queue_id is not None:
            request.queue_id = queue_id
        r = self.call("ResetOffsets", request, retry_unknown=True)  # setting offsets again is harmless
        return [OffsetReset(q.queue_id, q.old_offset if q.had_old else None, q.new_offset) for q in r.queues]

    # -- messages ------------------------------------------------------------------------------------------
    def _query(self, request: admin_pb2.QueryMessagesRequest) -> list[FoundMessage]:
        return [found(m) for m in self.call("QueryMessages", request, retry_unknown=True).messages]

    def query_by_key(self, key: str, topic: str = "", limit: int = 32) -> list[FoundMessage]:
        """Messages carrying ``key`` (through the key index), newest first."""
        return self._query(admin_pb2.QueryMessagesRequest(by="key", value=key, topic=topic, limit=limit))

    def query_by_id(self, msg_id: str, topic: str = "", limit: int = 32) -> list[FoundMessage]:
        return self._query(admin_pb2.QueryMessagesRequest(by="id", value=msg_id, topic=topic, limit=limit))

    def query_by_time(self, topic: str, start_ms: int, end_ms: int, limit: int = 32) -> list[FoundMessage]:
        """Messages of ``topic`` stored in [start_ms, end_ms)."""
        return self._query(
            admin_pb2.QueryMessagesRequest(
                by="time", topic=topic, start_ms=start_ms, end_ms=end_ms, limit=limit
            )
        )

    # -- dead letters --------------------------------------------------------------------------------------
    def dead_letter_groups(self) -> list[tuple[str, int]]:
        """(consumer group, dead letters stored) for every group with a dead-letter topic."""
        return [
            (t.topic.removeprefix(topics.DLQ_PREFIX), sum(t.max_offsets))
            for t in self.list_topics()
            if t.topic.startswith(topics.DLQ_PREFIX)
        ]

    def dead_letters(self, group: str, limit: int = 1000) -> Iterator[FoundMessage]:
        """The group's dead letters (``%DLQ%<group>``), queue by queue from the first held; commits nothing."""
        dlq = topics.dlq_topic(group)
        n = 0
        for q in self.topic_status(dlq):
            offset = q.min_offset
            while offset < q.max_offset and n < limit:
                batch = self.browse(dlq, q.queue_id, offset, min(256, limit - n))
                if not batch:
                    break
                yield from batch
                n += len(batch)
                offset = batch[-1].queue_offset + 1

    def resend(self, group: str, queue_id: int, offset: int) -> SendResult:
        """Send the dead letter at ``offset`` of ``%DLQ%<group>`` queue ``queue_id`` back to its original topic:
        a new message (a new id) with its body, tags, keys and user properties."""
        batch = self.browse(topics.dlq_topic(group), queue_id, offset, 1)
        if not batch or batch[0].queue_offset != offset:
            raise NotFoundError(f"no dead letter at {topics.dlq_topic(group)}/{queue_id} offset {offset}")
        m = batch[0]
        topic = origin_topic(m)
        if self._producer is None:
            self._producer = Producer(self.servers, **self._kw)
        out = self._producer.outgoing(topic, m.body, m.tags or None, list(m.keys))
        out.properties.update({k: v for k, v in m.properties.items() if k not in _NOT_RESENT})
        out.properties[message.PROPERTY_ORIGIN_MESSAGE_ID] = m.msg_id
        return self._producer.send_messages(topic, [out])[0]

    # -- run-time settings ---------------------------------------------------------------------------------
    def get_config(self) -> dict[str, dict[str, Any]]:
        """Each run-time setting: {"value": ..., "source": "log" | "node.toml"}."""
        return _config(self.call("GetConfig", admin_pb2.GetConfigRequest(), retry_unknown=True))

    def set_config(self, **values: Any) -> dict[str, dict[str, Any]]:
        """Set run-time settings through the log (retention_hours, retention_bytes, disk_max_used_percent,
        max_delay_ms); returns every setting now in force."""
        request = admin_pb2.SetConfigRequest(values={k: str(v) for k, v in values.items()})
        return _config(self.call("SetConfig", request, retry_unknown=True))


def _config(r: admin_pb2.ConfigResponse) -> dict[str, dict[str, Any]]:
    return {v.key: {"value": json.loads(v.value_json), "source": v.source} for v in r.values}
