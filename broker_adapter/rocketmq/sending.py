"""SendMessage on the RocketMQ 5 face: the official clients' messages converted and stored by kind (normal, FIFO
by message group, delayed, transactional), through ``Broker.send_kinds`` (docs/rocketmq.md). Every receipt's
transaction id is its message id; a delayed message's receipt carries a recall handle (``recall``).

A follower of a plain group relays normal and FIFO messages instead of forwarding the call (``Sends.relay``):
it converts and encodes them itself and sends their stored form on its own producer session to the leader
(``broker_adapter.producing.Sessions``), which packs the concurrent sends of every client of the node into
one stream message; the leader then pays what a session message costs it, not a gRPC call and a Raft round
for every few messages (docs/rocketmq.md, "Sends through a follower").
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Sequence
from typing import Final

import grpc
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2

from broker_adapter.core import message
from broker_adapter.core.broker import Broker
from broker_adapter.core.clock import now_ms
from broker_adapter.core.model import encode_outgoing
from broker_adapter.core.send import MAX_SEND_BATCH
from broker_adapter.producing import Sessions
from broker_adapter.rocketmq import convert
from broker_adapter.rocketmq.forward import client_id
from broker_adapter.rocketmq.recall import RecallHandle
from broker_adapter.rocketmq.status import RocketMQError, bad_request, status
from broker_adapter.v1 import broker_pb2_grpc
from dledger.errors import DLedgerError, NotFoundError
from dledger.routing import Router

HEADROOM: Final = 1024  # bytes of a CommitLog message besides the body (fixed fields, topic, properties)
# A relayed batch's answer may take this long before the session counts its outcome unknown and sends it again
# (to the next leader): within the client's own deadline, which bounds the whole relay.
RELAY_ANSWER_S: Final = 5.0


class Sends:
    """The leader's side of SendMessage; it remembers where each topic's round robin stands."""

    def __init__(self, broker: Broker, channel: Callable[[str], grpc.aio.Channel]):
        """``channel``: this node's channel to another node's address, for relaying."""
        self._broker = broker
        self._group = broker.node.group
        self._round_robin: dict[str, int] = {}
        self._max_body = broker.node.config.max_body_bytes - HEADROOM
        self._channel = channel
        self._router: Router | None = None
        self._sessions: Sessions | None = None

    def _queue_for(self, topic: str, m: definition_pb2.Message, queues: int) -> int:
        sp = m.system_properties
        if sp.HasField("message_group") and sp.message_group:
            return zlib.crc32(sp.message_group.encode()) % queues  # one group, one queue: its order holds
        n = self._round_robin.get(topic, 0)
        self._round_robin[topic] = n + 1
        return n % queues

    @staticmethod
    def _request(msgs: Sequence[definition_pb2.Message]) -> str:
        """The request's topic, its batch checked (1..MAX_SEND_BATCH messages, one topic)."""
        if not 1 <= len(msgs) <= MAX_SEND_BATCH:
            raise bad_request(f"a SendMessageRequest carries 1..{MAX_SEND_BATCH} messages, got {len(msgs)}")
        topic: str = msgs[0].topic.name
        if len(msgs) > 1 and any(m.topic.name != topic for m in msgs):
            raise bad_request(
                "every message of one SendMessageRequest must have the same topic", Code.ILLEGAL_TOPIC
            )
        return topic

    async def send(self, request, context) -> service_pb2.SendMessageResponse:
        msgs = request.messages
        topic = self._request(msgs)
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
        return self._answer(topic, msgs, [r.queue_offset for r in sent], kinds)

    def _answer(
        self, topic: str, msgs: Sequence[definition_pb2.Message], offsets: Sequence[int], kinds: Sequence[str]
    ) -> service_pb2.SendMessageResponse:
        ok = status()
        resp = service_pb2.SendMessageResponse(status=ok)
        add = resp.entries.add
        for m, offset, kind in zip(msgs, offsets, kinds, strict=True):
            mid = m.system_properties.message_id  # every receipt's transaction id, as RocketMQ sets it
            e = add(status=ok, message_id=mid, offset=offset, transaction_id=mid)
            if kind == convert.DELAY and offset >= 0:  # (-1: a retry older than the producer window)
                due = convert.delivery_ms(m)
                e.recall_handle = RecallHandle(self._group, topic, offset, due, mid).encode()
        return resp

    async def relay(self, request, context, deadline: float) -> service_pb2.SendMessageResponse | None:
        """A follower's SendMessage: normal and FIFO messages of a topic this node knows are converted and
        encoded here and stored through this node's producer session to the leader, which checks the bytes
        as it checks any session's (``Broker.send_stored``) and deduplicates them by the client's id and
        message id sequence, as a forwarded call's; the answer is the one the leader would give. None: the
        leader serves it (forwarded as the client sent it): another kind, or a topic this node does not know
        (yet: the leader creates or refuses it). ``deadline``: loop time."""
        msgs = request.messages
        topic = self._request(msgs)
        kinds = [convert.check_type(m) for m in msgs]
        if any(k != convert.NORMAL for k in kinds):
            return None
        b = self._broker
        try:
            queues = b.queues(topic)
        except DLedgerError:
            return None
        cid, now = client_id(context), now_ms()
        raws: list[bytes] = []
        for i, m in enumerate(msgs):
            out = convert.outgoing(m, self._queue_for(topic, m, queues), cid, self._max_body)
            try:
                raws.append(encode_outgoing(topic, out, out.msg_id, out.born_timestamp or now)[0])
            except message.MessageFormatError as e:
                raise bad_request(f"message {i}: {e}") from None
        try:
            with b.node.serving():  # the client's call waits here on the leader (decision 0029)
                placed = await self._session().send(raws, deadline - asyncio.get_running_loop().time())
        except NotFoundError as e:
            raise RocketMQError(Code.TOPIC_NOT_FOUND, str(e)) from None
        return self._answer(topic, msgs, [queue_offset for queue_offset, _, _ in placed], kinds)

    def _session(self) -> Sessions:
        """This node's producer session, to whichever node leads (learnt from the node, then from refusals)."""
        node = self._broker.node
        if self._sessions is None:
            channel = self._channel
            self._router = Router([a for a in map(node.address_of, node.config.peers) if a])
            self._sessions = Sessions(
                self._router,
                RELAY_ANSWER_S,
                RELAY_ANSWER_S,
                lambda address: broker_pb2_grpc.BrokerStub(channel(address)),
            )
        lead = node.leader_id
        address = node.address_of(lead) if lead else None
        if address and self._router is not None:
            self._router.leader = address  # this node's view is fresher than the last answer's
        return self._sessions

    async def close(self) -> None:
        if self._sessions is not None:
            await self._sessions.close()
