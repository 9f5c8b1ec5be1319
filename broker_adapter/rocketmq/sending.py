"""SendMessage on the RocketMQ 5 face: the official clients' messages converted and stored by kind (normal, FIFO
by message group, delayed, transactional), through ``Broker.send_kinds`` (docs/rocketmq.md). Every receipt's
transaction id is its message id; a delayed message's receipt carries a recall handle (``recall``)."""

from __future__ import annotations

import zlib
from typing import Final

from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2

from broker_adapter.core.broker import Broker
from broker_adapter.core.clock import now_ms
from broker_adapter.core.send import MAX_SEND_BATCH
from broker_adapter.rocketmq import convert
from broker_adapter.rocketmq.forward import client_id
from broker_adapter.rocketmq.recall import RecallHandle
from broker_adapter.rocketmq.status import RocketMQError, bad_request, status
from dledger.errors import NotFoundError

HEADROOM: Final = 1024  # bytes of a CommitLog message besides the body (fixed fields, topic, properties)


class Sends:
    """The leader's side of SendMessage; it remembers where each topic's round robin stands."""

    def __init__(self, broker: Broker):
        self._broker = broker
        self._group = broker.node.group
        self._round_robin: dict[str, int] = {}
        self._max_body = broker.node.config.max_body_bytes - HEADROOM

    def _queue_for(self, topic: str, m: definition_pb2.Message, queues: int) -> int:
        sp = m.system_properties
        if sp.HasField("message_group") and sp.message_group:
            return zlib.crc32(sp.message_group.encode()) % queues  # one group, one queue: its order holds
        n = self._round_robin.get(topic, 0)
        self._round_robin[topic] = n + 1
        return n % queues

    async def send(self, request, context) -> service_pb2.SendMessageResponse:
        msgs = request.messages
        if not 1 <= len(msgs) <= MAX_SEND_BATCH:
            raise bad_request(f"a SendMessageRequest carries 1..{MAX_SEND_BATCH} messages, got {len(msgs)}")
        topic = msgs[0].topic.name
        if len(msgs) > 1 and any(m.topic.name != topic for m in msgs):
            raise bad_request(
                "every message of one SendMessageRequest must have the same topic", Code.ILLEGAL_TOPIC
            )
        b = self._broker
        b.queues(topic)  # a bad name or an unknown topic is refused before anything else
        kinds = [convert.check_type(m) for m in msgs]
        await b.leader_state()
        queues = b.queues(topic)
        max_body = self._max_body
        cid = client_id(context)
        out = [convert.outgoing(m, self._queue_for(topic, m, queues), cid, max_body) for m in msgs]
        now = now_ms() if convert.DELAY in kinds else 0
        for i, m in enumerate(msgs):
            if kinds[i] == convert.DELAY:
                due = convert.delivery_ms(m)
                if due <= now:
                    kinds[i] = convert.NORMAL  # already due: delivered at once, as RocketMQ does
                else:
                    b.delivery.check_delivery_time(due, now)
        try:
            if kinds.count(convert.NORMAL) == len(kinds):
                sent = await b.send(topic, out)
            else:
                due_ms = [
                    convert.delivery_ms(m) if k == convert.DELAY else 0
                    for m, k in zip(msgs, kinds, strict=True)
                ]
                sent = await b.send_kinds(topic, out, kinds, due_ms)
        except NotFoundError as e:
            raise RocketMQError(Code.TOPIC_NOT_FOUND, str(e)) from None
        ok = status()
        resp = service_pb2.SendMessageResponse(status=ok)
        add = resp.entries.add
        for m, r, kind in zip(msgs, sent, kinds, strict=True):
            mid = m.system_properties.message_id  # every receipt's transaction id, as RocketMQ sets it
            e = add(status=ok, message_id=mid, offset=r.queue_offset, transaction_id=mid)
            if kind == convert.DELAY and r.queue_offset >= 0:  # (-1: a retry older than the producer window)
                due = convert.delivery_ms(m)
                e.recall_handle = RecallHandle(self._group, topic, r.queue_offset, due, mid).encode()
        return resp
