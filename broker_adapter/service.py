"""The Broker gRPC service (proto/broker_adapter/v1/broker.proto): requests in, ``broker_adapter.core.broker`` call, responses
out; an error the broker raises becomes the gRPC status of its class (a follower's ``NotLeaderError`` is
FAILED_PRECONDITION with the leader's id and address in the trailing metadata).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence

import grpc

from broker_adapter.core import selectors
from broker_adapter.core.broker import Broker
from broker_adapter.core.clock import now_ms
from broker_adapter.core.groups import GroupSettings
from broker_adapter.core.message import Message
from broker_adapter.core.model import DELAY, NORMAL
from broker_adapter.core.sqlfilter import FilterSyntaxError
from broker_adapter.members import PullingMembers
from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from dledger.batch_stream import answer_each
from dledger.errors import DLedgerError, InvalidRequestError, PermissionDeniedError
from dledger.security.guard import stream_refusal
from dledger.transport import convert
from dledger.transport.grpc import abort_rpc, leader_address
from dledger.v1 import client_pb2


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    def __init__(self, broker: Broker, members: PullingMembers | None = None):
        self._broker = broker
        self._members = members if members is not None else PullingMembers()  # who pulls for which group

    async def _abort(self, context: grpc.aio.ServicerContext, err: DLedgerError) -> None:
        await abort_rpc(context, err, self._broker.node.address_of)

    async def Send(self, request, context):
        try:
            msgs = request.messages
            if any(m.delivery_timestamp for m in msgs):
                sent = await self._send_timed(request.topic, msgs)
            else:
                sent = await self._broker.send(request.topic, msgs)
        except DLedgerError as e:
            await self._abort(context, e)
        out = broker_pb2.SendResponse()
        add = out.results.add
        for r in sent:
            add(
                msg_id=r.msg_id,
                topic=r.topic,
                queue_id=r.queue_id,
                queue_offset=r.queue_offset,
                commitlog_offset=r.commitlog_offset,
                duplicate=r.duplicate,
            )
        return out

    async def SendStream(self, request_iterator, context):
        """A producer session: each batch is handled as it arrives (concurrent batches share the broker's group
        commit) and answered as it commits, in that order; a refused batch is answered with its error, and
        the session goes on."""
        send_stored = self._broker.send_stored

        async def one(batch: broker_pb2.SendBatch) -> broker_pb2.SendBatchResult:
            try:
                placed = await send_stored(list(batch.messages), _may_publish)
            except DLedgerError as e:
                return broker_pb2.SendBatchResult(batch_id=batch.batch_id, error=self._error(e))
            return broker_pb2.SendBatchResult(
                batch_id=batch.batch_id,
                queue_offsets=[d.queue_offset if d is not None else -1 for d, _ in placed],
                commitlog_offsets=[d.commitlog_offset if d is not None else -1 for d, _ in placed],
                duplicates=[dup for _, dup in placed],
            )

        async with contextlib.aclosing(answer_each(request_iterator, one)) as answers:
            async for r in answers:
                yield r

    def _error(self, err: DLedgerError) -> client_pb2.AppendError:
        """A batch's error inside the session, with the leader's address when a follower refused it."""
        return convert.error_to_append_error(err, leader_address(err, self._broker.node.address_of))

    async def _send_timed(self, topic: str, msgs) -> list:
        """Messages with a delivery time: the due ones at once, the others through the timer topic; all of them
        checked before any is written (``Broker.send_kinds``)."""
        now = now_ms()
        due = [m.delivery_timestamp for m in msgs]
        return await self._broker.send_kinds(topic, msgs, [DELAY if t > now else NORMAL for t in due], due)

    async def SetGroupSettings(self, request, context):
        defaults = GroupSettings()
        settings = {
            "fifo": request.fifo,
            "max_attempts": request.max_attempts or defaults.max_attempts,
            "backoff": request.backoff or defaults.backoff,
            "levels_ms": list(request.levels_ms) or list(defaults.levels_ms),
            "initial_ms": request.initial_ms or defaults.initial_ms,
            "max_ms": request.max_ms or defaults.max_ms,
            "multiplier": request.multiplier or defaults.multiplier,
        }
        try:
            got = await self._broker.set_group_settings(request.group, settings)
        except DLedgerError as e:
            await self._abort(context, e)
        return broker_pb2.GroupSettingsResponse(settings_json=json.dumps(got.to_json(), sort_keys=True))

    async def Later(self, request, context):
        try:
            dead, due, attempt = await self._broker.delivery.later(
                request.group, request.topic, request.queue_id, request.queue_offset
            )
        except DLedgerError as e:
            await self._abort(context, e)
        return broker_pb2.LaterResponse(dead_lettered=dead, deliver_at_ms=due, attempt=attempt)

    async def Pull(self, request, context):
        try:
            self._members.pulled(request.consumer_group, request.client_id)
        except DLedgerError as e:
            await self._abort(context, e)
        if request.raw:
            return await self._pull_raw(request, context)
        try:
            pulled = await self._broker.pull(
                request.topic,
                request.queue_id,
                request.offset,
                request.max_messages or 32,
                request.max_wait_ms,
                request.allow_follower,
                _selected(request),
            )
        except DLedgerError as e:
            await self._abort(context, e)
        return broker_pb2.PullResponse(
            next_offset=pulled.next_offset,
            max_offset=pulled.max_offset,
            messages=[stored_message(m) for m in pulled.messages],
        )

    async def _pull_raw(self, request, context):
        """A pull at batch granularity: the stored bytes as they are (``broker_adapter.pulled`` decodes them)."""
        try:
            p = await self._broker.pull_raw(
                request.topic,
                request.queue_id,
                request.offset,
                request.max_messages or 32,
                request.max_wait_ms,
                request.allow_follower,
                _selected(request),
            )
        except DLedgerError as e:
            await self._abort(context, e)
        return broker_pb2.PullResponse(
            next_offset=p.next_offset, max_offset=p.max_offset, raw=p.data, raw_count=p.count
        )

    async def CreateTopic(self, request, context):
        try:
            created = await self._broker.create_topic(request.topic, request.queues)
        except DLedgerError as e:
            await self._abort(context, e)
        return broker_pb2.CreateTopicResponse(topic=created.topic, queues=created.queues)

    async def ListTopics(self, request, context):
        try:
            topics = await self._broker.list_topics(request.allow_follower)
        except DLedgerError as e:
            await self._abort(context, e)
        out = broker_pb2.ListTopicsResponse()
        for t, n, ends in topics:
            out.topics.add(topic=t, queues=n, max_offsets=ends)
        return out

    async def CommitOffset(self, request, context):
        try:
            await self._broker.commit_offset(request.group, request.topic, request.queue_id, request.offset)
        except DLedgerError as e:
            await self._abort(context, e)
        return broker_pb2.CommitOffsetResponse()

    async def QueryOffset(self, request, context):
        try:
            o = await self._broker.committed_offset(
                request.group, request.topic, request.queue_id, request.allow_follower
            )
        except DLedgerError as e:
            await self._abort(context, e)
        return broker_pb2.QueryOffsetResponse(offset=o or 0, found=o is not None)

    async def Route(self, request, context):
        r = self._broker.route()
        return broker_pb2.RouteResponse(
            node_id=r.node_id,
            leader_id=r.leader_id or "",
            leader_address=r.leader_address or "",
            term=r.term,
            max_commitlog_offset=r.max_commitlog_offset,
        )


def stored_message(m: Message) -> broker_pb2.StoredMessage:
    return broker_pb2.StoredMessage(
        topic=m.topic,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        commitlog_offset=m.physical_offset,
        body=m.body,
        tags=m.tags or "",
        keys=m.keys,
        msg_id=m.msg_id or "",
        properties=m.properties,
        born_timestamp=m.born_timestamp,
        store_timestamp=m.store_timestamp,
    )


async def _may_publish(topics: Iterable[str]) -> None:
    """A producer session's batch: the caller's permission for each of its topics (always, on an open group)."""
    why = await stream_refusal([("publish", t) for t in topics])
    if why is not None:
        raise PermissionDeniedError(f"PERMISSION_DENIED: {why}")  # as a refused unary call reads


def _selected(request: broker_pb2.PullRequest) -> selectors.Select | None:
    """The request's SQL92 filter (None: every message); InvalidRequestError naming the position."""
    if not request.filter.strip():
        return None
    try:
        return selectors.by_sql(request.filter.strip())
    except FilterSyntaxError as e:
        raise InvalidRequestError(str(e)) from None


def service_names() -> Sequence[str]:
    return (broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name,)
