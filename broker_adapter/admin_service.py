"""The BrokerAdmin gRPC service (proto/broker_adapter/v1/admin.proto): requests in, ``broker_adapter.core.admin``
call, responses out; an error the broker raises becomes the gRPC status of its class (docs/broker.md,
Administration)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import grpc

from broker_adapter.core.admin import Admin
from broker_adapter.service import stored_message
from broker_adapter.v1 import admin_pb2, admin_pb2_grpc
from dledger.errors import DLedgerError
from dledger.plugins import NodeHandle
from dledger.transport.grpc import abort_rpc

SERVICE = admin_pb2.DESCRIPTOR.services_by_name["BrokerAdmin"].full_name


def _config(shown: dict) -> admin_pb2.ConfigResponse:
    return admin_pb2.ConfigResponse(
        values=[
            admin_pb2.ConfigValue(key=k, value_json=json.dumps(v["value"]), source=v["source"])
            for k, v in shown.items()
        ]
    )


class AdminServicer(admin_pb2_grpc.BrokerAdminServicer):
    def __init__(self, admin: Admin, node: NodeHandle):
        self._admin = admin
        self._node = node

    async def _abort(self, context: grpc.aio.ServicerContext, err: DLedgerError) -> None:
        await abort_rpc(context, err, self._node.address_of)

    async def TopicStatus(self, request, context):
        try:
            queues = await self._admin.topic_status(request.topic, request.allow_follower)
        except DLedgerError as e:
            await self._abort(context, e)
        return admin_pb2.TopicStatusResponse(
            topic=request.topic,
            queues=[
                admin_pb2.QueueStatus(
                    queue_id=q.queue_id,
                    min_offset=q.min_offset,
                    max_offset=q.max_offset,
                    last_store_timestamp=q.last_store_ms,
                )
                for q in queues
            ],
        )

    async def DeleteTopic(self, request, context):
        try:
            n = await self._admin.delete_topic(request.topic)
        except DLedgerError as e:
            await self._abort(context, e)
        return admin_pb2.DeleteTopicResponse(queues=n)

    async def ListGroups(self, request, context):
        try:
            groups = await self._admin.list_groups(request.allow_follower)
        except DLedgerError as e:
            await self._abort(context, e)
        return admin_pb2.ListGroupsResponse(
            groups=[
                admin_pb2.GroupSummary(group=g.group, topics=g.topics, lag=g.lag, has_settings=g.has_settings)
                for g in groups
            ]
        )

    async def DescribeGroup(self, request, context):
        try:
            queues = await self._admin.describe_group(
                request.group, request.topic or None, request.allow_follower
            )
        except DLedgerError as e:
            await self._abort(context, e)
        return admin_pb2.DescribeGroupResponse(
            group=request.group,
            queues=[
                admin_pb2.GroupQueue(
                    topic=q.topic,
                    queue_id=q.queue_id,
                    committed_offset=q.committed or 0,
                    has_committed=q.committed is not None,
                    max_offset=q.max_offset,
                    lag=q.lag,
                    in_flight=q.in_flight,
                )
                for q in queues
            ],
        )

    async def DeleteGroup(self, request, context):
        try:
            await self._admin.delete_group(request.group)
        except DLedgerError as e:
            await self._abort(context, e)
        return admin_pb2.DeleteGroupResponse()

    async def ResetOffsets(self, request, context):
        try:
            plan = await self._admin.reset_offsets(
                request.group,
                request.topic,
                request.mode,
                request.value,
                request.queue_id if request.HasField("queue_id") else None,
            )
        except DLedgerError as e:
            await self._abort(context, e)
        return admin_pb2.ResetOffsetsResponse(
            queues=[
                admin_pb2.OffsetReset(
                    queue_id=r.queue_id, old_offset=r.old or 0, had_old=r.old is not None, new_offset=r.new
                )
                for r in plan
            ]
        )

    async def QueryMessages(self, request, context):
        limit = request.limit or 32
        try:
            if request.by == "time":
                found = await self._admin.query_time(
                    request.topic, request.start_ms, request.end_ms, limit, request.allow_follower
                )
            else:
                found = await self._admin.query(
                    request.by, request.value, request.topic, limit, request.allow_follower
                )
        except DLedgerError as e:
            await self._abort(context, e)
        return admin_pb2.QueryMessagesResponse(messages=[stored_message(m) for m in found])

    async def GetConfig(self, request, context):
        return _config(self._admin.config())

    async def SetConfig(self, request, context):
        try:
            shown = await self._admin.set_config(dict(request.values))
        except DLedgerError as e:
            await self._abort(context, e)
        return _config(shown)


def service_names() -> Sequence[str]:
    return (SERVICE,)
